"""An idle partition's owner: no thread hand-off, few wake-ups, and still
its housekeeping on time (broky.durable.owner with
PartitionLog.housekeeping_delay).

Before, every owner handed a tick to a thread every 0.2 s whatever it had
to do: an idle broker of 64 durable partitions used ~13 % of a core.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from broky import Broker
from broky.durable import owner as owner_module
from broky.durable.thread_hop import run_in_thread
from tests.durable.test_durable_broker import durable_config

T = TypeVar("T")


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each owner round went to a thread (``time.monotonic``)."""
    seen: list[float] = []

    async def counting(function: Callable[[], T], *, started: bool = False) -> T:
        seen.append(time.monotonic())
        return await run_in_thread(function, started=started)

    monkeypatch.setattr(owner_module, "run_in_thread", counting)
    return seen


async def test_idle_partitions_hand_nothing_to_threads(tmp_path: Path, hops: list[float]) -> None:
    config = durable_config(tmp_path, partitions=8, fsync="interval", fsync_interval=0.3)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            broker = Broker(config)
            await nursery.start(broker.serve)
            assert broker.store is not None
            await trio.sleep(1.2)
            assert hops == [], "an idle partition with nothing to sync, roll or expire"
            async with broker.connect() as client:
                await client.publish("orders.k", b"one", ack=True)
                acked = list(await client.flush_acks())
            (run,) = acked
            owner = broker.store.owners[("orders", run.partition)]
            # fsync = "interval": acked once written; synced by a tick
            # within the interval, with nothing else happening.
            written = time.monotonic()
            while owner.statistics.durable_offset < 1:  # noqa: ASYNC110 - the tick syncs
                await trio.sleep(0.02)
            assert time.monotonic() - written < 0.3 + 0.2 + 0.3  # interval + tick + slack
            synced = len(hops)
            await trio.sleep(1.2)
            assert len(hops) == synced, "synced and idle again: no more hand-offs"
            nursery.cancel_scope.cancel()


async def test_an_idle_partition_still_expires_by_age(tmp_path: Path, hops: list[Any]) -> None:
    config = durable_config(tmp_path, partitions=1, retention_seconds=0.5)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            broker = Broker(config)
            await nursery.start(broker.serve)
            assert broker.store is not None
            async with broker.connect() as client:
                for index in range(3):
                    await client.publish("orders.k", b"%d" % index, ack=True)
                await client.flush_acks()
            owner = broker.store.owners[("orders", 0)]
            assert (owner.start_offset, owner.end_offset) == (0, 3)
            while owner.start_offset < 3:  # noqa: ASYNC110 - retention's tick removes them
                await trio.sleep(0.05)
            expired = len(hops)
            await trio.sleep(1.2)
            assert len(hops) == expired, "nothing left to expire: no more hand-offs"
            nursery.cancel_scope.cancel()
