"""Outgoing router links: how runs published on one router reach another.

A link is an ordinary protocol connection from this router to a peer router,
with ``Hello.link`` set. Over it, this router *subscribes on the peer* to
the patterns its own side wants (see ``broky.router.interest``); the peer's
router then treats the link like a subscriber, forwarding each matching run
once, and this side hands every run it receives to its own router with
``source`` set to the link's kind, so it goes one hop and no further.

One abstraction, any transport: ``connect`` returns a trio Stream, a pipe
for routers sharing a process, a Unix socket between worker processes, TCP
between nodes, TLS between nodes when ``cluster_tls_*`` is set (see
``tls_connector``). A link is up once the peer's Welcome arrives, so a peer
that refuses it (a TLS 1.3 server rejects a client certificate only after the
client's handshake ends) never brings it up. A link reconnects with
exponential backoff and re-announces its interest each time; while it is
down, nothing waits for it.
"""

from __future__ import annotations

import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Final

import attrs
import trio

from broky.mesh.outgoing import OutgoingFrames
from broky.protocol.codec import encode_frame
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    ErrorCode,
    LinkKind,
    SlowConsumerPolicy,
)
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import (
    Deliver,
    EncodedRun,
    Error,
    ForwardPublish,
    Frame,
    Hello,
    Notice,
    Ping,
    Pong,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Welcome,
)
from broky.router.queues import split_interest
from broky.router.relief import yield_to_subscribers
from broky.router.router import Router
from broky.security.tls import client_handshake

log = logging.getLogger("broky.link")

#: First and largest pause between reconnection attempts. Short enough that a
#: restarted worker is rejoined within a fraction of a second, capped so that
#: a dead node costs one connection attempt every few seconds.
INITIAL_BACKOFF: Final = 0.05
MAX_BACKOFF: Final = 2.0
#: A session that lasted this long resets the backoff.
STABLE_SESSION: Final = 5.0
RECEIVE_BYTES: Final = 256 * 1024

Connector = Callable[[], Awaitable[trio.abc.Stream]]


class LinkHandshakeError(Exception):
    """The peer answered, but the TLS handshake failed or the peer refused this
    node's certificate: an operator has certificates to fix. Unlike a peer
    that is down (logged at debug, it will come back), this is a warning."""


def _tls_failure(cause: BaseException | None) -> str:
    return (
        f"TLS handshake failed ({cause}): every node needs a cluster_tls_cert signed by "
        "the CA in the others' cluster_tls_ca, naming the host given in their peers"
    )


def tls_connector(
    connect: Connector, context: ssl.SSLContext, host: str, timeout: float
) -> Connector:
    """``connect``, then a TLS handshake within ``timeout`` that checks the
    peer's certificate against ``host`` (a DNS name or an IP address, as given
    in ``peers``). It runs in the link's own task, like every connect."""

    async def connect_tls() -> trio.abc.Stream:
        stream = await connect()
        try:
            with trio.fail_after(timeout):
                return await client_handshake(stream, context, host)
        except trio.TooSlowError:
            raise LinkHandshakeError(
                f"TLS handshake not completed within {timeout} s: is that a cluster port?"
            ) from None
        except trio.BrokenResourceError as exc:
            raise LinkHandshakeError(_tls_failure(exc.__cause__)) from exc

    return connect_tls


@attrs.frozen
class LinkStatus:
    """A snapshot of one outgoing link, for statistics and metrics."""

    name: str
    kind: str
    connected: bool
    connects: int
    disconnects: int
    received_runs: int
    received_messages: int
    dropped_by_peer: int
    announced_patterns: int


@attrs.define(slots=True, eq=False)
class LinkCounters:
    """What one outgoing link has seen (the receiving side of the link)."""

    connects: int = 0
    disconnects: int = 0
    received_runs: int = 0
    received_messages: int = 0
    dropped_by_peer: int = 0


