"""The deduplication window of idempotent producers, against a model.

The model remembers every run ever appended. The window must answer a run
at or past its producer's next sequence as new, a remembered run as a
duplicate with its original offset, and anything else below the next
sequence as out of order; never new for an old sequence (that would store a
retry twice) and never a duplicate with another offset (that would ack a
message that is not where the ack says)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broky.durable.producers import Duplicate, OutOfOrder, ProducerWindow

WINDOW = 40
PRODUCERS = 3


class WindowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.window = ProducerWindow(window=WINDOW, max_producers=PRODUCERS)
        self.offset = 0
        #: producer -> [(sequence, count, offset)] of every run appended.
        self.appended: dict[int, list[tuple[int, int, int]]] = {}
        self.next: dict[int, int] = {}
        #: Producers dropped (too many, or forgotten): unknown to the window.
        self.forgotten: set[int] = set()
        self.seen_order: list[int] = []

    def _touch(self, producer: int) -> None:
        if producer in self.seen_order:
            self.seen_order.remove(producer)
        self.seen_order.append(producer)
        if len(self.seen_order) > PRODUCERS:
            dropped = self.seen_order.pop(0)
            self._drop(dropped)

    def _drop(self, producer: int) -> None:
        self.forgotten.add(producer)
        self.appended.pop(producer, None)
        self.next.pop(producer, None)

    @rule(producer=st.integers(1, PRODUCERS + 1), skip=st.integers(0, 15), count=st.integers(1, 9))
    def append_new(self, producer: int, skip: int, count: int) -> None:
        sequence = self.next.get(producer, 1) + skip  # other partitions took some
        assert self.window.check(producer, sequence, count) is None
        self.window.record(producer, sequence, count, self.offset)
        self.forgotten.discard(producer)
        self.appended.setdefault(producer, []).append((sequence, count, self.offset))
        self.next[producer] = sequence + count
        self._touch(producer)
        self.offset += count

    @precondition(lambda self: any(self.appended.values()))
    @rule(data=st.data())
    def retry_an_appended_run(self, data: st.DataObject) -> None:
        producer = data.draw(st.sampled_from(sorted(p for p, r in self.appended.items() if r)))
        sequence, count, offset = data.draw(st.sampled_from(self.appended[producer]))
        verdict = self.window.check(producer, sequence, count)
        remembered = sequence + count > self.next[producer] - WINDOW
        if remembered:
            assert verdict == Duplicate(offset)
        else:
            assert isinstance(verdict, OutOfOrder)

    @precondition(lambda self: any(self.appended.values()))
    @rule(data=st.data(), delta=st.integers(-3, 3))
    def probe_any_old_sequence(self, data: st.DataObject, delta: int) -> None:
        producer = data.draw(st.sampled_from(sorted(p for p, r in self.appended.items() if r)))
        sequence = data.draw(st.integers(0, self.next[producer] - 1))
        count = data.draw(st.integers(1, 9))
        verdict = self.window.check(producer, sequence, count)
        assert verdict is not None, "an old sequence must never be stored again"
        if isinstance(verdict, Duplicate):
            matches = [r for r in self.appended[producer] if r[0] == sequence and r[1] == count]
            assert matches
            assert verdict.first_offset == matches[0][2]

    @rule(producer=st.integers(1, PRODUCERS + 1))
    def forget(self, producer: int) -> None:
        self.window.forget({producer})
        self._drop(producer)
        if producer in self.seen_order:
            self.seen_order.remove(producer)

    @invariant()
    def unknown_producers_start_fresh(self) -> None:
        for producer in self.forgotten:
            assert self.window.check(producer, 1, 1) is None
        assert len(self.window) <= PRODUCERS


WindowMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
test_window = WindowMachine.TestCase


def test_pruned_runs_are_compacted_and_still_answer() -> None:
    window = ProducerWindow(window=10)
    for sequence in range(1, 5000):
        window.record(7, sequence, 1, sequence * 2)
    assert window.check(7, 4999, 1) == Duplicate(9998)
    assert window.check(7, 4990, 1) == Duplicate(9980)
    assert isinstance(window.check(7, 4980, 1), OutOfOrder)
    assert window.check(7, 5000, 1) is None
    assert isinstance(window.check(7, 4999, 2), OutOfOrder)


@settings(max_examples=100, deadline=None)
@given(
    runs=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 60), st.integers(1, 5)), max_size=40)
)
def test_admit_is_check_then_record(runs: list[tuple[int, int, int]]) -> None:
    """The owner's one-call ``admit`` answers as ``check`` and records exactly
    what ``check`` calls new, at the offset given."""
    fused = ProducerWindow(window=20)
    split = ProducerWindow(window=20)
    for offset, (producer, sequence, count) in enumerate(runs):
        expected = split.check(producer, sequence, count)
        if expected is None:
            split.record(producer, sequence, count, offset)
        assert fused.admit(producer, sequence, count, offset) == expected
    for producer, sequence, count in runs:
        assert fused.check(producer, sequence, count) == split.check(producer, sequence, count)
