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

Worker threads run under Linux's ``SCHED_BATCH`` policy (set once per
thread, on its first call here; elsewhere, or if refused, they keep the
default). Why: a round's thread is woken by the event loop's thread while
that one holds the GIL; an ordinary woken thread preempts it on its core
(wakeup preemption), so the loop's thread sat descheduled holding the GIL
(``start_thread_soon`` was ~13 % of a replication leader's GIL-held
samples) while the worker could not run either. A ``SCHED_BATCH`` thread
never preempts on wakeup: it runs on an idle core at once, or at the next
tick when both are busy, so under load rounds grow and hand-offs thin
out. Measured on the 2-core test machine, alternating builds:
``bench_replication``'s one-node acked publishes 5.55 -> 4.98 us of broker
CPU a message (6 of 6 pairs), ``bench_consumers``' key-shared consume
and ack 5.24 -> 4.75 us (3 of 4). Threads of trio's cache keep the
policy: an embedding application's ``trio.to_thread`` call that lands on
one runs under it too (it only forgoes wakeup preemption).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import trio

if TYPE_CHECKING:  # trio's own dependency: its result type, not ours to import
    import outcome

T = TypeVar("T")

#: ``done`` is set in a worker thread once its policy was asked for.
_policy = threading.local()


def batch_policy() -> None:
    """Put the calling thread under ``SCHED_BATCH`` once (see the module
    docstring); a platform without it, or a refusal, leaves it as it is."""
    if getattr(_policy, "done", False):
        return
    _policy.done = True
    setter = getattr(os, "sched_setscheduler", None)
    policy = getattr(os, "SCHED_BATCH", None)
    if setter is None or policy is None:
        return
    with contextlib.suppress(OSError):
        setter(0, policy, os.sched_param(0))


def _in_batch_thread(function: Callable[[], T]) -> Callable[[], T]:
    def call() -> T:
        batch_policy()
        return function()

    return call


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

    trio.lowlevel.start_thread_soon(_in_batch_thread(function), deliver)
    result: T = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
    return result
