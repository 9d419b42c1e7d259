"""A durable-subscription consumer of a replicated cluster that follows its leaders.

In a replicated cluster a partition's subscriptions are served by its leader
only (docs/subscription-replication.md): a node answers a ``Consume`` for
the partitions it leads and refuses with ``NotLeader`` (naming each
partition's leader when it knows it) when it leads none of them; a deposed
leader ends its consumers with ``NotLeader``. ``ClusterConsumer`` does what
an application otherwise does by hand:

- it attaches one consumer on every node it knows (the seeds, and every
  leader a refusal names) and keeps those that are accepted: between them
  they serve every partition that has a leader;
- when one of them ends (its node died or was deposed: ``NotLeader``, a
  lost connection, a node that stops answering: see below), it leaves them
  all (each flushing its acks first, bounded) and attaches again everywhere, with a
  short backoff while no node accepts (an election takes about a lease
  TTL), for at most ``retry_for`` seconds, then raises the last error;
- after such a failover it attaches everywhere once more ``REFRESH_AFTER``
  seconds later: a node that already served some partitions may have taken
  the lead of others since, and only a new attach serves those.

A node that stops answering while its connection stays open (SIGSTOPped,
swapping, its host gone without a reset) sends no error and no EOF: a
consumer on it would wait for ever while its partitions fail over to other
nodes. So every node it reads from is pinged each ``node_timeout / 3``
seconds (at least ``MIN_PING_INTERVAL`` apart), and a ping unanswered for
``node_timeout`` seconds (default ``NODE_TIMEOUT``, 3 s) gives that
connection up (``Client.abort``, without waiting for the silent node to
take the last acks) and counts as that consumer ending: the node is noticed
within about 4/3 of ``node_timeout``. Keep ``node_timeout`` above the
longest pause a live node may take to answer (a ping waits behind the
deliveries already queued for the connection, which credit bounds), and
in the order of the lease TTL: the partitions need that long to fail over
anyway. Attaching has its own bound, ``ATTACH_TIMEOUT``.

The new leader serves the subscription from the state its followers copied
(cursor, acked ranges, delivery counts): what was acked with a receipt is
not delivered again, but for acks inside the replication window the
README states; what was unacked (or acked without receipt) comes again.

Deliveries are ``FollowedDelivery`` objects: settling one whose consumer
was left (a failover happened since) is not an error; the settle is
dropped, counted in ``lost_settles``, and the message comes again from the
new leader (at-least-once).
"""

from __future__ import annotations

import contextlib
import logging
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Final, Unpack

import attrs
import trio

from broky.client.client import Client
from broky.client.consumer import Consumer
from broky.client.consumer_options import ConsumerSettings, SubscriptionType
from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.delivery import Delivery
from broky.client.errors import BrokyError, ConnectionClosed
from broky.protocol.constants import ErrorCode
from broky.protocol.message import Message, Tags

log = logging.getLogger("broky.client")

#: Errors that end one node's consumer without ending the cluster consumer:
#: the partition moved, or the node is down or restarting.
FOLLOWED: Final = frozenset(
    {
        ErrorCode.NOT_LEADER,
        ErrorCode.OWNER_UNAVAILABLE,
        ErrorCode.SERVER_SHUTDOWN,
        ErrorCode.STORAGE_FAILURE,
        ErrorCode.INTERNAL,
    }
)
#: Seconds a connect and attach may take before the node is taken for
#: dead or paused (it is tried again at the next attach).
ATTACH_TIMEOUT: Final = 3.0
#: Default seconds a node may leave a ping unanswered before its connection
#: is given up (module docstring): a few times a loaded node's round trip,
#: and about the 3 s that connects and attaches are given.
NODE_TIMEOUT: Final = 3.0
#: Floor of the ping interval, so a tiny node_timeout cannot busy-ping.
MIN_PING_INTERVAL: Final = 0.01
#: Backoff between attaches while no node accepts; doubles up to the max
#: (a failover takes about a lease TTL, 1 s by default).
FIRST_BACKOFF: Final = 0.05
MAX_BACKOFF: Final = 0.5
#: Seconds after a failover before attaching everywhere again (module
#: docstring): past the lease TTL and election of the default settings.
REFRESH_AFTER: Final = 3.0
#: Deliveries handed from the node consumers to the application at a time;
#: each consumer's own credit window bounds what waits in it.
HANDOFF: Final = 0
_LEADER_ADDRESS = re.compile(r"leader \S+ at (\S+) \(epoch \d+\)")


