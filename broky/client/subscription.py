"""Client subscriptions: credit-based iterators over the runs the broker delivers.

The client's reader task hands each subscription whole runs (``_deliver``);
the consumer's task decodes a run only when iteration reaches it, and returns
flow-control credit as it consumes runs. ``PendingSubscription`` is what
``Client.subscribe`` returns before the broker has confirmed.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Coroutine, Generator
from typing import Any, Protocol

import attrs
import trio

from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Flow, Frame, Run, Unsubscribe
from broky.protocol.message import Message, decode_run

log = logging.getLogger("broky.client")


class SubscriptionOwner(Protocol):
    """What a subscription needs of its client (``Client``), named here so
    that this module does not import the client's."""

    @property
    def closed(self) -> bool: ...

    def _send_control(self, frame: Frame) -> None: ...

    def _forget(self, subscription: Subscription) -> None: ...


@attrs.frozen
class SubscriptionStatistics:
    """Counters of one client subscription."""

    received: int
    dropped_by_broker: int
    buffered_messages: int


class Subscription:
    """An open subscription; iterate it with ``async for``.

    Messages are decoded a run at a time, when the iterator reaches the run,
    and flow-control credit is returned to the broker as runs are consumed.
    """

    def __init__(self, client: SubscriptionOwner, stream: int, pattern: str, credit: int) -> None:
        self._client = client
        self.stream = stream
        self.pattern = pattern
        self._credit = credit
        self._runs: deque[Run] = deque()
        self._buffered = 0
        self._batch: list[Message] = []
        self._position = 0
        self._ready = trio.Event()
        self._confirmed = trio.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._ungranted = 0
        self.received = 0
        self.dropped_by_broker = 0

    # called by the client's reader task --------------------------------------

    def _deliver(self, runs: tuple[Run, ...]) -> None:
        self._runs.extend(runs)
        self._buffered += sum(run.count for run in runs)
        self._ready.set()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._confirmed.set()
        self._ready.set()

    # the consumer's side ------------------------------------------------------

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        position = self._position
        if position < len(self._batch):
            self._position = position + 1
            return self._batch[position]
        return await self._next_batch()

    async def _next_batch(self) -> Message:
        waited = False
        while not self._runs:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            self._ready = trio.Event()
            await self._ready.wait()
            waited = True
        if not waited:
            await trio.lowlevel.checkpoint()  # one checkpoint per run, not per message
        run = self._runs.popleft()
        self._buffered -= run.count
        self.received += run.count
        if self._credit:
            self._ungranted += run.count
            if self._ungranted * 2 >= self._credit:
                self._client._send_control(Flow(self.stream, self._ungranted))
                self._ungranted = 0
        try:
            self._batch = decode_run(run)
        except RemoteProtocolError as exc:
            log.warning("subscription %d: dropped an undecodable run: %s", self.stream, exc)
            self._batch = []
        if not self._batch:
            return await self._next_batch()
        self._position = 1
        return self._batch[0]

    def statistics(self) -> SubscriptionStatistics:
        """What this subscription received, lost and holds."""
        return SubscriptionStatistics(
            received=self.received,
            dropped_by_broker=self.dropped_by_broker,
            buffered_messages=self._buffered + len(self._batch) - self._position,
        )

    async def unsubscribe(self) -> None:
        """Stop the subscription; iteration ends after what is already buffered."""
        if not self._closed:
            self._closed = True
            self._ready.set()
            self._client._forget(self)
            if not self._client.closed:
                self._client._send_control(Unsubscribe(self.stream))
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
