"""Client tests' shared fixture: a client wired to a scripted broker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from broky import Client
from tests.client.scripted_broker import ScriptedBroker


@pytest.fixture
async def wired(nursery: trio.Nursery) -> AsyncIterator[tuple[ScriptedBroker, Client]]:
    """A Client over an in-memory stream whose other end is a ScriptedBroker."""
    client_end, broker_end = trio.testing.memory_stream_pair()
    broker = ScriptedBroker(broker_end)
    nursery.start_soon(broker.serve)
    async with Client.over(client_end, "test") as client:
        yield broker, client
