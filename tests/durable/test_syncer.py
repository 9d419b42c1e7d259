"""run_synced: short blocking calls in one shared thread, never abandoned,
handed back together when they finish together."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.lowlevel

from broky.durable import syncer
from broky.durable.syncer import MAX_QUEUED, run_synced


async def test_the_result_and_the_exception_come_back_from_another_thread() -> None:
    assert await run_synced(threading.get_ident) != threading.get_ident()

    def broken() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        await run_synced(broken)


async def test_calls_share_one_thread_in_arrival_order_and_all_come_back() -> None:
    """Calls queued while the thread is busy run one after another in it;
    past MAX_QUEUED waiting, a call takes a thread of its own."""
    gate = threading.Event()
    order: list[int] = []
    threads: dict[int, int] = {}

    def call(index: int) -> int:
        gate.wait(10)
        order.append(index)
        threads[index] = threading.get_ident()
        return index

    results: list[int] = []

    async def one(index: int) -> None:
        results.append(await run_synced(lambda: call(index)))

    async with trio.open_nursery() as nursery:
        for index in range(MAX_QUEUED + 2):
            nursery.start_soon(one, index)
            await trio.lowlevel.checkpoint()
        await trio.sleep(0.05)
        gate.set()
    assert sorted(results) == list(range(MAX_QUEUED + 2))
    shared = list(range(MAX_QUEUED))
    assert [index for index in order if index in shared] == shared
    assert len({threads[index] for index in shared}) == 1
    assert all(threads[index] != threads[0] for index in range(MAX_QUEUED, MAX_QUEUED + 2))
    assert syncer._loop_inbox().queued == 0


async def test_a_cancelled_call_waits_for_the_thread_then_raises_cancelled() -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []
    seen_on_return: list[bool] = []

    def call() -> None:
        started.set()
        release.wait(10)
        finished.append(True)

    scope = trio.CancelScope()

    async def caller() -> None:
        with scope:
            try:
                await run_synced(call)
            finally:
                seen_on_return.extend(finished)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        await trio.to_thread.run_sync(started.wait, 10)
        scope.cancel()
        await trio.sleep(0.05)
        assert finished == []
        release.set()
    assert scope.cancelled_caught
    assert seen_on_return == [True]


async def test_a_cancelled_caller_starts_nothing_unless_it_already_started() -> None:
    """``started``: the caller began what the call finishes (an appended
    round to fsync), so the call runs and the cancellation comes after."""
    calls: list[int] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        await run_synced(lambda: calls.append(1))
    assert scope.cancelled_caught
    assert calls == []
    with trio.CancelScope() as scope:
        scope.cancel()
        await run_synced(lambda: calls.append(2), started=True)
        await trio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    assert calls == [2]
