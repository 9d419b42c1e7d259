"""The router: sole owner of subscription state; fans runs out to outboxes.

Every method is synchronous and never waits: connection tasks call it on the
router's own trio thread, so a call is atomic with respect to every other
task, and the router needs neither a lock nor an inbox task. (An inbox
channel would add a task switch, ~7 us, and its scheduling latency to every
batch for no isolation gain: nothing here can block.) What can block, writing
to a socket, happens in each connection's writer task after ``Outlet.take``.

Ordering: runs are pushed in the order ``publish`` receives them, so messages
from one publisher connection reach each subscriber in publish order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Final

import attrs

from broky.protocol.codec import encode_frame, encode_run_chunk
from broky.protocol.constants import ErrorCode, SlowConsumerPolicy
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Error, Run, Subscribed
from broky.router.matcher import SubscriptionIndex, validate_pattern
from broky.router.outbox import (
    DEFAULT_OUTBOX_BYTES,
    DEFAULT_OUTBOX_MESSAGES,
    DEFAULT_WRITE_BATCH_BYTES,
    EncodedRun,
    Outlet,
    RouterCounters,
    Subscription,
)

#: Most subscriptions one connection may hold; bounds per-connection state.
DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION: Final = 10_000


@attrs.frozen
class RouterLimits:
    """Per-subscription and per-connection bounds applied by the router."""

    outbox_messages: int = DEFAULT_OUTBOX_MESSAGES
    outbox_bytes: int = DEFAULT_OUTBOX_BYTES
    write_batch_bytes: int = DEFAULT_WRITE_BATCH_BYTES
    max_subscriptions_per_connection: int = DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION


@attrs.frozen
class RouterStatistics:
    """A snapshot of a router's state and counters."""

    connections: int
    subscriptions: int
    topics: int
    match_cache_keys: int
    published_messages: int
    published_runs: int
    delivered_messages: int
    dropped_no_subscriber: int
    dropped_slow_consumer: int
    slow_consumer_disconnects: int
    outbox_messages: int
    outbox_bytes: int


