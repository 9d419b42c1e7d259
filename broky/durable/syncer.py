"""One long-lived fsync thread per process, shared by the partitions' owners
and the follower links: their per-round blocking calls, coalesced.

A replicated node hands a thread an fsync per leader round of each
partition it leads and per answer of each follower link, hundreds a second.
A hand-off through ``run_in_thread`` (broky.durable.thread_hop) is a futex
wake of a worker, that worker taking the GIL, and a wake of the event loop
through its wakeup socket on the way back: measured on this project's
shared 2-core test machine at load 5, ~85-135 us of CPU for a call that
does nothing. Each call pays it alone, even when several come at once.

Here one thread takes the calls in arrival order. While it runs one, the
next ones queue without waking it (a ``SimpleQueue.put`` to a busy
consumer is no system call), and results that finish before the event
loop has drained the previous ones ride on that wake-up (``_Inbox``): under
load, when calls overlap, several share one hand-off each way. The price is
that the calls run one after another instead of side by side; so only
short ones come here (an fsync of what a round appended, a follower's
append and fsync of one answer), and a call finding ``MAX_QUEUED`` already
waiting goes to a thread of its own (``run_in_thread``), which bounds the
wait behind other partitions' fsyncs on a slow disk.

Like ``run_in_thread``: a caller already cancelled gets Cancelled without
the call starting (unless ``started``), and a started call is not
abandoned: a cancellation waits for its result and is raised at the
caller's next checkpoint.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, Final, TypeVar

import outcome
import trio

from broky.durable.thread_hop import run_in_thread

T = TypeVar("T")

log = logging.getLogger("broky.durable")

#: Calls waiting in or for the thread, per event loop, past which a call
#: takes a thread of its own instead of queuing behind them.
MAX_QUEUED: Final = 4


class _Inbox:
    """One event loop's finished calls, handed back with one wake-up for
    as many as finish before the loop drains them."""

    __slots__ = ("done", "queued", "scheduled", "token")

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token
        self.done: deque[tuple[trio.lowlevel.Task, outcome.Outcome[Any]]] = deque()
        #: Calls of this loop submitted and not yet drained (event loop only).
        self.queued = 0
        #: Whether a ``drain`` is queued on the loop (set by the thread,
        #: cleared by ``drain`` before it looks: a result appended after
        #: that is either seen by this drain or schedules the next one).
        self.scheduled = False

    def deliver(self, task: trio.lowlevel.Task, result: outcome.Outcome[Any]) -> None:
        """In the thread: hand ``result`` to ``task``, waking the loop only
        if no drain is on its way."""
        self.done.append((task, result))
        if not self.scheduled:
            self.scheduled = True
            self.token.run_sync_soon(self.drain)

    def drain(self) -> None:
        """On the event loop: resume every task whose call finished."""
        self.scheduled = False
        done = self.done
        while done:
            task, result = done.popleft()
            self.queued -= 1
            trio.lowlevel.reschedule(task, result)


_Job = tuple[Callable[[], Any], _Inbox, trio.lowlevel.Task]


class _Syncer:
    """The thread and its queue (started on first use in each process: a
    forked child starts its own)."""

    def __init__(self) -> None:
        self.jobs: SimpleQueue[_Job] = SimpleQueue()
        threading.Thread(target=self._work, name="broky syncer", daemon=True).start()

    def _work(self) -> None:
        jobs = self.jobs
        while True:
            function, inbox, task = jobs.get()
            result = outcome.capture(function)
            del function
            try:
                inbox.deliver(task, result)
            except BaseException:  # the thread must live on for the other callers
                log.exception("syncer: could not hand a result back")


#: The syncer of each process that used one, by pid (a forked child's own).
_SYNCERS: dict[int, _Syncer] = {}
_inbox: trio.lowlevel.RunVar[_Inbox] = trio.lowlevel.RunVar("broky_syncer_inbox")


def _the_syncer() -> _Syncer:
    pid = os.getpid()
    syncer = _SYNCERS.get(pid)
    if syncer is None:
        syncer = _SYNCERS[pid] = _Syncer()
    return syncer


def _loop_inbox() -> _Inbox:
    try:
        return _inbox.get()
    except LookupError:
        inbox = _Inbox(trio.lowlevel.current_trio_token())
        _inbox.set(inbox)
        return inbox


async def run_synced(function: Callable[[], T], *, started: bool = False) -> T:
    """``function()`` in the shared syncer thread (or, past MAX_QUEUED, a
    thread of its own); its result or exception here. ``started``: as for
    ``run_in_thread`` (a cancellation does not keep it from starting)."""
    if not started:
        await trio.lowlevel.checkpoint_if_cancelled()
    inbox = _loop_inbox()
    if inbox.queued >= MAX_QUEUED:
        return await run_in_thread(function, started=True)
    inbox.queued += 1
    _the_syncer().jobs.put((function, inbox, trio.lowlevel.current_task()))
    result: T = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
    return result