class FollowedDelivery:
    """A ``Delivery`` whose settles survive a failover (module docstring)."""

    __slots__ = ("_followed", "delivery")

    def __init__(self, followed: ClusterConsumer, delivery: Delivery) -> None:
        self._followed = followed
        self.delivery = delivery

    @property
    def message(self) -> Message:
        return self.delivery.message

    @property
    def topic(self) -> str:
        return self.delivery.topic

    @property
    def delivery_count(self) -> int:
        return self.delivery.delivery_count

    @property
    def retry_count(self) -> int:
        return self.delivery.retry_count

    @property
    def key(self) -> str:
        return self.delivery.key

    @property
    def tags(self) -> Tags:
        return self.delivery.tags

    @property
    def payload(self) -> bytes:
        return self.delivery.payload

    @property
    def partition(self) -> int:
        return self.delivery.partition

    @property
    def offset(self) -> int:
        return self.delivery.offset

    async def ack(self) -> None:
        await self._settle(self.delivery.ack)

    async def nack(self, delay: float | None = None) -> None:
        await self._settle(partial(self.delivery.nack, delay))

    async def term(self, reason: str = "") -> None:
        await self._settle(partial(self.delivery.term, reason))

    async def in_progress(self) -> None:
        await self._settle(self.delivery.in_progress)

    async def _settle(self, settle: Callable[[], Awaitable[None]]) -> None:
        try:
            await settle()
        except BrokyError:
            # Its consumer was left in a failover: the new leader delivers
            # the message again.
            self._followed.lost_settles += 1

    def __repr__(self) -> str:
        return f"Followed{self.delivery!r}"


@attrs.define
class ClusterConsumerStatistics:
    """What a cluster consumer went through."""

    #: Rounds of attaching everywhere (1 without failovers).
    attaches: int = 0
    #: Nodes serving the subscription in the current round.
    serving: int = 0


