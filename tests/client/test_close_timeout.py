"""Leaving a client whose broker stops answering (``broky serve``
SIGSTOPped, a real socket): the closing flush waits at most
``close_timeout``, then the connection is given up, so the application's
exit is not held for ever, with plain and acked publishes unanswered. The
broker process is started here, resumed and killed by PID when the test ends."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import pytest
import trio

from broky import ConnectionClosed, connect
from tests.durable.test_workers import KEYS, write_config
from tests.mesh.test_nodes import nodes

#: The test's close timeout: short, and far below the bound the test allows.
CLOSE_TIMEOUT = 0.5


@pytest.mark.slow
async def test_leaving_a_paused_broker_returns_within_close_timeout(tmp_path: Path) -> None:
    config = tmp_path / "broky.toml"
    write_config(config, 1)
    with nodes() as start:
        node = start(["--config", str(config)])
        try:
            # Without the bound the closing flush waits for the paused broker for ever.
            with trio.fail_after(CLOSE_TIMEOUT + 5):
                async with connect(node.address, close_timeout=CLOSE_TIMEOUT) as client:
                    await client.ping()
                    os.killpg(node.process.pid, signal.SIGSTOP)
                    await client.publish(KEYS[0], b"plain")
                    await client.publish(KEYS[1], b"acked", ack=True)
        finally:
            os.killpg(node.process.pid, signal.SIGCONT)
    assert client.closed
    with pytest.raises(ConnectionClosed, match="did not answer the closing flush"):
        await client.ping()


@pytest.mark.parametrize("close_timeout", [-1.0, math.nan])
async def test_close_timeout_must_be_seconds(close_timeout: float) -> None:
    with pytest.raises(ValueError, match="close_timeout must be seconds"):
        async with connect("127.0.0.1:1", close_timeout=close_timeout):
            pass