class Link:
    """Keep a link to one peer router up and route what it delivers."""

    def __init__(
        self,
        router: Router,
        kind: LinkKind,
        connect: Connector,
        name: str,
        node_id: str = "",
        token: str = "",
        workers: int = 0,
    ) -> None:
        if kind is LinkKind.CLIENT:
            raise ValueError("a link is LOCAL or CLUSTER")
        self._router = router
        self._kind = kind
        self._connect = connect
        self.name = name
        self._node_id = node_id
        #: Presented in the Hello to a peer that authenticates (cluster_token).
        self._token = token
        #: This node's worker count, announced on cluster links (0: unknown).
        self._workers = workers
        self.counters = LinkCounters()
        self.connected = False
        self._stream_ids = itertools.count(1)
        self._streams: dict[bytes, int] = {}
        self._patterns: dict[int, bytes] = {}
        #: The streams announcing queue-group interest, to their interest keys.
        self._group_streams: dict[int, bytes] = {}
        #: Frames for the peer and the writer task sending them (broky.mesh.outgoing).
        self._outgoing = OutgoingFrames()
        self.ready = trio.Event()  # set once the first session has announced its interest
        self._last_refusal = ""

    @property
    def kind(self) -> LinkKind:
        """LOCAL or CLUSTER."""
        return self._kind

    def status(self) -> LinkStatus:
        """Counters and state of this link."""
        counters = self.counters
        return LinkStatus(
            name=self.name,
            kind=self._kind.name.lower(),
            connected=self.connected,
            connects=counters.connects,
            disconnects=counters.disconnects,
            received_runs=counters.received_runs,
            received_messages=counters.received_messages,
            dropped_by_peer=counters.dropped_by_peer,
            announced_patterns=len(self._streams),
        )

    # --- LinkListener: called by the router --------------------------------------

    def interest_added(self, pattern: bytes) -> bool:
        if not self.connected:
            return False
        stream = next(self._stream_ids)
        self._streams[pattern] = stream
        self._patterns[stream] = pattern
        # ``pattern`` is an interest key: a queue group's has its own stream,
        # on which the peer sends only the runs it chose this side for.
        topic_pattern, queue = split_interest(pattern)
        if queue:
            self._group_streams[stream] = pattern
        self._send(Subscribe(stream, topic_pattern, SlowConsumerPolicy.DROP, 0, queue=queue))
        return True

    def interest_removed(self, pattern: bytes) -> None:
        stream = self._streams.pop(pattern, None)
        if stream is not None:
            del self._patterns[stream]
            self._group_streams.pop(stream, None)
            if self.connected:
                self._send(Unsubscribe(stream))

    # --- the connection ------------------------------------------------------------

    def _send(self, frame: Frame) -> None:
        self._outgoing.put(encode_frame(frame))

    async def run(self) -> None:
        """Connect, serve, reconnect: until cancelled."""
        backoff = INITIAL_BACKOFF
        while True:
            try:
                stream = await self._connect()
            except LinkHandshakeError as exc:
                self._refused(exc)
            except OSError as exc:
                log.debug("link %s: connect failed: %s", self.name, exc)
            else:
                started = trio.current_time()
                try:
                    await self._session(stream)
                except* LinkHandshakeError as group:
                    self._refused(group.exceptions[0])
                except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
                    log.warning("link %s: connection lost: %s", self.name, group.exceptions[0])
                except* RemoteProtocolError as group:
                    log.warning("link %s: protocol error: %s", self.name, group.exceptions[0])
                finally:
                    self._down()
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        await stream.aclose()
                if trio.current_time() - started > STABLE_SESSION:
                    backoff = INITIAL_BACKOFF
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _refused(self, error: BaseException) -> None:
        """Log a refused handshake: a warning, but once per distinct error, as
        the link keeps retrying every MAX_BACKOFF seconds until it is fixed."""
        message = str(error)
        level = logging.DEBUG if message == self._last_refusal else logging.WARNING
        self._last_refusal = message
        log.log(level, "link %s: refused: %s", self.name, message)

    def _down(self) -> None:
        if self.connected:
            self.connected = False
            self.counters.disconnects += 1
            self._router.remove_link(self)

    async def _session(self, stream: trio.abc.Stream) -> None:
        machine = ProtocolMachine(Role.CLIENT, DEFAULT_MAX_FRAME_BYTES)
        self._streams.clear()
        self._patterns.clear()
        self._group_streams.clear()
        self._outgoing.restart(
            [
                machine.initiate(),
                encode_frame(
                    Hello(
                        client_name=self.name,
                        link=self._kind,
                        node=self._node_id,
                        token=self._token,
                        workers=self._workers,
                    )
                ),
            ]
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._outgoing.write_to, stream)
            await self._reader(stream, machine)
            nursery.cancel_scope.cancel()

    def _up(self) -> None:
        """The peer welcomed the link: register it and announce our interest."""
        self.connected = True
        self._last_refusal = ""
        self.counters.connects += 1
        for pattern in self._router.add_link(self):
            self.interest_added(pattern)
        log.info("link %s: connected (%s)", self.name, self._kind.name.lower())
        self.ready.set()

    async def _receive(self, stream: trio.abc.Stream) -> bytes | bytearray:
        try:
            data = await stream.receive_some(RECEIVE_BYTES)
        except trio.BrokenResourceError as exc:
            if not self.connected and isinstance(exc.__cause__, ssl.SSLError):
                # TLS 1.3: the peer's verdict on our certificate arrives here.
                raise LinkHandshakeError(_tls_failure(exc.__cause__)) from exc
            raise
        if not data:
            raise trio.BrokenResourceError("the peer closed the link")
        return data

    def _delivered(self, stream: int, runs: list[EncodedRun]) -> None:
        """Route runs the peer delivered on ``stream``: for plain interest
        by key, on a queue group's stream to one member of the group."""
        counters = self.counters
        counters.received_runs += len(runs)
        groups = self._group_streams
        group = groups.get(stream) if groups else None
        if group is None:
            counters.received_messages += self._router.publish(runs, source=self._kind)
        else:
            counters.received_messages += self._router.publish_to_group(runs, group, self._kind)

    async def _reader(self, stream: trio.abc.Stream, machine: ProtocolMachine) -> None:
        router = self._router
        counters = self.counters
        pressure = router.pressure
        while True:
            if pressure.outlets:
                # As a client connection's reader does: a subscriber that
                # drains gets the loop; the peer router's writer waits (and
                # its own readers pause in turn), nothing is dropped. Never
                # for a link back to a worker, which may be waiting for us.
                await yield_to_subscribers(pressure, local_links=False)
            data = await self._receive(stream)
            for frame in machine.receive_forwarding(data):
                if type(frame) is ForwardPublish:
                    # Another router's Deliver frames, read as forwardable chunks.
                    self._delivered(frame.stream, frame.runs)
                elif type(frame) is Deliver:
                    self._delivered(frame.stream, router.encode(frame.runs, False))
                elif type(frame) is Subscribed:
                    pattern = self._patterns.get(frame.stream)
                    if pattern is not None:
                        router.link_confirmed(pattern, self)
                elif type(frame) is Welcome:
                    self._up()
                elif type(frame) is Ping:
                    self._send(Pong(frame.nonce))
                elif type(frame) is Notice:
                    counters.dropped_by_peer += frame.count
                    log.warning("link %s: the peer dropped %d messages", self.name, frame.count)
                elif type(frame) is Error:
                    if frame.stream == 0 and frame.code is ErrorCode.SERVER_SHUTDOWN:
                        log.info("link %s: the peer is shutting down", self.name)
                        return
                    if frame.stream == 0:
                        raise trio.BrokenResourceError(f"peer error: {frame.message}")
                    log.warning("link %s: stream %d: %s", self.name, frame.stream, frame.message)
