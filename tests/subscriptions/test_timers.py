"""The ack timers' queue pops exactly what a binary heap would, in any mix of
in-order and out-of-order pushes and pops."""

from __future__ import annotations

import heapq
import itertools

from hypothesis import given
from hypothesis import strategies as st

from broky.subscriptions.timers import Timer, TimerQueue

#: A push (deadline, offset) or, as None, a pop.
_STEPS = st.lists(
    st.one_of(st.none(), st.tuples(st.integers(0, 30), st.integers(0, 50))), max_size=200
)


@given(steps=_STEPS, drift=st.booleans())
def test_pops_in_heap_order(steps: list[tuple[int, int] | None], drift: bool) -> None:
    """``drift``: deadlines mostly rise, as ``now + ack_timeout`` does (the
    FIFO's case); otherwise they come in any order (the heap's)."""
    queue = TimerQueue()
    model: list[Timer] = []
    sequence = itertools.count()
    clock = 0
    for step in steps:
        if step is None:
            assert queue.peek() == (model[0] if model else None)
            if model:
                assert queue.pop() == heapq.heappop(model)
        else:
            deadline, offset = step
            if drift:
                clock += deadline % 3
                deadline = clock - (deadline == 30)  # now and then one goes back
            timer: Timer = (float(deadline), offset, next(sequence), offset + 1)
            queue.push(timer)
            heapq.heappush(model, timer)
        assert len(queue) == len(model)
    while model:
        assert queue.pop() == heapq.heappop(model)
    assert queue.peek() is None
