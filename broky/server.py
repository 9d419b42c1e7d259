"""The broker: listeners, connection tasks and the router, in one trio nursery.

Embed it with ``address = await nursery.start(broker.serve)``; connect
in-process with ``async with broker.connect() as client``. Cancelling
``serve`` shuts down gracefully: listeners close, every connection gets an
Error(ServerShutdown) frame, and connections still open after
``SHUTDOWN_GRACE`` seconds are cut.
"""

from __future__ import annotations

import logging
import socket
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Final

import attrs
import trio

from broky.client.client import Client
from broky.client.credentials import Credentials
from broky.config import Config, is_loopback
from broky.connection.handler import ServerConnection
from broky.connection.inproc import pipe_pair
from broky.connection.peer import describe_peer
from broky.connection.settings import ConnectionCounters
from broky.durable.forwarding import Forwarder
from broky.durable.owner_channel import OwnerChannel
from broky.durable.store import DurableStatistics, DurableStore
from broky.mesh.link import Connector, Link, LinkStatus
from broky.observability.service import Observability
from broky.observability.system import Advisory
from broky.protocol.constants import ErrorCode, LinkKind
from broky.reload import applicable
from broky.replication.events import ReplicationStatistics
from broky.router.router import Router
from broky.router.statistics import RouterStatistics
from broky.security.auth import Authenticator
from broky.security.quotas import QuotaLedger
from broky.security.renewal import CertificateRenewal
from broky.subscriptions.service import SubscriptionService
from broky.subscriptions.watch import SubscriptionStatus

log = logging.getLogger("broky.server")

#: Seconds connections get to flush and close when the broker stops.
SHUTDOWN_GRACE: Final = 2.0


@attrs.frozen
class BrokerStatistics:
    """A snapshot of the broker: its router and its connections."""

    router: RouterStatistics
    connections_opened: int
    connections_current: int
    connections_closed: dict[str, int]
    bytes_received: int
    bytes_sent: int
    links: tuple[LinkStatus, ...] = ()
    #: Durable topics' totals (None: no durable topics configured).
    durable: DurableStatistics | None = None
    #: Durable subscriptions served by this worker.
    subscriptions: tuple[SubscriptionStatus, ...] = ()
    #: A cluster member's replication (None: not replicating).
    replication: ReplicationStatistics | None = None


