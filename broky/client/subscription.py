"""Client subscriptions: credit-based iterators over the runs the broker delivers.

The client's reader task hands each subscription whole runs (``_deliver``);
the consumer's task decodes runs only when iteration reaches them
(``decoding.py``), and returns flow-control credit as it consumes runs.
``PendingSubscription`` is what ``Client.subscribe`` returns before the
broker has confirmed.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Coroutine, Generator
from typing import Any, Final, Protocol

import attrs
import trio

from broky.client.decoding import decode_delivered_run
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Flow, Frame, Run, Unsubscribe
from broky.protocol.message import Message

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


#: Messages the per-message iterator decodes at once, in whole runs: one
#: trio checkpoint per this many (see ``Subscription._decoded``).
ITERATION_MESSAGES: Final = 256
#: Default ``max_messages`` of ``Subscription.batches``: big enough that the
#: checkpoint per batch costs nothing per message, small enough that a batch's
#: Messages stay in the CPU cache (4096 measured 30-40% slower per message).
BATCH_MESSAGES: Final = 512


class Subscription:
    """An open subscription; iterate it with ``async for``, per message or
    per batch (``batches``).

    Messages are decoded a few runs at a time, when the iterator reaches them,
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
        # The common case returns a decoded message without any trio call.
        position = self._position
        batch = self._batch
        if position < len(batch):
            self._position = position + 1
            return batch[position]
        self._batch = batch = await self._decoded(ITERATION_MESSAGES)
        self._position = 1
        return batch[0]

    def batches(self, max_messages: int = BATCH_MESSAGES) -> Batches:
        """Iterate in lists of messages: ``async for batch in sub.batches()``.

        Each list holds, in order, what is buffered when it is taken: at
        least one message (it waits for one) and at most ``max_messages``.
        One trio checkpoint per batch, none per message. Per-message and
        batch iteration share one position, so they can be mixed. The list
        is the caller's to keep.
        """
        if max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, got {max_messages}")
        return Batches(self, max_messages)

    async def _next_batch(self, max_messages: int) -> list[Message]:
        position, batch = self._position, self._batch
        if position >= len(batch):
            batch, position = await self._decoded(max_messages), 0
        if not position and len(batch) <= max_messages:
            # Hand the list itself over: the iterator keeps no reference to it.
            self._batch, self._position = [], 0
            return batch
        end = min(position + max_messages, len(batch))
        self._batch, self._position = batch, end
        return batch[position:end]

    async def _decoded(self, limit: int) -> list[Message]:
        """Decode whole buffered runs up to ``limit`` messages (or one run,
        however big), waiting for runs when none are buffered.

        Exactly one checkpoint per call (the wait, or ``checkpoint``), none
        per message: a consumer that never awaits anything else still lets
        the reader and the application's other tasks run every ``limit``
        messages, and the per-message cost stays that of a list index.
        """
        runs = self._runs
        while True:
            if runs:
                await trio.lowlevel.checkpoint()
            else:
                await self._wait_for_runs()
            messages: list[Message] = []
            taken = 0
            # Whole runs while they fit, so a batch is sliced only when one
            # run alone exceeds ``limit``.
            while runs and (not taken or taken + runs[0].count <= limit):
                run = runs.popleft()
                taken += run.count
                try:
                    decoded = decode_delivered_run(run)
                except RemoteProtocolError as exc:
                    log.warning("subscription %d: dropped an undecodable run: %s", self.stream, exc)
                    continue
                if messages:
                    messages += decoded
                else:
                    messages = decoded
            self._consumed(taken)
            if messages:
                return messages

    async def _wait_for_runs(self) -> None:
        """Wait until a run is buffered; raise the subscription's error, or
        StopAsyncIteration once unsubscribed, when none is left."""
        while not self._runs:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            self._ready = trio.Event()
            await self._ready.wait()

    def _consumed(self, count: int) -> None:
        """Count ``count`` messages as taken and return their credit in
        grants of half the window, so Flow frames stay rare."""
        self._buffered -= count
        self.received += count
        if self._credit:
            self._ungranted += count
            if self._ungranted * 2 >= self._credit:
                self._client._send_control(Flow(self.stream, self._ungranted))
                self._ungranted = 0

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


class Batches:
    """The async iterator ``Subscription.batches`` returns: lists of messages."""

    def __init__(self, subscription: Subscription, max_messages: int) -> None:
        self._subscription = subscription
        self._max_messages = max_messages

    def __aiter__(self) -> Batches:
        return self

    async def __anext__(self) -> list[Message]:
        return await self._subscription._next_batch(self._max_messages)


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