class Router:
    """Subscription index, outboxes and fan-out for one worker."""

    def __init__(
        self, limits: RouterLimits | None = None, clock: Callable[[], int] = time.time_ns
    ) -> None:
        self.limits = limits or RouterLimits()
        self.counters = RouterCounters()
        self._index: SubscriptionIndex[Subscription] = SubscriptionIndex()
        self._outlets: set[Outlet] = set()
        self._clock = clock

    # --- connections -------------------------------------------------------

    def attach(self, wake: Callable[[], None]) -> Outlet:
        """Register a connection; ``wake`` is called when it has work."""
        outlet = Outlet(wake, self.counters, self.limits.write_batch_bytes)
        self._outlets.add(outlet)
        return outlet

    def detach(self, outlet: Outlet) -> None:
        """Forget a connection and all its subscriptions."""
        for subscription in list(outlet.subscriptions.values()):
            self._drop_subscription(subscription)
        self._outlets.discard(outlet)

    # --- subscriptions -----------------------------------------------------

    def subscribe(
        self,
        outlet: Outlet,
        stream: int,
        pattern: bytes,
        policy: SlowConsumerPolicy = SlowConsumerPolicy.DROP,
        credit: int = 0,
    ) -> Subscription | None:
        """Open a subscription and queue its ``Subscribed`` confirmation.

        Stream-level problems (bad pattern, duplicate stream, too many
        subscriptions) are answered with a stream Error; returns None then.
        """
        try:
            validate_pattern(pattern)
            if stream in outlet.subscriptions:
                raise RemoteProtocolError(
                    f"stream {stream} is already subscribed", ErrorCode.DUPLICATE_STREAM
                )
            if len(outlet.subscriptions) >= self.limits.max_subscriptions_per_connection:
                raise RemoteProtocolError(
                    f"a connection may hold at most "
                    f"{self.limits.max_subscriptions_per_connection} subscriptions",
                    ErrorCode.LIMIT_EXCEEDED,
                )
        except RemoteProtocolError as exc:
            outlet.send_control(encode_frame(Error(exc.code, str(exc), stream)))
            return None
        subscription = Subscription(
            stream=stream,
            pattern=pattern,
            policy=policy,
            outlet=outlet,
            max_messages=self.limits.outbox_messages,
            max_bytes=self.limits.outbox_bytes,
            credit=credit or None,
        )
        outlet.subscriptions[stream] = subscription
        self._index.add(pattern, subscription)
        outlet.send_control(encode_frame(Subscribed(stream)))
        return subscription

    def unsubscribe(self, outlet: Outlet, stream: int) -> None:
        """Close a subscription; an unknown stream gets a stream Error."""
        subscription = outlet.subscriptions.get(stream)
        if subscription is None:
            outlet.send_control(
                encode_frame(Error(ErrorCode.UNKNOWN_STREAM, f"no subscription {stream}", stream))
            )
            return
        self._drop_subscription(subscription)

    def grant(self, outlet: Outlet, stream: int, credit: int) -> None:
        """Add flow-control credit to a subscription (unknown streams are
        ignored: the Flow may have crossed an Unsubscribe)."""
        subscription = outlet.subscriptions.get(stream)
        if subscription is not None:
            subscription.grant(credit)

    def _drop_subscription(self, subscription: Subscription) -> None:
        subscription.closed = True
        del subscription.outlet.subscriptions[subscription.stream]
        self._index.remove(subscription.pattern, subscription)

    # --- publishing --------------------------------------------------------

    def encode(self, runs: Iterable[Run], stamp_ts_broker: bool) -> list[EncodedRun]:
        """Turn decoded runs into forwardable chunks (one copy per run)."""
        ts_broker = self._clock() if stamp_ts_broker else 0
        return [
            EncodedRun(
                run.key,
                run.count,
                encode_run_chunk(run.key, ts_broker or run.ts_broker, run.sizes, run.messages),
            )
            for run in runs
        ]

    def publish(
        self, runs: Iterable[EncodedRun], origin: Outlet | None = None, stream: int = 0
    ) -> None:
        """Fan runs out to every matching subscription, in order, never waiting.

        A run with an invalid key is skipped and answered with a stream Error
        to ``origin`` (the publishing connection), which stays up; on publish
        stream 0 the error is a connection error and routing stops there.
        """
        counters = self.counters
        match = self._index.match
        for run in runs:
            try:
                subscriptions = match(run.key)
            except RemoteProtocolError as exc:
                # Rejected, not published: counting it would leave messages
                # that are neither delivered, dropped nor queued.
                if origin is None:
                    continue
                if stream == 0:  # nothing to blame but the connection: stream 0 errors close it
                    origin.fail(exc.code, str(exc))
                    return
                origin.send_control(encode_frame(Error(exc.code, str(exc), stream)))
                continue
            counters.published_runs += 1
            counters.published_messages += run.count
            if not subscriptions:
                counters.dropped_no_subscriber += run.count
                continue
            for subscription in subscriptions:
                subscription.push(run)

    # --- introspection -----------------------------------------------------

    def statistics(self) -> RouterStatistics:
        """A consistent snapshot (the router is single-threaded)."""
        counters = self.counters
        outbox_messages = outbox_bytes = 0
        for outlet in self._outlets:
            for subscription in outlet.subscriptions.values():
                outbox_messages += subscription.pending_messages
                outbox_bytes += subscription.pending_bytes
        return RouterStatistics(
            connections=len(self._outlets),
            subscriptions=len(self._index),
            topics=self._index.pattern_count,
            match_cache_keys=self._index.cache_size,
            published_messages=counters.published_messages,
            published_runs=counters.published_runs,
            delivered_messages=counters.delivered_messages,
            dropped_no_subscriber=counters.dropped_no_subscriber,
            dropped_slow_consumer=counters.dropped_slow_consumer,
            slow_consumer_disconnects=counters.slow_consumer_disconnects,
            outbox_messages=outbox_messages,
            outbox_bytes=outbox_bytes,
        )
