"""Parts (a frame's runs for one partition) and the rounds that sort them.

The part-wise paths must answer exactly as the run-by-run ones they replace:
``ProducerWindow.admit_all`` as ``admit`` run by run, a ``RoundPlan`` over
parts as the per-run verdicts, and a part's ack entries as one entry per run
at consecutive offsets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.durable import acks as acks_module
from broky.durable.acks import AckQueue
from broky.durable.parts import Part
from broky.durable.producers import Duplicate, OutOfOrder, ProducerWindow
from broky.durable.rounds import RoundPlan
from broky.protocol.codec import decode_frame
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Error, PublishAck, Run
from broky.protocol.message import encode_message, pack_sizes

#: A group of runs of one producer: (producer, gap before it, counts).
groups = st.lists(
    st.tuples(
        st.integers(1, 3),
        st.integers(-12, 6),
        st.lists(st.integers(1, 4), min_size=1, max_size=6),
    ),
    max_size=25,
)


def make_run(key: bytes, count: int) -> Run:
    message = encode_message(b"p")
    return Run(key, 0, count, pack_sizes([len(message)] * count), message * count)


class Outlet:
    """What an AckQueue writes to: the frames it sent, decoded."""

    def __init__(self) -> None:
        self.frames: list[object] = []

    def send_control(self, data: bytes) -> None:
        self.frames.append(decode_frame(memoryview(data)[4:]))


@settings(max_examples=150, deadline=None)
@given(groups=groups)
def test_admit_all_answers_as_admit_run_by_run(groups: list[tuple[int, int, list[int]]]) -> None:
    """A group goes in whole exactly when every run of it would have been
    new, and leaves the window as the per-run admits would (checked by
    probing every sequence afterwards)."""
    grouped = ProducerWindow(window=30)
    single = ProducerWindow(window=30)
    next_sequence = {1: 1, 2: 1, 3: 1}
    offset = 0
    for producer, gap, counts in groups:
        sequence = max(next_sequence[producer] + gap, 1)
        sequences = []
        for count in counts:
            sequences.append(sequence)
            sequence += count
        verdicts = [
            single.admit(producer, first, count, offset + sum(counts[:position]))
            for position, (first, count) in enumerate(zip(sequences, counts, strict=True))
        ]
        whole = grouped.admit_all(producer, sequences, counts, offset)
        assert whole == all(verdict is None for verdict in verdicts)
        if not whole:
            for position, (first, count) in enumerate(zip(sequences, counts, strict=True)):
                grouped.admit(producer, first, count, offset + sum(counts[:position]))
        offset += sum(counts)
        next_sequence[producer] = max(next_sequence[producer], sequence)
    for producer in (1, 2, 3):
        for sequence in range(next_sequence[producer] + 2):
            for count in (1, 2, 3):
                assert grouped.check(producer, sequence, count) == single.check(
                    producer, sequence, count
                )


def _part(queue: AckQueue, producer: int, first_sequence: int, counts: list[int]) -> Part:
    ticket = queue.open(1, producer, first_sequence)
    ticket.remaining += 1
    part = Part(7, ticket, queue, producer)
    sequence = first_sequence
    for index, count in enumerate(counts):
        part.add(make_run(b"k.%d" % index, count), index, sequence)
        sequence += count
    return part


def test_a_new_part_is_appended_whole_and_acked_run_by_run() -> None:
    outlet = Outlet()
    queue = AckQueue(outlet)  # type: ignore[arg-type]
    part = _part(queue, 9, 1, [1, 3, 2])
    plan = RoundPlan(ProducerWindow(), 100, [part])
    assert plan.parts == [part]
    assert not plan.answered
    assert part.settle(4, 100) is queue
    queue.release()
    (ack,) = outlet.frames
    assert isinstance(ack, PublishAck)
    assert ack.runs == (0, 1, 2)
    assert ack.partitions == (4, 4, 4)
    assert ack.first_offsets == (100, 101, 104)
    assert ack.last_offsets == (100, 103, 105)


def test_a_retried_part_is_answered_with_its_original_offsets() -> None:
    window = ProducerWindow()
    outlet = Outlet()
    queue = AckQueue(outlet)  # type: ignore[arg-type]
    first = _part(queue, 9, 1, [1, 3])
    RoundPlan(window, 50, [first])
    first.settle(0, 50)
    queue.release()
    retry = _part(queue, 9, 1, [1, 3])
    plan = RoundPlan(window, 54, [retry])
    assert plan.parts == []
    assert plan.answered_runs == 2
    assert plan.settle(None, 0, "t/0") == {queue}
    queue.release()
    original, answered = outlet.frames
    assert isinstance(answered, PublishAck)
    assert isinstance(original, PublishAck)
    assert answered.first_offsets == original.first_offsets == (50, 51)
    assert answered.last_offsets == original.last_offsets == (50, 53)


def test_a_part_half_stored_is_split_and_its_ticket_waits_for_both_halves() -> None:
    window = ProducerWindow()
    outlet = Outlet()
    queue = AckQueue(outlet)  # type: ignore[arg-type]
    stored = _part(queue, 9, 1, [2])
    RoundPlan(window, 0, [stored])
    stored.settle(0, 0)
    queue.release()
    # A resend of sequence 1 (stored) followed by sequence 3 (new).
    mixed = _part(queue, 9, 1, [2, 1])
    plan = RoundPlan(window, 2, [mixed])
    (kept,) = plan.parts
    assert kept.indexes == [1]
    assert kept.sequences == [3]
    assert kept.messages == 1
    assert mixed.ticket is not None
    assert mixed.ticket.remaining == 2
    plan.settle(2, 0, "t/0")
    queue.release()
    assert len(outlet.frames) == 1  # still waiting for the appended half
    kept.settle(0, 2)
    queue.release()
    ack = outlet.frames[-1]
    assert isinstance(ack, PublishAck)
    assert ack.runs == (0, 1)
    assert ack.first_offsets == (0, 2)
    assert ack.last_offsets == (1, 2)


def test_an_out_of_order_run_fails_its_frame_once() -> None:
    window = ProducerWindow()
    outlet = Outlet()
    queue = AckQueue(outlet)  # type: ignore[arg-type]
    stored = _part(queue, 9, 10, [1])
    RoundPlan(window, 0, [stored])
    stored.settle(0, 0)
    queue.release()
    late = _part(queue, 9, 5, [1, 1])  # never stored, and older than what was
    plan = RoundPlan(window, 1, [late])
    assert plan.parts == []
    assert [type(verdict) for _, _, verdict in plan.answered[0].verdicts] == [
        OutOfOrder,
        OutOfOrder,
    ]
    plan.settle(None, 0, "t/0")
    queue.release()
    error = outlet.frames[-1]
    assert isinstance(error, Error)
    assert error.code is ErrorCode.OUT_OF_ORDER_SEQUENCE


def test_parts_without_a_producer_skip_the_window() -> None:
    window = ProducerWindow()
    queue = AckQueue(Outlet())  # type: ignore[arg-type]
    part = _part(queue, 0, 0, [1, 1])
    plan = RoundPlan(window, 0, [part, part])
    assert plan.parts == [part, part]
    assert len(window) == 0
    assert part.identities() == [(0, 0), (0, 0)]


def test_a_failed_append_forgets_the_producers_it_told_the_window_about() -> None:
    window = ProducerWindow()
    queue = AckQueue(Outlet())  # type: ignore[arg-type]
    part = _part(queue, 9, 1, [1])
    retry = _part(queue, 9, 1, [1])
    plan = RoundPlan(window, 0, [part, retry])  # the retry is a duplicate of the first
    assert plan.parts == [part]
    assert plan.answered_runs == 1
    plan.settle(OSError("disk full"), 0, "t/0")
    assert window.check(9, 1, 1) is None  # not stored: a resend is new again
    assert window.check(9, 1, 1) != Duplicate(0)


def test_accepts_only_the_same_producer_going_forward() -> None:
    part = Part(0, None, None, 9)
    part.add(make_run(b"a", 2), 0, 5)
    assert part.accepts(9, 7)
    assert part.accepts(9, 20)
    assert not part.accepts(9, 6)  # going back: another part
    assert not part.accepts(8, 7)
    assert not part.accepts(0, 0)
    assert Part(0, None, None).accepts(0, 0)


@given(
    counts=st.lists(st.sampled_from([1, 1, 1, 2, 3]), min_size=1, max_size=12),
    first_offset=st.integers(0, 2**40),
)
def test_settle_gives_each_run_its_consecutive_offsets(
    counts: list[int], first_offset: int
) -> None:
    """Whether every run holds one message (the quick path) or not."""
    acks = AckQueue(Outlet())  # type: ignore[arg-type]
    ticket = acks.open(1)
    part = Part(0, ticket, acks)
    for index, count in enumerate(counts):
        part.add(make_run(b"k", count), 2 * index)
    ticket.remaining += 1
    assert part.settle(3, first_offset) is acks
    expected = []
    offset = first_offset
    for index, count in enumerate(counts):
        expected.append((2 * index, 3, offset, offset + count - 1))
        offset += count
    assert ticket.entries == expected
    assert ticket.remaining == 0


#: Parts of a frame as ``(partition, [(run index, message count)])``; run
#: indexes may repeat across parts (a run split over partitions).
ack_parts = st.lists(
    st.tuples(
        st.integers(0, 7),
        st.lists(st.tuples(st.integers(0, 30), st.sampled_from([1, 1, 2])), max_size=8),
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(parts=ack_parts, distinct=st.booleans(), first_offset=st.integers(0, 2**40))
def test_ack_lists_the_entries_sorted_as_tuples(
    parts: list[tuple[int, list[tuple[int, int]]]], distinct: bool, first_offset: int
) -> None:
    """Whatever order the parts finish in, and whether run indexes repeat
    or not, the PublishAck holds the entries in the order of the sorted
    ``(run index, partition, first, last)`` tuples: the bytes acks had when
    a ticket kept one tuple per run."""
    acks = AckQueue(Outlet())  # type: ignore[arg-type]
    outlet = acks._outlet
    ticket = acks.open(1)
    expected = []
    offset = first_offset
    seen: set[int] = set()
    for partition, spec in parts:
        runs = spec
        if distinct:  # each run index once in the frame (no run split)
            runs = [(index, count) for index, count in spec if index not in seen]
            seen.update(index for index, _ in runs)
        part = Part(0, ticket, acks)
        for index, count in sorted(runs, key=lambda run: run[0]):
            part.add(make_run(b"k", count), index)
            expected.append((index, partition, offset, offset + count - 1))
            offset += count
        ticket.remaining += 1
        part.settle(partition, offset - part.messages)
    acks.release()
    (ack,) = outlet.frames  # type: ignore[attr-defined]
    assert isinstance(ack, PublishAck)
    assert list(
        zip(ack.runs, ack.partitions, ack.first_offsets, ack.last_offsets, strict=True)
    ) == sorted(expected)
    assert sorted(ticket.entries) == sorted(expected)


#: An ack's entries as columns: (run index, partition, first, last) each.
ack_entries = st.lists(
    st.tuples(
        st.one_of(st.integers(0, 40), st.integers(-3, 3000)),
        st.integers(0, 7),
        st.integers(0, 2**40),
        st.integers(0, 2**40),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(entries=ack_entries, distinct=st.booleans())
def test_compiled_ack_columns_are_the_pure_ones(
    entries: list[tuple[int, int, int, int]], distinct: bool
) -> None:
    """The compiled counting pass gives the pure columns where it answers,
    and answers whenever no run index repeats nor lies far out; otherwise it
    leaves the case to the pure sort (None)."""
    compiled = acks_module.ack_columns_compiled
    if compiled is None:
        pytest.skip("the compiled ack columns are not built (BROKY_PURE=1?)")
    if distinct:
        entries = list({entry[0]: entry for entry in entries}.values())
    columns = [list(column) for column in zip(*entries, strict=True)] or [[], [], [], []]
    expected = acks_module.ack_columns_pure(*columns)
    assert expected == tuple(zip(*sorted(entries), strict=True)) or not entries
    found = compiled(*columns)
    runs = columns[0]
    simple = len(set(runs)) == len(runs) and all(0 <= run < len(runs) + 1024 for run in runs)
    assert (found is not None) == simple
    if found is not None:
        assert found == expected
