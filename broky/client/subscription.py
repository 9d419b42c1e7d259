"""Client subscriptions: credit-based iterators over the runs the broker delivers.

The client's reader task hands each subscription whole runs (``_deliver``);
the consumer's task decodes runs only when iteration reaches them
(``decoding.py``, through ``BufferedRuns`` in ``buffered.py``, which a
durable-subscription consumer shares), and returns flow-control credit as
it consumes runs. ``PendingSubscription`` is what ``Client.subscribe``
returns before the broker has confirmed.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, Protocol

import attrs
import trio

from broky.client.buffered import BATCH_MESSAGES, ITERATION_MESSAGES, BufferedRuns, CreditOwner
from broky.client.decoding import decode_delivered_run
from broky.protocol.frames import Run, Unsubscribe
from broky.protocol.message import Message

__all__ = [
    "BATCH_MESSAGES",
    "ITERATION_MESSAGES",
    "PendingSubscription",
    "Subscription",
    "SubscriptionOwner",
    "SubscriptionStatistics",
]


class SubscriptionOwner(CreditOwner, Protocol):
    """What a subscription needs of its client (``Client``), named here so
    that this module does not import the client's."""

    def _forget(self, subscription: object) -> None: ...


@attrs.frozen
class SubscriptionStatistics:
    """Counters of one client subscription."""

    received: int
    dropped_by_broker: int
    buffered_messages: int


class Subscription(BufferedRuns[Message]):
    """An open subscription; iterate it with ``async for``, per message or
    per batch (``batches``).

    Messages are decoded a few runs at a time, when the iterator reaches them,
    and flow-control credit is returned to the broker as runs are consumed.
    """

    def __init__(self, client: SubscriptionOwner, stream: int, pattern: str, credit: int) -> None:
        super().__init__(client, stream, credit)
        self._owner = client
        self.pattern = pattern

    def _convert(self, run: Run) -> list[Message]:
        return decode_delivered_run(run)

    def statistics(self) -> SubscriptionStatistics:
        """What this subscription received, lost and holds."""
        return SubscriptionStatistics(
            received=self.received,
            dropped_by_broker=self.dropped_by_broker,
            buffered_messages=self.buffered_messages,
        )

    async def unsubscribe(self) -> None:
        """Stop the subscription; iteration ends after what is already buffered."""
        if not self._closed:
            self._closed = True
            self._ready.set()
            self._owner._forget(self)
            if not self._owner.closed:
                self._owner._send_control(Unsubscribe(self.stream))
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.unsubscribe()


class PendingSubscription:
    """What ``Client.subscribe`` returns: ``await`` it for the Subscription, or
    enter it with ``async with`` to unsubscribe when the block ends (the
    spelling aiohttp's requests have).

    It holds the one coroutine that subscribes, so it is used once, either
    way, and dropping it unused gets Python's "never awaited" warning, as a
    forgotten ``await`` would.
    """

    def __init__(self, subscribing: Coroutine[Any, Any, Subscription]) -> None:
        self._subscribing = subscribing
        self._subscription: Subscription | None = None

    def __await__(self) -> Generator[Any, None, Subscription]:
        return self._subscribing.__await__()

    async def __aenter__(self) -> Subscription:
        self._subscription = await self._subscribing
        return self._subscription

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._subscription is not None, "__aexit__ without a successful __aenter__"
        await self._subscription.unsubscribe()
