"""Cluster links check that both nodes run the same number of workers."""

from __future__ import annotations

import logging

import pytest
import trio

from broky import Broker, Config
from broky.protocol.constants import LinkKind
from tests.conftest import eventually


async def start(nursery: trio.Nursery, workers: int) -> Broker:
    broker = Broker(Config(port=0), workers=workers)
    await nursery.start(broker.serve)
    return broker


def link(near: Broker, far: Broker) -> None:
    """A TCP cluster link from ``near`` to ``far``, as between nodes."""
    host, port = far.address or ("", 0)

    async def connect() -> trio.abc.Stream:
        return await trio.open_tcp_stream(host, port)

    near.add_link(LinkKind.CLUSTER, connect, f"{host}:{port}")


async def test_a_node_with_another_worker_count_is_refused_with_the_reason(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="broky.connection")
    two, one = await start(nursery, workers=2), await start(nursery, workers=1)
    link(one, two)
    with trio.fail_after(10):
        await eventually(lambda: "protocol_error" in two.statistics().connections_closed)
    assert "runs 1 workers and this node 2" in caplog.text
    assert "same --workers" in caplog.text
    assert all(status.connects == 0 for status in one.statistics().links)


async def test_nodes_with_equal_or_unknown_worker_counts_link(nursery: trio.Nursery) -> None:
    first, second, embedded = (
        await start(nursery, workers=2),
        await start(nursery, workers=2),
        await start(nursery, workers=0),
    )
    link(first, second)
    link(embedded, second)  # an embedded broker does not know a worker count
    with trio.fail_after(10):
        await eventually(
            lambda: (
                all(status.connects for status in first.statistics().links)
                and all(status.connects for status in embedded.statistics().links)
            )
        )
    assert "protocol_error" not in second.statistics().connections_closed
