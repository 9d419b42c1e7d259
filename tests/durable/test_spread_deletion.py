"""Deleting a durable subscription on ``broky serve --workers 2``: every
owner worker deletes its share, from whichever worker the request arrives.
Every process is started here, on 127.0.0.1, and killed by PID when the
test ends."""

from __future__ import annotations

import contextlib
from pathlib import Path
from random import Random

import pytest
import trio

from broky import BrokyError, Client, Delivery, ErrorCode, Start, connect
from tests.durable.test_spread_consumers import publish
from tests.durable.test_workers import KEYS, write_config
from tests.mesh.test_nodes import nodes
from tests.subscriptions.test_deletion import stored_rows

pytestmark = pytest.mark.slow

TOTAL = 16


async def consume_then_delete(client: Client, admin: Client) -> None:
    """Ack every message of ``spread``, then delete it: refused while this
    consumer is attached, then forced (which ends this consumer)."""
    async with client.consumer(
        "orders.>", subscription="spread", start=Start.earliest()
    ) as consumer:
        async for delivery in consumer:
            await delivery.ack()
            if consumer.statistics().acked < TOTAL:
                continue
            await consumer.flush()
            with pytest.raises(BrokyError) as refused:
                await admin.delete_subscription("spread")
            assert refused.value.code is ErrorCode.SUBSCRIPTION_REFUSED
            deleted = await admin.delete_subscription("spread", force=True)
            assert deleted.partitions == 8
            # The consumer's parts still attached when each owner deleted: the
            # first owner's ending detaches the other part, maybe before it.
            assert 1 <= deleted.consumers <= 2


async def take_all(client: Client) -> list[Delivery]:
    got = []
    async with client.consumer(
        "orders.>", subscription="spread", start=Start.earliest()
    ) as consumer:
        async for delivery in consumer:
            got.append(delivery)
            await delivery.ack()
            if len(got) == TOTAL:
                return got
    raise AssertionError("the consumer ended early")


async def test_deletion_reaches_every_owner_and_ends_spread_consumers(tmp_path: Path) -> None:
    config = tmp_path / "broky.toml"
    write_config(config, 2)
    with nodes() as start, trio.fail_after(40):
        node = start(["--config", str(config)])
        await publish(node.address, TOTAL, KEYS)
        async with (
            connect(node.address, name="admin") as admin,
            connect(node.address, name="consumer") as client,
        ):
            with pytest.raises(BrokyError) as ended:
                await consume_then_delete(client, admin)
            assert ended.value.code is ErrorCode.SUBSCRIPTION_DELETED
            assert stored_rows(tmp_path / "data", "spread") == 0
            with pytest.raises(BrokyError) as unknown:
                await admin.delete_subscription("spread")
            assert unknown.value.code is ErrorCode.UNKNOWN_SUBSCRIPTION
            # The name starts fresh: every message again, as a first delivery.
            got = await take_all(client)
    assert sorted(int(d.payload) for d in got) == list(range(TOTAL))
    assert {d.delivery_count for d in got} == {1}


ROUNDS = 25


async def attach_and_leave(client: Client) -> None:
    """Attach a consumer of ``spread`` (which creates what is missing) and
    leave; a refusal (the subscription is being deleted) is fine."""
    with contextlib.suppress(BrokyError):
        async with client.consumer("orders.>", subscription="spread", start=Start.earliest()):
            pass


async def test_a_deletion_racing_an_attach_deletes_everywhere_or_nowhere(
    tmp_path: Path,
) -> None:
    """Issue 13, gap 1: owners asked at once could delete on one worker and
    refuse on another (a consumer attached there meanwhile). With the two
    phases a refused deletion deleted nothing, on any worker."""
    config = tmp_path / "broky.toml"
    write_config(config, 2)
    data = tmp_path / "data"
    outcomes = {"deleted": 0, "refused": 0}
    random = Random(13)
    with nodes() as start, trio.fail_after(60):
        node = start(["--config", str(config)])
        await publish(node.address, TOTAL, KEYS)
        async with (
            connect(node.address, name="admin") as admin,
            connect(node.address, name="a") as first,
            connect(node.address, name="b") as second,
        ):
            await attach_and_leave(first)
            full = stored_rows(data, "spread")
            assert full == 2 * 8  # a definition and an image per partition

            async def delete_soon() -> None:
                await trio.sleep(random.uniform(0, 0.004))
                code = None
                try:
                    await admin.delete_subscription("spread")
                except BrokyError as refused:
                    code = refused.code
                if code is None:
                    outcomes["deleted"] += 1
                    return
                outcomes["refused"] += 1
                assert code in (ErrorCode.SUBSCRIPTION_REFUSED, ErrorCode.UNKNOWN_SUBSCRIPTION)
                rows = stored_rows(data, "spread")
                assert rows in (0, full), f"a refused deletion left {rows} of {full} rows"

            for _ in range(ROUNDS):
                await attach_and_leave(first)  # whole again, and a consumer leaving
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(delete_soon)
                    nursery.start_soon(attach_and_leave, second)
    assert outcomes["deleted"] + outcomes["refused"] == ROUNDS
    assert outcomes["deleted"] > 0
