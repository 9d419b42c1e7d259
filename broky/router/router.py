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
from collections.abc import Callable, Iterable, Sequence

from broky.observability.topics import TopicCounter
from broky.protocol.chunks import forward_chunk
from broky.protocol.codec import encode_frame
from broky.protocol.constants import ErrorCode, LinkKind, SlowConsumerPolicy
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import EncodedRun, Error, Run, Subscribed
from broky.router.fanout import fan_out
from broky.router.interest import Interest, LinkListener, PendingConfirmation
from broky.router.limits import RouterLimits
from broky.router.matcher import SubscriptionIndex, validate_pattern
from broky.router.outbox import Outlet, Subscription
from broky.router.pressure import Pressure
from broky.router.queues import (
    Groups,
    Receiver,
    interest_key,
    split_interest,
    validate_queue,
)
from broky.router.routes import RouteCache, find_route
from broky.router.statistics import RouterCounters, RouterStatistics, router_statistics
from broky.router.unrouted import count_unrouted


def stream_error(outlet: Outlet, stream: int, error: RemoteProtocolError) -> None:
    """Answer a refused request on ``stream`` with a stream Error; on stream
    0, which names no stream, the connection itself is to blame, and an
    Error on stream 0 closes it (docs/protocol.md), so fail the outlet."""
    if stream == 0:
        outlet.fail(error.code, str(error))
    else:
        outlet.send_control(encode_frame(Error(error.code, str(error), stream)))


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
        #: Per-key figures for the busiest keys; counted once per run in publish.
        self.topics = TopicCounter(self.limits.top_topics)
        self.interest = Interest()
        #: This broker node's id; links refuse a Hello carrying it (a self-link).
        self.node_id = ""
        #: Routes of recently seen keys (broky.router.routes), per source kind.
        self._routes = RouteCache()
        #: Queue groups by pattern and name; routes hold them like subscriptions.
        self._groups = Groups()
        #: Outlets whose subscribers drain but fell behind: readers pause for them.
        self.pressure = Pressure()
        #: Writes that connections woken while idle ask the routing task to
        #: make at once (ConnectionWriter.write_directly): a reader runs
        #: them after each read, so one write per connection per read batch.
        self.direct_writes: list[Callable[[], None]] = []
        #: True while a reader routes a batch it read: it runs the direct
        #: writes when done, so connections woken meanwhile need not wake
        #: their writer tasks (see ConnectionWriter.wake).
        self.routing = False
        #: Whether a key belongs to a durable topic, set when the workers of a
        #: node forward durable traffic to each other (broky.durable.forwarding):
        #: then durable keys reach other workers only over their ``DURABLE``
        #: connections (lossless, in offset order), never over the lossy
        #: ``LOCAL`` links, and ``DURABLE`` connections get nothing else.
        self.durable_keys: Callable[[bytes], bool] | None = None

    # --- connections -------------------------------------------------------

    def attach(self, wake: Callable[[], None]) -> Outlet:
        """Register a connection; ``wake`` is called when it has work."""
        outlet = Outlet(
            wake,
            self.counters,
            self.limits.write_batch_bytes,
            self.limits.max_pending_bytes,
            self.pressure,
        )
        self._outlets.add(outlet)
        return outlet

    def detach(self, outlet: Outlet) -> None:
        """Forget a connection and all its subscriptions, and free what was
        queued for it: nothing of a closed connection outlives this call."""
        for subscription in list(outlet.subscriptions.values()):
            self._drop_subscription(subscription)
        self._outlets.discard(outlet)
        outlet.close()

    # --- subscriptions -----------------------------------------------------

    def subscribe(
        self,
        outlet: Outlet,
        stream: int,
        pattern: bytes,
        policy: SlowConsumerPolicy = SlowConsumerPolicy.DROP,
        credit: int = 0,
        awaiting_owners: int = 0,
        queue: bytes = b"",
    ) -> Subscription | None:
        """Open a subscription and queue its ``Subscribed`` confirmation
        (after the links', and ``awaiting_owners`` calls of ``confirm``).

        A non-empty ``queue`` joins that queue group on the pattern
        (broky.router.queues): each matching message to one member.
        Stream-level problems (bad pattern or queue name, duplicate stream,
        too many subscriptions) are answered with a stream Error; returns
        None then.
        """
        try:
            if stream == 0:
                raise RemoteProtocolError(
                    "Subscribe on stream 0: subscribe streams must be non-zero "
                    "(stream 0 names the whole connection)",
                    ErrorCode.MALFORMED_FRAME,
                )
            validate_pattern(pattern)
            if queue:
                validate_queue(queue)
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
            stream_error(outlet, stream, exc)
            return None
        limits = self.limits
        if outlet.kind is LinkKind.CLIENT:
            max_messages, max_bytes = limits.outbox_messages, limits.outbox_bytes
        elif outlet.kind is LinkKind.DURABLE:
            # A forwarded client subscription: its credit, and drops (never a
            # disconnect, which would cut every forwarded request with it).
            max_messages, max_bytes = limits.outbox_messages, limits.outbox_bytes
            policy = SlowConsumerPolicy.DROP
        else:  # a peer's interest: never disconnect a link, never flow-control it
            max_messages, max_bytes = limits.link_outbox_messages, limits.link_outbox_bytes
            policy, credit = SlowConsumerPolicy.DROP, 0
        subscription = Subscription(
            stream=stream,
            pattern=pattern,
            policy=policy,
            outlet=outlet,
            max_messages=max_messages,
            max_bytes=max_bytes,
            credit=credit or None,
            queue=queue,
        )
        outlet.subscriptions[stream] = subscription
        self._index.add(pattern, subscription)
        if queue:
            self._groups.join(subscription)
        interest = self.interest
        key = interest_key(pattern, queue)
        confirming = interest.added(key, outlet.kind)
        pending = interest.pending.get(key)
        if pending is None and confirming:
            pending = interest.pending[key] = PendingConfirmation(confirming)
        subscription.awaiting_owners = awaiting_owners
        if pending is not None and outlet.kind is LinkKind.CLIENT:
            pending.waiters.append(subscription)  # Subscribed once the local links confirm
        else:
            self.confirm(subscription)
        return subscription

    def confirm(self, subscription: Subscription, owner: bool = False) -> None:
        """Send ``Subscribed`` once the links (``owner`` false) and every
        owner in ``awaiting_owners`` (``owner`` true, one call each) confirmed."""
        if owner:
            subscription.awaiting_owners -= 1
        else:
            subscription.links_confirmed = True
        ready = subscription.awaiting_owners <= 0 and subscription.links_confirmed
        if ready and not subscription.closed:
            subscription.outlet.send_control(encode_frame(Subscribed(subscription.stream)))

    def unsubscribe(self, outlet: Outlet, stream: int) -> None:
        """Close a subscription; an unknown stream gets a stream Error."""
        subscription = outlet.subscriptions.get(stream)
        if subscription is None:
            stream_error(
                outlet,
                stream,
                RemoteProtocolError(f"no subscription {stream}", ErrorCode.UNKNOWN_STREAM),
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
        subscription.close()
        del subscription.outlet.subscriptions[subscription.stream]
        self._index.remove(subscription.pattern, subscription)
        if subscription.queue:
            self._groups.leave(subscription)
        self.interest.removed(
            interest_key(subscription.pattern, subscription.queue), subscription.outlet.kind
        )
        # The route caches may hold the subscription: clear them now, not at
        # the next publish (which may be long in coming on a quiet broker).
        self._clear_routes()

    def _clear_routes(self) -> None:
        """Empty the route caches and note the index generation they follow."""
        self._routes.clear(self._index.generation)

    # --- links to peer routers ---------------------------------------------

    def add_link(self, link: LinkListener) -> list[bytes]:
        """Register an outgoing link that just connected; returns the
        patterns it must announce now (later changes arrive as calls)."""
        self.interest.listeners.append(link)
        return self.interest.patterns(link.kind)

    def remove_link(self, link: LinkListener) -> None:
        """Forget a link that went down; nobody waits for its confirmations."""
        if link in self.interest.listeners:
            self.interest.listeners.remove(link)
        for pattern in list(self.interest.pending):
            self.link_confirmed(pattern, link)

    def link_confirmed(self, pattern: bytes, link: LinkListener) -> None:
        """A link's peer confirmed ``pattern``; release subscribers waiting on it."""
        pending = self.interest.pending.get(pattern)
        if pending is None:
            return
        pending.links.discard(link)
        if pending.links:
            return
        del self.interest.pending[pattern]
        for waiter in pending.waiters:
            if isinstance(waiter, Subscription):
                self.confirm(waiter)

    # --- publishing --------------------------------------------------------

    def encode(self, runs: Iterable[Run], stamp_ts_broker: bool) -> list[EncodedRun]:
        """Turn decoded runs into forwardable chunks (one copy per run: of
        the chunk the run arrived as, or of a fresh encoding)."""
        ts_broker = self._clock() if stamp_ts_broker else 0
        return [EncodedRun(run.key, run.count, forward_chunk(run, ts_broker)) for run in runs]

    def _route(self, key: bytes, source: LinkKind) -> tuple[Receiver, ...]:
        """Subscriptions a run from ``source`` reaches (routes.find_route), as
        the one tuple shared by every key with that route."""
        found = find_route(self._index, self._groups, self.durable_keys, key, source)
        return self._routes.intern(found)

    def publish(
        self,
        runs: Iterable[EncodedRun],
        origin: Outlet | None = None,
        stream: int = 0,
        source: LinkKind = LinkKind.CLIENT,
    ) -> int:
        """Fan runs out to every matching subscription, in order, never
        waiting; returns the messages published (the runs with valid keys).

        ``source`` says where the runs came from: a client, or a peer router's
        link (whose runs reach only the subscriptions one hop allows).
        A run with an invalid key is skipped and answered with a stream Error
        to ``origin`` (the publishing connection), which stays up; on publish
        stream 0 the error is a connection error and routing stops there.
        """
        from_peer = source is not LinkKind.CLIENT
        if self._routes.generation != self._index.generation:
            self._clear_routes()
        routes = self._routes.by_source[source]
        # A peer's runs are counted by the worker they came from.
        topics = None if from_peer else self.topics.table
        runs = runs if isinstance(runs, list) else list(runs)
        end = len(runs)
        published_runs = published_messages = unrouted = 0
        position = 0
        while True:
            # Runs with cached routes and tracked topics, in batches (fan_out).
            position, walked_runs, walked_messages, walked_unrouted = fan_out(
                runs, position, routes, topics, self.topics.passed
            )
            published_runs += walked_runs
            published_messages += walked_messages
            unrouted += walked_unrouted
            if position >= end:
                break
            # The one run fan_out stopped at: route its key, start counting it.
            run = runs[position]
            position += 1
            key = run.key
            subscriptions = routes.get(key)
            if subscriptions is None:
                try:
                    subscriptions = self._route(key, source)
                except RemoteProtocolError as exc:
                    # Rejected, not published: counting it would leave messages
                    # that are neither delivered, dropped nor queued.
                    if origin is None:
                        continue
                    stream_error(origin, stream, exc)
                    if stream == 0:
                        break
                    continue
                self._routes.remember(source, key, subscriptions)
            count = run.count
            size = len(run.chunk)
            if topics is not None:
                self.topics.count(key, count, size)
            published_runs += 1
            published_messages += count
            if not subscriptions:
                unrouted += count
            for subscription in subscriptions:
                subscription.push_many([run], count, size)
        counters = self.counters
        counters.published_runs += published_runs
        counters.published_messages += published_messages
        counters.dropped_no_subscriber += unrouted
        if from_peer:
            counters.from_links += published_messages
        return published_messages

    def wanted(self, keys: list[bytes]) -> list[bool] | None:
        """Whether a client's run on each of ``keys`` would reach any
        subscription (the route ``publish`` would use, cached the same way),
        or None when none would: one C-level pass over the cache for the
        usual answer. A durable topic's owner builds a stored run's chunk
        only for a wanted key and counts the others with ``count_unrouted``
        (broky.durable.owner)."""
        if self._routes.generation != self._index.generation:
            self._clear_routes()
        routes = self._routes.by_source[LinkKind.CLIENT]
        found = list(map(routes.get, keys))
        if None not in found and not any(found):
            return None
        wanted = [
            bool(subscriptions) if subscriptions is not None else self._client_route(key)
            for key, subscriptions in zip(keys, found, strict=True)
        ]
        return wanted if any(wanted) else None

    def _client_route(self, key: bytes) -> bool:
        """Route a client's key into the cache; whether it is wanted (an
        invalid key is, so that ``publish`` answers it as it answers any)."""
        try:
            subscriptions = self._route(key, LinkKind.CLIENT)
        except RemoteProtocolError:
            return True
        self._routes.remember(LinkKind.CLIENT, key, subscriptions)
        return bool(subscriptions)

    def count_unrouted(self, runs: Sequence[Run]) -> None:
        """Count stored runs no subscription wanted (``wanted``), whose
        chunks the caller did not build, as ``publish`` counts such runs:
        published, dropped for want of a subscriber, and in the busiest
        keys' figures by their durable chunks' lengths, where a key not
        tracked yet is admitted once in ``ADMIT_EVERY`` runs as ``fan_out``
        does (``publish`` also admits a key on its first route: within the
        figures' stated accuracy, broky.observability.topics). The loop is
        broky.router.unrouted's, compiled where it is built."""
        topics = self.topics
        messages = count_unrouted(runs, topics.table, topics.passed, topics.count)
        counters = self.counters
        counters.published_runs += len(runs)
        counters.published_messages += messages
        counters.dropped_no_subscriber += messages

    def publish_to_group(self, runs: list[EncodedRun], interest: bytes, source: LinkKind) -> int:
        """Hand runs a peer router chose this router for, on the queue group
        ``interest`` names (``interest_key``), to one local member; returns
        the messages published. Nothing else receives them: the peer routed
        the plain interest separately. With no member left (it left while
        the runs crossed) they count as dropped for want of a subscriber."""
        messages = size = 0
        for run in runs:
            messages += run.count
            size += len(run.chunk)
        counters = self.counters
        counters.published_runs += len(runs)
        counters.published_messages += messages
        counters.from_links += messages
        pattern, queue = split_interest(interest)
        group = self._groups.view(pattern, queue, source)
        if group is None or not group.members:
            counters.dropped_no_subscriber += messages
        else:
            group.push_many(runs, messages, size)  # dealt out as a local batch is
        return messages

    def run_direct_writes(self) -> None:
        """Make the direct writes queued since the last call (see ``direct_writes``)."""
        writes, self.direct_writes = self.direct_writes, []
        for write in writes:
            write()

    # --- introspection -----------------------------------------------------

    def has_subscribers(self, key: bytes) -> bool:
        """Whether a run on ``key`` would reach any subscription (a cached
        match): the broker's own optional traffic ($SYS) is only built and
        published when someone listens, so it never shows up as drops."""
        return bool(self._index.match(key))

    def statistics(self) -> RouterStatistics:
        """A consistent snapshot (the router is single-threaded)."""
        return router_statistics(self.counters, self._outlets, self._index, self.topics)
