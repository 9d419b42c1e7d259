"""The credit gate of a consumer spread over several workers: the client's
window is never exceeded, each owner's order is kept, little waits, and a
part with messages is never starved once the client returned its credit."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from broky.durable.consumer_gate import CreditGate, Waiting, WaitingFrame, waiting_frame
from broky.durable.owner import located_chunk
from broky.protocol.chunks import runs_frame_parts
from broky.protocol.codec import decode_frame
from broky.protocol.constants import BodyType
from broky.protocol.frames import Deliver, Redelivered, Run
from broky.protocol.message import decode_run, encode_message, pack_sizes


def run_of(partition: int, base: int, count: int) -> Run:
    messages = [encode_message(b"%d-%d" % (partition, base + n)) for n in range(count)]
    return Run(
        b"orders.k",
        1,
        count,
        pack_sizes([len(m) for m in messages]),
        b"".join(messages),
        partition,
        base,
    )


def waiting(partition: int, base: int, count: int, redelivered: int = -1) -> Waiting:
    counts = [("orders", redelivered, 2)] if redelivered >= 0 else []
    chunk = located_chunk(run_of(partition, base, count), partition, base)
    return Waiting(chunk, count, partition, base, counts)


def delivered(partition: int, base: int, count: int, whole: bool) -> Waiting | WaitingFrame:
    """``count`` messages as one run, or as a whole Deliver of one-message runs."""
    if not whole:
        return waiting(partition, base, count)
    chunks = [
        located_chunk(run_of(partition, offset, 1), partition, offset)
        for offset in range(base, base + count)
    ]
    data = b"".join(runs_frame_parts(BodyType.DELIVER, 99, chunks))
    entry = waiting_frame(memoryview(data)[4:], 1, [], "")
    assert entry is not None
    return entry


def received(frames: list[bytes]) -> tuple[list[tuple[int, int]], dict[tuple[int, int], int]]:
    """(partition, offset) of every message in ``frames``, and redelivery counts."""
    found: list[tuple[int, int]] = []
    counts: dict[tuple[int, int], int] = {}
    for data in frames:
        frame = decode_frame(memoryview(data)[4:])
        if isinstance(frame, Redelivered):
            for p, o, c in zip(frame.partitions, frame.offsets, frame.counts, strict=True):
                counts[(p, o)] = c
        else:
            assert isinstance(frame, Deliver)
            for run in frame.runs:
                found.extend((m.partition, m.offset) for m in decode_run(run))
    return found, counts


def test_a_run_is_split_where_the_window_ends_with_its_counts() -> None:
    gate = CreditGate(5, [0, 1], 1 << 20)
    gate.grant(3)
    gate.arrive(1, [waiting(1, 10, 5, redelivered=13)])
    first, counts = received(gate.take())
    assert first == [(1, 10), (1, 11), (1, 12)]
    assert counts == {}
    gate.grant(10)
    second, counts = received(gate.take())
    assert second == [(1, 13), (1, 14)]
    assert counts == {(1, 13): 2}


def test_a_small_window_still_gives_every_part_a_credit() -> None:
    gate = CreditGate(1, [0, 1, 2], 1 << 20)
    gate.grant(1)
    assert gate.shares() == {0: 1, 1: 1, 2: 1}
    gate.arrive(2, [waiting(2, 0, 1)])
    assert len(received(gate.take())[0]) == 1
    gate.arrive(1, [waiting(1, 0, 1)])
    assert gate.take() == []  # the window is spent: it waits here
    # Part 2 has nothing waiting here: its credit back; part 1's waits.
    assert gate.shares() == {2: 1}
    assert gate.shares() == {}  # and no more until something is sent
    assert gate.waiting_messages == 1
    gate.grant(1)
    assert received(gate.take())[0] == [(1, 0)]
    assert gate.shares() == {1: 1}


def test_a_part_back_from_a_restart_gets_credit_while_idle_siblings_hold_theirs() -> None:
    """The stall this rule fixes: owner 2 was lost while owners 0 and 1 were
    topped up to half a window each; they went idle holding it. Owner 2
    comes back with a backlog while the client, which returns half its
    window at a time, still has credit outstanding and waits for messages:
    owner 2 must get credit now, not once the idle siblings spend theirs."""
    gate = CreditGate(1, [0, 1, 2], 1 << 20)
    gate.grant(1000)
    gate.shares()
    gate.drop(2)
    gate.arrive(0, [waiting(0, 0, 300)])
    gate.arrive(1, [waiting(1, 0, 300)])
    assert len(received(gate.take())[0]) == 600
    gate.grant(500)  # the client returned half its window of 1000
    assert gate.shares() == {0: 534, 1: 534}
    # Two windows of 900 split between the two parts, idle.
    assert gate.held == {0: 900, 1: 900}
    gate.held[2] = 0  # owner 2 re-attached
    assert gate.shares() == {2: 2 * 900 // 3}
    gate.arrive(2, [waiting(2, 0, 300)])
    assert len(received(gate.take())[0]) == 300


@settings(max_examples=300, deadline=None)
@given(
    parts=st.integers(1, 4),
    steps=st.lists(
        st.tuples(st.sampled_from(["grant", "deliver", "consume"]), st.integers(0, 9)),
        max_size=60,
    ),
)
def test_the_window_holds_and_nobody_starves(parts: int, steps: list[tuple[str, int]]) -> None:
    gate = CreditGate(1, range(parts), 1 << 16)
    #: Credit each owner holds as the owner sees it; its backlog is endless.
    owner_credit = [0] * parts
    next_offset = [0] * parts
    unconsumed = 0  # received by the client, credit not yet returned
    received_per_part: list[list[int]] = [[] for _ in range(parts)]
    pending: deque[int] = deque()

    def pump() -> None:
        nonlocal unconsumed
        for message in received(gate.take())[0]:
            received_per_part[message[0]].append(message[1])
            pending.append(1)
            unconsumed += 1
        for part, credit in gate.shares().items():
            owner_credit[part] += credit

    peak_window = 0
    for action, value in steps:
        peak_window = max(peak_window, gate.window)
        if action == "grant":
            gate.grant(value)
        elif action == "deliver":
            part = value % parts
            count = min(owner_credit[part], value + 1)
            if count:
                owner_credit[part] -= count
                gate.arrive(part, [delivered(part, next_offset[part], count, whole=value % 2 == 1)])
                next_offset[part] += count
        elif pending:
            returned = min(len(pending), value + 1)
            for _ in range(returned):
                pending.popleft()
            unconsumed -= returned
            gate.grant(returned)
        peak_window = max(peak_window, gate.window)
        pump()
        assert gate.sent <= gate.granted
        # Bounded: each part's credit and waiting messages within one share
        # (two windows split between the parts, one at most) of the largest
        # window, plus one.
        share = min(peak_window, 2 * peak_window // parts)
        assert gate.waiting_messages + sum(owner_credit) <= parts * share + parts
        assert owner_credit == [gate.held[part] for part in range(parts)]
        # Nobody starves while the client's window is open, whatever it
        # still holds unreturned: every part (endless backlog) can send.
        if gate.window:
            assert not gate.waiting_messages
            assert all(credit >= 1 for credit in owner_credit)
    for offsets in received_per_part:
        assert offsets == list(range(len(offsets)))  # each owner's order


def test_every_deliver_is_named_with_its_topic_as_the_client_reads_them() -> None:
    """Parts deliver runs of two topics, interleaved: the client, which gives
    each Deliver the topic of the last Redelivered, reads every run's own."""
    gate = CreditGate(5, [0, 1], 1 << 20)
    gate.grant(100)
    sent: list[tuple[str, int]] = []
    for part, topic, base in ((0, "eu", 0), (1, "us", 0), (1, "us", 5), (0, "eu", 5)):
        run = waiting(part, base, 5)
        run.topic = topic
        gate.arrive(part, [run])
        sent.extend((topic, base + n) for n in range(5))
    named = None
    seen: list[tuple[str, int]] = []
    frames = gate.take()
    for data in frames:
        frame = decode_frame(memoryview(data)[4:])
        if isinstance(frame, Redelivered):
            named = frame.topic
        else:
            assert isinstance(frame, Deliver)
            assert named is not None
            seen.extend((named, m.offset) for run in frame.runs for m in decode_run(run))
    assert seen == sent
    # Three switches of topic: three naming frames, none repeated.
    assert sum(isinstance(decode_frame(memoryview(d)[4:]), Redelivered) for d in frames) == 3
    assert gate.take() == []


def test_a_lost_part_loses_its_waiting_runs_and_credit_until_it_is_back() -> None:
    """Owner 1 went down: what waited of it is dropped (it redelivers them),
    it gets no credit while lost, and owner 0's runs still flow in order."""
    gate = CreditGate(5, [0, 1], 1 << 20)
    gate.grant(4)
    assert gate.shares() == {0: 4, 1: 4}
    gate.arrive(0, [waiting(0, 0, 2)])
    gate.arrive(1, [waiting(1, 0, 2)])
    gate.window = 0  # the client has not granted more yet
    gate.drop(1)
    assert (gate.waiting_messages, set(gate.held)) == (2, {0})
    gate.grant(10)
    assert received(gate.take())[0] == [(0, 0), (0, 1)]
    assert set(gate.shares()) == {0}
    gate.held[1] = 0  # re-attached
    assert 1 in gate.shares()