class ClusterConsumer:
    """See the module docstring; open it with ``ClusterConsumer.open`` and
    iterate it with ``async for``."""

    def __init__(
        self,
        seeds: Sequence[str],
        pattern: str,
        subscription: str,
        type: SubscriptionType,
        retry_for: float,
        name: str,
        settings: ConsumerSettings,
        credentials: Credentials = ANONYMOUS,
        node_timeout: float = NODE_TIMEOUT,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if not seeds:
            raise ValueError("a cluster consumer needs at least one seed address")
        if not node_timeout > 0:
            raise ValueError(f"node_timeout must be positive seconds, not {node_timeout!r}")
        self.nodes = list(dict.fromkeys(seeds))
        self.pattern = pattern
        self.subscription = subscription
        self.type: SubscriptionType = type
        self.retry_for = retry_for
        self.name = name
        self.settings = settings
        #: Presented to every node it attaches on.
        self.credentials = credentials
        #: Seconds a node may leave a ping unanswered (module docstring).
        self.node_timeout = node_timeout
        #: TLS for every connection (None: plain TCP).
        self.ssl_context = ssl_context
        self.lost_settles = 0
        self.stats = ClusterConsumerStatistics()
        self._send, self._receive = trio.open_memory_channel[FollowedDelivery](HANDOFF)
        self._consumers: dict[str, Consumer] = {}
        self._error: BrokyError | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        seeds: Sequence[str],
        pattern: str,
        *,
        subscription: str,
        type: SubscriptionType = "shared",
        retry_for: float = 30.0,
        name: str = "",
        credentials: Credentials = ANONYMOUS,
        node_timeout: float = NODE_TIMEOUT,
        ssl_context: ssl.SSLContext | None = None,
        **settings: Unpack[ConsumerSettings],
    ) -> AsyncIterator[ClusterConsumer]:
        """Follow ``subscription`` of ``pattern`` from the ``seeds``.
        ``retry_for``: seconds without any node serving before iteration
        raises the last error. ``node_timeout``: seconds a node it reads
        from may leave a ping unanswered before it is taken for dead or
        paused (module docstring). ``credentials``: presented to every
        node. ``ssl_context``: TLS for every connection, checking each
        node's certificate against the host it dials (see
        ``broky.security.tls.client_context``). Wrong values raise
        ValueError at once."""
        followed = cls(
            seeds,
            pattern,
            subscription,
            type,
            retry_for,
            name,
            settings,
            credentials,
            node_timeout,
            ssl_context,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(followed._follow)
            try:
                yield followed
            finally:
                nursery.cancel_scope.cancel()

    def __aiter__(self) -> ClusterConsumer:
        return self

    async def __anext__(self) -> FollowedDelivery:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            if self._error is not None:
                raise self._error from None
            raise StopAsyncIteration from None

    async def flush(self) -> None:
        """Send the recorded settles of every serving node's consumer and
        wait for their receipts (``Consumer.flush``); a consumer left in a
        failover raises its error (its unreceipted acks may be lost)."""
        for consumer in list(self._consumers.values()):
            await consumer.flush()

    # --- following --------------------------------------------------------------------

    async def _follow(self) -> None:
        """Attach everywhere, again after each failover; the last error ends it."""
        try:
            refresh_at = float("inf")
            while True:
                ended = await self._attach_until_lost(refresh_at)
                refresh_at = trio.current_time() + REFRESH_AFTER if ended else float("inf")
        except BrokyError as exc:
            self._error = exc
            log.warning("cluster consumer of %r ended: %s", self.subscription, exc)
        finally:
            self._send.close()

    async def _attach_until_lost(self, refresh_at: float) -> bool:
        """One round: attach on every node, retrying while none accepts, until
        one of the accepted consumers ends (True) or ``refresh_at`` (False)."""
        deadline = trio.current_time() + self.retry_for
        backoff = FIRST_BACKOFF
        while True:
            self.stats.attaches += 1
            round_ = _Round(self)
            async with trio.open_nursery() as nursery:
                round_.nursery = nursery
                for address in list(self.nodes):
                    nursery.start_soon(round_.serve, address)
                await round_.settled.wait()
                if round_.accepted:
                    self.stats.serving = round_.accepted
                    with trio.move_on_at(refresh_at):
                        await round_.lost.wait()
                nursery.cancel_scope.cancel()
            self._consumers.clear()
            if round_.fatal is not None:
                raise round_.fatal
            if round_.accepted:
                return round_.lost.is_set()
            if trio.current_time() + backoff > deadline:
                raise round_.last_error or ConnectionClosed(
                    f"no node served subscription {self.subscription!r} within "
                    f"{self.retry_for} s (nodes tried: {', '.join(self.nodes)})"
                )
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _learn(self, message: str) -> None:
        """Add the leaders a NotLeader refusal names to the nodes tried."""
        for address in _LEADER_ADDRESS.findall(message):
            if address not in self.nodes:
                self.nodes.append(address)


class _Round:
    """One attach on every known node, and the consumers it got."""

    def __init__(self, followed: ClusterConsumer) -> None:
        self.followed = followed
        self.nursery: trio.Nursery | None = None
        self.pending = len(followed.nodes)
        self.accepted = 0
        self.settled = trio.Event()
        self.lost = trio.Event()
        self.last_error: BrokyError | None = None
        self.fatal: BrokyError | None = None

    def _answered(self) -> None:
        self.pending -= 1
        if self.pending <= 0:
            self.settled.set()

    async def serve(self, address: str) -> None:
        followed = self.followed
        attached = False
        with trio.CancelScope(deadline=trio.current_time() + ATTACH_TIMEOUT) as attaching:
            try:
                async with (
                    followed.credentials.connect(
                        address, followed.name, followed.ssl_context
                    ) as client,
                    client.consumer(
                        followed.pattern,
                        subscription=followed.subscription,
                        type=followed.type,
                        **followed.settings,
                    ) as consumer,
                ):
                    attaching.deadline = float("inf")
                    attached = True
                    self.accepted += 1
                    followed._consumers[address] = consumer
                    self._answered()
                    assert self.nursery is not None
                    self.nursery.start_soon(self._watch, client, address)
                    async for delivery in consumer:
                        await followed._send.send(FollowedDelivery(followed, delivery))
            except BrokyError as exc:
                if exc.code is ErrorCode.NOT_LEADER:
                    followed._learn(exc.reason)
                elif exc.code not in FOLLOWED and not isinstance(exc, ConnectionClosed):
                    self.fatal = exc
                    self.lost.set()
                self.last_error = exc
            except (OSError, trio.BrokenResourceError) as exc:
                self.last_error = ConnectionClosed(f"{address}: {exc}")
        if attaching.cancelled_caught and not attached:
            self.last_error = ConnectionClosed(
                f"{address} did not answer within {ATTACH_TIMEOUT} s"
            )
        if attached:
            followed._consumers.pop(address, None)
            self.lost.set()
        else:
            self._answered()

    async def _watch(self, client: Client, address: str) -> None:
        """Ping ``address`` until its connection closes; abort it if a ping
        goes unanswered for ``node_timeout`` (module docstring): its
        consumer then ends with ConnectionClosed, as with a lost connection."""
        timeout = self.followed.node_timeout
        interval = max(timeout / 3, MIN_PING_INTERVAL)
        while not client.closed:
            with trio.move_on_after(timeout) as waited:
                try:
                    await client.ping()
                except BrokyError:
                    return  # closed: its consumer has ended, or is ending
            if waited.cancelled_caught:
                log.warning("%s answered no ping within %s s: left", address, timeout)
                client.abort(f"{address} answered no ping within {timeout} s")
                return
            await trio.sleep(interval)