class Broker:
    """An in-memory broker. One instance serves one router (one worker).

    ``client_listeners`` replaces the TCP listener the config describes (a
    worker process brings its own SO_REUSEPORT socket); ``link_listeners``
    accept peer routers' links (a Unix socket between workers, a cluster
    port between nodes). Every listener serves the same protocol: a
    connection's Hello says whether it is a client or a link.
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        node_id: str | None = None,
        client_listeners: Sequence[trio.abc.Listener[trio.abc.Stream]] | None = None,
        link_listeners: Sequence[trio.abc.Listener[trio.abc.Stream]] = (),
        worker: int = 0,
        workers: int = 0,
    ) -> None:
        self.config = config or Config()
        #: The node's worker count when this broker is one of ``broky serve``'s
        #: workers (0: embedded, unknown): cluster links announce and check it.
        self.workers = workers
        self._settings = attrs.evolve(self.config.connection_settings, workers=workers)
        self.router = Router(self.config.router_limits)
        self.router.node_id = node_id or uuid.uuid4().hex[:12]
        #: The durable topics' logs and owners (None: every key is ephemeral).
        self.store = (
            DurableStore(
                self.config.data_dir,
                self.config.durable,
                self.router,
                worker=worker,
                workers=max(workers, 1),
            )
            if self.config.durable
            else None
        )
        #: Channels to the workers owning the partitions this one does not
        #: (None: one worker, or no durable topics). See broky.durable.forwarding.
        self.forwarder: Forwarder | None = None
        if self.store is not None and workers > 1:
            store = self.store
            self.forwarder = Forwarder(
                self.router, worker, store.owner_index, self.config.max_frame_bytes
            )
            store.forward = self.forwarder.append
            self.router.durable_keys = lambda key: store.match(key) is not None
        #: TLS contexts whose certificate a reload loads again.
        self._certificates = CertificateRenewal()
        peer_tls = self.config.peer_client_context()
        if peer_tls is not None:
            self.renews(*peer_tls)
        #: The durable subscriptions of the partitions this worker owns.
        self.subscriptions = (
            SubscriptionService(
                self.store,
                self._advise,
                Credentials(token=self.config.cluster_token),
                peer_tls[0] if peer_tls is not None else None,
            )
            if self.store is not None
            else None
        )
        self._channels: list[OwnerChannel] = []
        #: Services started once the durable topics are open and stopped
        #: before they close (a cluster member's replication: broky.replication).
        self.beside_store: list[Callable[..., Awaitable[None]]] = []
        #: Set by a replicating member (broky.cli): its figures for metrics.
        self.replication_statistics: Callable[[], ReplicationStatistics] | None = None
        self._client_listeners = client_listeners
        self._tls = self.config.tls_context()
        if self._tls is not None:
            self.renews(self._tls, "tls")
        #: Checks credentials of connections from the network (see _serve_stream).
        self.authenticator = Authenticator(self.config.users, self.config.allow_anonymous)
        #: The cluster listener's TLS context (see add_link_listeners).
        self._cluster_tls: ssl.SSLContext | None = None
        #: Each principal's connections and byte-rate bucket on this worker.
        self.quotas = QuotaLedger()
        self._link_listeners = list(link_listeners)
        self._links: list[Link] = []
        self._link_nursery: trio.Nursery | None = None
        self.counters = ConnectionCounters()
        self._connections: dict[ServerConnection, trio.CancelScope] = {}
        self._connection_nursery: trio.Nursery | None = None
        self._all_closed = trio.Event()
        self.address: tuple[str, int] | None = None
        self.observability = Observability(
            self.config,
            self.router,
            self.statistics,
            lambda: list(self._connections),
            worker=str(worker),
        )

    async def serve(
        self, *, task_status: trio.TaskStatus[tuple[str, int] | None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until cancelled; reports the bound (host, port), or None when
        ``config.listen`` is false (in-process clients only)."""
        # Bound before any nursery opens, so that a taken port is a plain OSError.
        if self._client_listeners is not None:
            listeners = list(self._client_listeners)
        elif self.config.listen:
            listeners = list(await trio.open_tcp_listeners(self.config.port, host=self.config.host))
        else:
            listeners = []
        async with trio.open_nursery() as storage:
            if self.store is not None:
                # Opened (and recovered) before the first connection; closed
                # after the last one, when this nursery is cancelled below.
                await storage.start(self.store.run)
                for service in self.beside_store:
                    await storage.start(service)
            if self.subscriptions is not None:
                # After the logs (it reads them), before the first connection.
                await storage.start(self.subscriptions.run)
            try:
                await self._serve(listeners, task_status)
            finally:
                storage.cancel_scope.cancel()

    async def _serve(
        self,
        listeners: list[trio.abc.Listener[trio.abc.Stream]],
        task_status: trio.TaskStatus[tuple[str, int] | None],
    ) -> None:
        async with trio.open_nursery() as connections:
            self._connection_nursery = connections
            try:
                async with trio.open_nursery() as acceptors:
                    if listeners:
                        sockname = listeners[0].socket.getsockname()  # type: ignore[attr-defined]
                        self.address = (sockname[0], sockname[1])
                        log.info(
                            "broky listening on %s:%d%s",
                            *self.address,
                            " (TLS)" if self._tls is not None else "",
                        )
                        if (
                            self.config.users
                            and self._tls is None
                            and not is_loopback(self.address[0])
                        ):
                            log.warning(
                                "passwords and tokens reach %s:%d in clear text: set tls_cert "
                                "and tls_key (docs/security.md)",
                                *self.address,
                            )
                    if self._tls is not None:
                        # The handshake happens in each connection's task
                        # (ServerConnection.run), never in the accept loop.
                        tls = self._tls
                        listeners = [trio.SSLListener(listener, tls) for listener in listeners]
                    if listeners or self._link_listeners:
                        await acceptors.start(
                            partial(
                                trio.serve_listeners,
                                self._serve_stream,
                                [*listeners, *self._link_listeners],
                                handler_nursery=connections,
                            )
                        )
                    self._link_nursery = acceptors
                    for link in self._links:
                        acceptors.start_soon(link.run)
                    for channel in self._channels:
                        acceptors.start_soon(channel.run)
                    await acceptors.start(self.observability.run)
                    task_status.started(self.address)
                    await trio.sleep_forever()
            finally:
                self._connection_nursery = None
                self._link_nursery = None
                # Connection tasks are shielded (see _serve_stream): tell each
                # why it closes, give them SHUTDOWN_GRACE, then cut the rest.
                with trio.CancelScope(shield=True):
                    for connection in list(self._connections):
                        connection.shutdown()
                    with trio.move_on_after(SHUTDOWN_GRACE):
                        while self._connections:
                            await self._all_closed.wait()
                for scope in self._connections.values():
                    scope.cancel()

    async def _serve_stream(self, stream: trio.abc.Stream) -> None:
        # Shielded so that a cancelled serve() does not kill the connection
        # before it has sent Error(ServerShutdown); serve() cancels the scope
        # once the grace period is over.
        with trio.CancelScope(shield=True) as scope:
            # Links between workers and in-process clients are neither
            # authenticated nor counted against max_connections.
            trusted = is_private(stream)
            # Only certificates verified against tls_client_ca name users;
            # a cluster listener's streams carry another context.
            client_tls = isinstance(stream, trio.SSLStream) and stream.context is self._tls
            names = self.config.cluster_tls_names
            node_names = (
                frozenset(names)
                if names
                and isinstance(stream, trio.SSLStream)
                and stream.context is self._cluster_tls
                else None
            )
            connection = ServerConnection(
                stream,
                self.router,
                self._settings,
                self.counters,
                describe_peer(stream),
                self.store,
                self.authenticator,
                trusted=trusted,
                map_certificate=client_tls,
                node_names=node_names,
                quotas=self.quotas,
                forwarder=self.forwarder,
                subscriptions=self.subscriptions,
            )
            limit = self.config.max_connections
            if not trusted and len(self._connections) >= limit:
                # Refused after its Hello is read, so the client reads the
                # reason instead of a reset.
                connection.refusal = (
                    ErrorCode.LIMIT_EXCEEDED,
                    f"the broker serves at most {limit} connections (max_connections); "
                    "try again later",
                )
            self._connections[connection] = scope
            if self._all_closed.is_set():
                self._all_closed = trio.Event()
            if self._connection_nursery is None:
                connection.shutdown()  # accepted just as the broker began to stop
            try:
                await connection.run()
            finally:
                del self._connections[connection]
                self.observability.connection_closed(connection)
                if not self._connections:
                    self._all_closed.set()

    @asynccontextmanager
    async def connect(self, name: str = "in-process") -> AsyncIterator[Client]:
        """An in-process client: no TCP, same protocol, same router path."""
        nursery = self._connection_nursery
        if nursery is None:
            raise RuntimeError("the broker is not serving: start broker.serve first")
        client_end, broker_end = pipe_pair()
        nursery.start_soon(self._serve_stream, broker_end)
        async with Client.over(client_end, name=name) as client:
            yield client

    def add_link_listeners(
        self,
        listeners: Sequence[trio.abc.Listener[trio.abc.Stream]],
        cluster_tls: ssl.SSLContext | None = None,
    ) -> None:
        """More listeners for peer routers' links; before ``serve`` only.
        ``cluster_tls``: their TLS context, whose peers ``cluster_tls_names``
        restricts (the cluster listener's)."""
        if self._connection_nursery is not None:
            raise RuntimeError("link listeners are added before the broker serves")
        self._link_listeners.extend(listeners)
        if cluster_tls is not None:
            self._cluster_tls = cluster_tls

    def add_link(self, kind: LinkKind, connect: Connector, name: str) -> Link:
        """Keep a link to a peer router (reconnecting), starting now if serving.

        Cluster links present ``config.cluster_token`` to the peer (links
        between workers and in-process links need none: see ``is_private``).
        """
        cluster = kind is LinkKind.CLUSTER
        token = self.config.cluster_token if cluster else ""
        link = Link(
            self.router,
            kind,
            connect,
            name,
            self.router.node_id,
            token,
            self.workers if cluster else 0,
        )
        self._links.append(link)
        if self._link_nursery is not None:
            self._link_nursery.start_soon(link.run)
        return link

    def add_owner_channel(self, owner: int, connect: Connector, name: str) -> OwnerChannel:
        """Keep a channel to worker ``owner`` for its durable partitions
        (reconnecting); before ``serve`` only. Needs durable topics and
        ``workers`` > 1."""
        if self.forwarder is None:
            raise RuntimeError("owner channels need durable topics and more than one worker")
        if self._connection_nursery is not None:
            raise RuntimeError("owner channels are added before the broker serves")
        channel = self.forwarder.add_channel(owner, connect, name)
        self._channels.append(channel)
        return channel

    def link_to(self, peer: Broker, kind: LinkKind = LinkKind.LOCAL) -> Link:
        """An in-process link that brings ``peer``'s traffic to this broker's
        subscribers: routers sharing a process (tests, embedding). Link both
        ways for a two-router mesh."""

        async def connect() -> trio.abc.Stream:
            nursery = peer._connection_nursery
            if nursery is None:
                raise OSError("the peer broker is not serving")
            near, far = pipe_pair()
            nursery.start_soon(peer._serve_stream, far)
            return near

        return self.add_link(kind, connect, f"in-process:{peer.router.node_id}")

    def adopt(self, stream: trio.abc.Stream) -> None:
        """Serve a connection accepted elsewhere (a supervisor's hand-off)."""
        nursery = self._connection_nursery
        if nursery is None:
            raise RuntimeError("the broker is not serving")
        if self._tls is not None:
            stream = trio.SSLStream(stream, self._tls, server_side=True)
        nursery.start_soon(self._serve_stream, stream)

    def reload(self, config: Config) -> None:
        """Apply a re-read configuration's users and ``allow_anonymous``, and
        load the TLS certificates again (see broky.reload; other settings wait
        for a restart). ConfigError if the users would leave a non-loopback
        listener without authentication.

        New logins are checked against the new users at once, and so is
        every live connection: a principal that may stay gets its new
        permissions (subscriptions they no longer allow are closed), one
        that may not is disconnected (ServerConnection.reauthorize).
        """
        # Validated against this broker's listeners (the exposure rule) first:
        # a ConfigError leaves everything as it was.
        updated = attrs.evolve(self.config, **applicable(self.config, config))
        previous = self.authenticator
        self.authenticator = Authenticator(
            config.users, config.allow_anonymous, logins=previous.logins
        )
        self.config = updated
        renewed = self._certificates.renew(self.config)
        revoked = ended = 0
        for connection in list(self._connections):
            outcome = connection.reauthorize(self.authenticator, previous)
            if outcome < 0:
                revoked += 1
            else:
                ended += outcome
        self.observability.config_reloaded(
            {
                "users": len(updated.users),
                "allow_anonymous": self.authenticator.allow_anonymous,
                "connections_revoked": revoked,
                "subscriptions_ended": ended,
                "certificates": renewed,
            }
        )

    def renews(self, context: ssl.SSLContext, prefix: str) -> None:
        """Have ``reload`` load ``{prefix}_cert`` and ``{prefix}_key`` into
        ``context`` again: renewed certificates serve new handshakes, and
        connections already up keep theirs."""
        self._certificates.add(context, prefix)

    def _advise(self, kind: str, payload: dict[str, Any]) -> None:
        self.observability.system.advise(Advisory(kind), payload)

    def statistics(self) -> BrokerStatistics:
        """Router and connection figures, for metrics and tests."""
        counters = self.counters
        return BrokerStatistics(
            router=self.router.statistics(),
            connections_opened=counters.opened,
            connections_current=counters.current,
            connections_closed={reason.value: n for reason, n in counters.closed.items()},
            bytes_received=counters.bytes_received,
            bytes_sent=counters.bytes_sent,
            links=tuple(link.status() for link in self._links),
            durable=self._durable_statistics(),
            subscriptions=tuple(self.subscriptions.statistics())
            if self.subscriptions is not None
            else (),
            replication=None
            if self.replication_statistics is None
            else self.replication_statistics(),
        )

    def _durable_statistics(self) -> DurableStatistics | None:
        if self.store is None:
            return None
        statistics = self.store.statistics()
        if self.forwarder is not None:
            statistics = attrs.evolve(
                statistics, forwarded_messages=self.forwarder.forwarded_messages
            )
        return statistics


def is_private(stream: trio.abc.Stream) -> bool:
    """Whether a connection comes from inside this node and needs no credentials.

    In-process pipes (embedding apps, in-process links) and Unix sockets
    (worker links, in a 0700 directory of the supervisor's) are trusted: who
    can reach them can already read the process's memory or files. Anything
    arriving over TCP, TLS or not, authenticates.
    """
    transport = getattr(stream, "transport_stream", stream)
    sock = getattr(transport, "socket", None)
    if sock is None:
        return not isinstance(stream, trio.SSLStream)
    return bool(sock.family == socket.AF_UNIX)
