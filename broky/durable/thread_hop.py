"""One blocking call in a worker thread, for the partitions' owners' rounds.

A partition's owner hands every round (append, fsync) to a thread, and a
replicated partition does so on every node: the leader once per round and
each follower once per fetch it appends. ``trio.to_thread.run_sync`` costs
~60-90 us of CPU per call on this project's 2-core test machine, where
this costs ~40: it skips what an owner does not need, the capacity limiter
(an owner has one round in a thread at a time, and a node a bounded number
of owners: its partitions), the thread renaming (two ``prctl`` calls per
call) and the context copy (a round reads no context variables).

Like ``trio.to_thread.run_sync`` without ``abandon_on_cancel``: a caller
already cancelled gets Cancelled without the call starting, and a started
call is not abandoned: a cancellation waits for the thread's result and is
raised at the caller's next checkpoint, so a round is never half-done behind
its owner's back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import trio

if TYPE_CHECKING:  # trio's own dependency: its result type, not ours to import
    import outcome

T = TypeVar("T")


async def run_in_thread(function: Callable[[], T], *, started: bool = False) -> T:
    """``function()`` in a worker thread; its result or exception here.

    ``started``: the caller has already begun what ``function`` finishes
    (an owner's round appended on the event loop, which its thread must
    fsync), so a cancellation does not stop it from starting either: it is
    raised at the caller's next checkpoint."""
    if not started:
        await trio.lowlevel.checkpoint_if_cancelled()
    token = trio.lowlevel.current_trio_token()
    task = trio.lowlevel.current_task()

    def deliver(result: outcome.Outcome[T]) -> None:
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    trio.lowlevel.start_thread_soon(function, deliver)
    result: T = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
    return result
