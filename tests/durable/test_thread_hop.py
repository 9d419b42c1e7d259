"""run_in_thread: an owner's round in a worker thread, never abandoned."""

from __future__ import annotations

import os
import threading

import pytest
import trio
import trio.lowlevel

from broky.durable.thread_hop import run_in_thread


async def test_the_result_and_the_exception_come_back_from_another_thread() -> None:
    assert await run_in_thread(threading.get_ident) != threading.get_ident()

    def broken() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        await run_in_thread(broken)


async def test_a_cancelled_call_waits_for_its_thread_then_raises_cancelled() -> None:
    """The round finishes behind no one's back: cancellation is raised only
    once the thread's call returned."""
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []
    seen_on_return: list[bool] = []

    def round_() -> None:
        started.set()
        release.wait(10)
        finished.append(True)

    scope = trio.CancelScope()

    async def call() -> None:
        with scope:
            try:
                await run_in_thread(round_)
            finally:
                seen_on_return.extend(finished)
            await trio.lowlevel.checkpoint()  # where the cancellation is raised

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await trio.to_thread.run_sync(started.wait, 10)
        scope.cancel()
        await trio.sleep(0.05)
        assert finished == []  # the caller still waits for the thread
        release.set()
    assert scope.cancelled_caught
    assert seen_on_return == [True]  # it returned only once the thread had finished


async def test_a_caller_cancelled_before_the_call_does_not_start_it() -> None:
    calls: list[int] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        await run_in_thread(lambda: calls.append(1))
    assert scope.cancelled_caught
    assert calls == []


async def test_a_call_the_caller_already_started_runs_even_if_cancelled() -> None:
    """``started``: the caller began what the call finishes (a round
    appended on the event loop), so it runs, and the cancellation comes at
    the caller's next checkpoint."""
    calls: list[int] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        await run_in_thread(lambda: calls.append(1), started=True)
        assert calls == [1]
        await trio.lowlevel.checkpoint()
    assert scope.cancelled_caught


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this platform")
async def test_worker_threads_run_as_sched_batch() -> None:
    """A round's thread never preempts the event loop's thread on wakeup
    (the module docstring): it runs under SCHED_BATCH, and the loop's
    thread keeps its own policy."""
    assert await run_in_thread(lambda: os.sched_getscheduler(0)) == os.SCHED_BATCH
    assert os.sched_getscheduler(0) != os.SCHED_BATCH
