"""PartitionOwner.borrow: an idle owner lends its log at once, and no round
runs while it is lent (a node-pair replication link appends with it)."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from broky import Broker
from tests.durable.test_durable_broker import durable_config


async def test_a_lent_log_holds_rounds_back_until_it_is_returned(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            broker = Broker(durable_config(tmp_path, partitions=1))
            await nursery.start(broker.serve)
            assert broker.store is not None
            owner = broker.store.owners[("orders", 0)]
            acked: list[object] = []
            async with broker.connect() as client:

                async def publish() -> None:
                    await client.publish("orders.k", b"one", ack=True)
                    acked.extend(await client.flush_acks())

                partition_log = await owner.borrow()
                try:
                    nursery.start_soon(publish)
                    await trio.sleep(0.3)  # a round would have stored and acked it by now
                    assert acked == []
                    assert partition_log.end_offset == 0
                finally:
                    owner.give_back()
                with trio.fail_after(5):
                    while not acked:  # noqa: ASYNC110 - the held round runs now
                        await trio.sleep(0.01)
                assert owner.end_offset == 1
            nursery.cancel_scope.cancel()
