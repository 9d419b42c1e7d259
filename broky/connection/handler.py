"""The broker side of one connection: a reader, a writer and a keepalive task.

The connection holds no routing state. The reader decodes whatever one
``receive_some`` returned and hands it to the router in order, one call per
frame (a Publish frame carries many runs); the writer drains the connection's
outlet into one ``send_all`` per batch; the keepalive task pings a quiet
client and enforces the idle timeout. Every close goes through
``_close_reason`` once: logged, counted, and (where the peer can still read)
announced with an Error frame.
"""

from __future__ import annotations

import logging
import os
import random
import select
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Final

import attrs
import trio

from broky.connection.consumers import ConsumerRequests
from broky.connection.durable_requests import DurableRequests
from broky.connection.reasons import CloseReason
from broky.durable.store import DurableStore
from broky.protocol.codec import encode_frame, u32_array
from broky.protocol.connection import ProtocolMachine, Role, State
from broky.protocol.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    MIN_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    ErrorCode,
    LinkKind,
)
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import (
    Consume,
    Error,
    Fetch,
    Flow,
    Frame,
    Hello,
    ListPartitions,
    Ping,
    Pong,
    Publish,
    Run,
    Settle,
    Subscribe,
    Unsubscribe,
    Welcome,
)
from broky.protocol.framing import foreign_preamble_reply
from broky.router.matcher import validate_pattern
from broky.router.outbox import Outlet
from broky.router.router import Router
from broky.security.acl import PublishGate
from broky.security.auth import FAILED, TRUSTED, AuthenticationFailed, Authenticator, Principal
from broky.security.identity import certificate_identities
from broky.security.quotas import QuotaLedger, TokenBucket
from broky.security.tls import send_pending_alert

log = logging.getLogger("broky.connection")

#: Bytes asked of the socket per read: big reads mean few syscalls per
#: message; 256 KiB is what a busy publisher's kernel buffer typically holds.
RECEIVE_BYTES: Final = 256 * 1024
#: How long a closing connection may take to flush its last frames.
CLOSE_TIMEOUT: Final = 1.0
#: Once a frame has had ``frame_timeout`` seconds, it must keep arriving at
#: least this fast (Kestrel's minimum data rate, in spirit): a 4 MiB frame
#: may take up to 74 s, a peer trickling a byte at a time is closed after the
#: grace. 64 KiB/s is far below any link a broker client uses.
MIN_FRAME_BYTES_PER_SECOND: Final = 64 * 1024
#: Timeouts fire up to this fraction of their limit late, at random per
#: connection: thousands of connections opened in one instant (a flood) then
#: time out spread over a while, not in one scheduling round that would
#: stall every other client's traffic behind thousands of closes.
TIMEOUT_JITTER: Final = 0.1
SERVER_NAME: Final = "broky/0.1.0"


@attrs.frozen
class ConnectionSettings:
    """Per-connection protocol settings (from the broker's config)."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    heartbeat_interval: float = 10.0
    idle_timeout: float = 30.0
    handshake_timeout: float = 5.0
    #: Grace of a started frame before MIN_FRAME_BYTES_PER_SECOND applies.
    frame_timeout: float = 10.0
    #: Most a timeout fires late, as a fraction of it (see TIMEOUT_JITTER).
    timeout_jitter: float = TIMEOUT_JITTER
    #: Largest single message accepted (0: only the frame limit applies).
    max_message_bytes: int = 0
    #: This node's worker count, checked against cluster links' (0: unknown).
    workers: int = 0


@attrs.define(slots=True, eq=False)
class ConnectionCounters:
    """Counters shared by every connection of one broker."""

    opened: int = 0
    closed: Counter[CloseReason] = attrs.field(factory=Counter)
    bytes_received: int = 0
    bytes_sent: int = 0
    #: Socket writes made by a routing task for an idle writer (_write_directly).
    direct_writes: int = 0

    @property
    def current(self) -> int:
        """Connections open now."""
        return self.opened - sum(self.closed.values())


class ServerConnection:
    """Serve one client stream until it closes; see the module docstring."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        router: Router,
        settings: ConnectionSettings,
        counters: ConnectionCounters,
        peer: str,
        store: DurableStore | None = None,
        authenticator: Authenticator | None = None,
        *,
        trusted: bool = False,
        map_certificate: bool = False,
        quotas: QuotaLedger | None = None,
        node_names: frozenset[str] | None = None,
    ) -> None:
        self._stream = stream
        #: Who checks the Hello's credentials; None (or ``trusted``): nobody,
        #: the connection gets full permissions (in-process, private sockets).
        self._authenticator = None if trusted else authenticator
        #: Whether the peer's TLS certificate may name its principal: true
        #: only on the client listener, whose CA is ``tls_client_ca`` (a
        #: cluster certificate proves a node, not a user).
        self._map_certificate = map_certificate
        #: On a cluster listener with cluster_tls_names: the certificate
        #: identities it admits (None: any certificate its CA signed).
        self._node_names = node_names
        #: The worker's per-principal counts and byte buckets (None: no quotas).
        self._quotas = quotas
        #: The name this connection is counted under in ``_quotas``, once admitted.
        self._counted_as: str | None = None
        #: Its principal's shared byte-rate bucket (None: not throttled).
        self._bucket: TokenBucket | None = None
        #: The verified client certificate's identities, set by the handshake.
        self._certificate_identities: tuple[str, ...] = ()
        #: Set once the Hello is admitted.
        self.principal: Principal | None = None
        self._gate: PublishGate | None = None
        #: Why the Hello will be refused whatever it says (max_connections reached).
        self.refusal: tuple[ErrorCode, str] | None = None
        self._router = router
        self._settings = settings
        self._counters = counters
        self.peer = peer
        self._machine = ProtocolMachine(Role.SERVER, settings.max_frame_bytes)
        self._work = trio.Event()
        #: True while the writer task waits for work: then the task that
        #: routed something may write it at once (_write_directly).
        self._writer_idle = False
        #: The socket for direct writes (-1: none, e.g. TLS or in-process,
        #: or once the connection is closing).
        self._direct_fd = _direct_fd(stream)
        #: The socket under any TLS, to ask whether it has room (-1: none).
        self._socket_fd = _direct_fd(getattr(stream, "transport_stream", stream))
        #: Bytes a direct write left unsent; the writer sends them first.
        self._unsent = b""
        self._outlet = router.attach(self._wake)
        self._durable = DurableRequests(router, self._outlet, store, self._subscribe_refusal)
        self._consumers = ConsumerRequests(self._outlet)
        if self._socket_fd >= 0:
            self._outlet.writable = self._socket_has_room
        self._send_scope: trio.CancelScope | None = None
        #: When the last complete frame arrived: liveness counts frames, not
        #: bytes, so a peer trickling bytes is not kept alive by them.
        self._last_received = trio.current_time()
        #: When the frame being received began (None: no frame in progress).
        self._frame_started: float | None = None
        #: True while the reader deliberately does not read (quota throttle,
        #: durable backpressure): that time is not the peer's slowness.
        self._reading_held = False
        #: This connection's share of TIMEOUT_JITTER (see there).
        self._timeout_stretch = 1.0 + random.random() * settings.timeout_jitter
        self._reason: CloseReason | None = None
        self._reason_detail = ""
        self._greeted = False
        self.client_name = ""

    def _wake(self) -> None:
        self._work.set()
        if self._writer_idle and self._direct_fd >= 0:
            self._router.direct_writes.append(self._write_directly)
        if self._outlet.failure is not None and self._send_scope is not None:
            # A blocked write gets CLOSE_TIMEOUT more seconds, then is abandoned.
            self._send_scope.deadline = min(
                self._send_scope.deadline, trio.current_time() + CLOSE_TIMEOUT
            )

    def _socket_has_room(self) -> bool:
        """Whether the kernel would take more bytes on this socket now (for
        broky.router.pressure: a full send buffer means the peer does not read)."""
        if self._socket_fd < 0:
            return False
        try:
            return bool(select.select([], [self._socket_fd], [], 0)[1])
        except (OSError, ValueError):
            return False

    def _write_directly(self) -> None:
        """Send what the outlet holds with one non-blocking write, from the
        task that routed it (Router.run_direct_writes, after a reader's
        batch): at light load a message then leaves without waiting for the
        writer task's turn. Only while the writer is idle, so the two never
        interleave bytes; what the socket does not take, the writer sends
        first, and from then on batches as usual (the socket pushes back)."""
        outlet = self._outlet
        if (
            not self._writer_idle
            or self._unsent
            or self._direct_fd < 0
            or outlet.failure is not None
            or not outlet.has_work
        ):
            return
        data = b"".join(outlet.take())
        try:
            sent = os.write(self._direct_fd, data)
        except OSError:
            sent = 0  # would block, or broken: the writer sends it, or meets the error
        self._counters.bytes_sent += sent
        self._counters.direct_writes += 1
        if sent < len(data):
            self._unsent = data[sent:]

    def _close_reason(self, reason: CloseReason, detail: str = "") -> None:
        if self._reason is None:
            self._reason = reason
            self._reason_detail = detail

    async def run(self) -> None:
        """Serve until the client leaves, fails, or the broker shuts down."""
        self._counters.opened += 1
        try:
            if isinstance(self._stream, trio.SSLStream) and not await self._tls_handshake(
                self._stream
            ):
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, nursery.cancel_scope)
                nursery.start_soon(self._keepalive)
                await self._reader()
                if self._outlet.failure is None:
                    nursery.cancel_scope.cancel()
        finally:
            # The descriptor's number may be reused once closed.
            self._direct_fd = self._socket_fd = -1
            # Free the unfinished frame and everything queued now: the
            # connection object may live on (a log record, an observer's
            # list), but none of its buffers may (docs/architecture.md, Memory).
            self._machine.close()
            self._router.detach(self._outlet)
            if self._quotas is not None and self._counted_as is not None:
                self._quotas.release(self._counted_as)
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await self._stream.aclose()
            reason = self._reason or CloseReason.SERVER_SHUTDOWN
            self._counters.closed[reason] += 1
            level = logging.INFO if reason is CloseReason.CLIENT_CLOSED else logging.WARNING
            log.log(
                level,
                "connection %s (%s) closed: %s%s",
                self.peer,
                self.client_name or "?",
                reason.value,
                f" ({self._reason_detail})" if self._reason_detail else "",
            )

    @property
    def outlet(self) -> Outlet:
        """The router's side of this connection: its subscriptions (for observers)."""
        return self._outlet

    @property
    def close_reason(self) -> tuple[CloseReason, str]:
        """Why the connection closed, and the detail; meaningful once ``run`` returned."""
        return self._reason or CloseReason.SERVER_SHUTDOWN, self._reason_detail

    async def _tls_handshake(self, stream: trio.SSLStream[trio.abc.Stream]) -> bool:
        """Complete the TLS handshake within the handshake timeout; False if it failed.

        Done here, in the connection's own task, so that a slow or foreign
        peer on the TLS port costs one task, never the accept loop.
        """
        limit = self._settings.handshake_timeout
        with trio.move_on_after(limit):
            try:
                await stream.do_handshake()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                cause = exc.__cause__ or exc
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await send_pending_alert(stream)  # the peer reads why it was refused
                self._close_reason(
                    CloseReason.PROTOCOL_ERROR,
                    f"TLS handshake failed ({cause}): is the peer speaking plain TCP, or "
                    "is its certificate missing or not signed by the CA this listener trusts?",
                )
                return False
            if self._map_certificate:
                self._certificate_identities = certificate_identities(stream.getpeercert())
            if self._node_names is not None:
                self._check_node_name(certificate_identities(stream.getpeercert()))
            return True
        self._close_reason(
            CloseReason.IDLE_TIMEOUT, f"TLS handshake not completed within {limit} s"
        )
        return False

    def _greet(self) -> None:
        """Queue this side's preamble, once: it answers the peer's preamble, so
        that a peer speaking TLS or HTTP can be answered in its own language."""
        if not self._greeted:
            self._greeted = True
            self._outlet.send_control(self._machine.initiate())

    def _receive(self, data: bytes | bytearray) -> list[Frame]:
        machine = self._machine
        if self._greeted:
            return machine.receive_data(data)
        try:
            frames = machine.receive_data(data)
        except RemoteProtocolError:
            if foreign_preamble_reply(machine.received_preamble) is None:
                self._greet()
            raise
        if machine.state is not State.PREAMBLE:
            self._greet()
        return frames

    async def _answer_foreign(self, reply: bytes) -> None:
        """Send a non-Broky answer (TLS alert, HTTP 400) and nothing more."""
        with trio.move_on_after(CLOSE_TIMEOUT):
            try:
                await self._stream.send_all(reply)
                self._counters.bytes_sent += len(reply)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the peer is gone already; the close reason stands

    def shutdown(self) -> None:
        """Ask the connection to close with ServerShutdown (broker stopping)."""
        self._outlet.fail(ErrorCode.SERVER_SHUTDOWN, "the broker is shutting down")

    async def _reader(self) -> None:
        stream = self._stream
        receive = self._receive
        handle = self._handle_frames
        counters = self._counters
        router = self._router
        pressure = router.pressure
        try:
            while self._outlet.failure is None:
                data = await stream.receive_some(RECEIVE_BYTES)
                if not data:
                    self._close_reason(CloseReason.CLIENT_CLOSED)
                    return
                counters.bytes_received += len(data)
                bucket = self._bucket
                if bucket is not None:
                    pause = bucket.charge(len(data), trio.current_time())
                    if pause:
                        # Not read while throttled: TCP pushes back on the sender.
                        await self._hold_reading(partial(trio.sleep, pause))
                frames = receive(data)
                self._note_progress(bool(frames))
                if self.principal is None and frames:
                    frames = await self._admit(frames)
                handle(frames)
                if router.direct_writes:
                    router.run_direct_writes()
                if pressure.outlets:
                    await self._hold_reading(self._yield_to_subscribers)
                if self._durable.store is not None and self._durable.store.congested:
                    # Durable backpressure, via TCP.
                    await self._hold_reading(self._durable.store.wait_for_room)
        except RemoteProtocolError as exc:
            self._close_reason(CloseReason.PROTOCOL_ERROR, str(exc))
            if self._greeted:
                self._outlet.fail(exc.code, str(exc))
            else:
                reply = foreign_preamble_reply(self._machine.received_preamble)
                assert reply is not None  # _receive greeted a Broky-speaking peer
                await self._answer_foreign(reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._close_reason(CloseReason.TRANSPORT_ERROR, str(exc) or type(exc).__name__)

    def _note_progress(self, completed: bool) -> None:
        """Update the liveness clocks after a read: a completed frame is
        activity; a frame left unfinished starts (or keeps) its deadline."""
        now = trio.current_time()
        if completed:
            self._last_received = now
        if not self._machine.partial_frame_bytes:
            self._frame_started = None
        elif completed or self._frame_started is None:
            self._frame_started = now

    async def _hold_reading(self, wait: Callable[[], Awaitable[object]]) -> None:
        """Stop reading while ``wait`` runs; the time it takes counts against
        neither the idle timeout nor the frame deadline (the broker chose
        not to read, the peer was not slow)."""
        started = trio.current_time()
        self._reading_held = True
        try:
            await wait()
        finally:
            self._reading_held = False
        held = trio.current_time() - started
        self._last_received += held
        if self._frame_started is not None:
            self._frame_started += held

    async def _yield_to_subscribers(self) -> None:
        """Pause while a subscriber that drains is far behind, so that its
        writer gets the loop; TCP slows this reader's publisher meanwhile.
        See broky.router.pressure for why, and why a stalled subscriber
        cannot hold anyone here for long."""
        pressure = self._router.pressure
        while (wait := pressure.wait_seconds(trio.current_time())) is not None:
            relieved = trio.Event()
            pressure.on_relief(relieved.set)
            with trio.move_on_after(wait):
                await relieved.wait()

    async def _admit(self, frames: list[Frame]) -> list[Frame]:
        """Authenticate the Hello (``frames[0]``) and decide what this
        connection may do; the frames to handle, none if it is refused.

        The slow hash runs in a worker thread (see broky.security.auth), so
        this is the one place the reader waits on something but the socket;
        the handshake timeout bounds it.
        """
        hello = frames[0]
        assert isinstance(hello, Hello)  # the protocol machine checked it
        self.client_name = hello.client_name
        refusal = self.refusal
        principal: Principal | None = TRUSTED
        authenticator = self._authenticator
        if refusal is None and authenticator is not None:
            principal = None
            with trio.move_on_after(self._settings.handshake_timeout):
                try:
                    principal = await authenticator.authenticate(
                        hello.user,
                        hello.password,
                        hello.token,
                        self._certificate_identities,
                        source=self.peer.rsplit(":", 1)[0],
                    )
                    current = self._authenticator
                    if current is not None and current is not authenticator:
                        # Users were reloaded during the check.
                        principal = current.revalidate(principal, authenticator)
                        if principal is None:
                            raise AuthenticationFailed(FAILED)
                except AuthenticationFailed as exc:
                    refusal = (ErrorCode.AUTHENTICATION_FAILED, str(exc))
            if principal is None and refusal is None:
                refusal = (
                    ErrorCode.AUTHENTICATION_FAILED,
                    "authentication timed out (the broker is busy checking other logins)",
                )
        if (
            refusal is None
            and principal is not None
            and hello.link is not LinkKind.CLIENT
            and not principal.may_link
        ):
            refusal = (
                ErrorCode.PERMISSION_DENIED,
                f"principal {principal.name or 'anonymous'!r} may not open router links "
                "(grant it with link = true in its [[users]] table)",
            )
        if refusal is None and principal is not None and self._quotas is not None:
            over = self._quotas.admit(principal.name, principal.quotas)
            if over is not None:
                refusal = (ErrorCode.LIMIT_EXCEEDED, over)
            else:
                self._counted_as = principal.name
                self._bucket = self._quotas.bucket(
                    principal.name, principal.quotas, trio.current_time()
                )
        if refusal is not None or principal is None:
            code, message = refusal or (ErrorCode.AUTHENTICATION_FAILED, "refused")
            self._close_reason(CloseReason.for_error(code), f"{message}{self._who(hello)}")
            self._outlet.fail(code, message)
            return []
        self.principal = principal
        if principal.permissions is not None:
            self._gate = PublishGate(principal.permissions)
        return frames

    def reauthorize(self, authenticator: Authenticator, previous: Authenticator) -> int:
        """Apply reloaded users to this live connection (Broker.reload); the
        subscriptions it ended, or -1 if it disconnected the connection.

        A principal that may stay gets its new permissions at once: later
        publishes pass the new gate, and each subscription the new rules
        refuse is closed with a PermissionDenied stream error (the
        connection stays up, as for a refused subscribe). A principal that
        may not stay is disconnected with AuthenticationFailed.
        """
        if self._authenticator is None:
            return 0  # a trusted connection never authenticated
        self._authenticator = authenticator
        principal = self.principal
        if principal is None:
            return 0  # not admitted yet: _admit checks against the new users
        updated = authenticator.revalidate(principal, previous)
        if updated is None:
            self._outlet.fail(
                ErrorCode.AUTHENTICATION_FAILED,
                f"the credentials of {principal.name or 'anonymous'!r} were revoked by a "
                "configuration reload",
            )
            return -1
        if updated == principal:
            return 0
        self.principal = updated
        self._gate = PublishGate(updated.permissions) if updated.permissions is not None else None
        if self._quotas is not None and self._counted_as is not None:
            # A new max_connections counts from the next login; a new rate applies now.
            self._bucket = self._quotas.bucket(updated.name, updated.quotas, trio.current_time())
        ended = 0
        for stream, subscription in list(self._outlet.subscriptions.items()):
            refusal = self._subscribe_refusal(subscription.pattern)
            if refusal is not None:
                self._router.unsubscribe(self._outlet, stream)
                self._stream_error(
                    ErrorCode.PERMISSION_DENIED,
                    f"{refusal} (permissions changed by a configuration reload)",
                    stream,
                )
                ended += 1
        return ended

    def _check_node_name(self, identities: tuple[str, ...]) -> None:
        """Refuse (after its Hello, so that it reads why) a peer whose
        certificate names no node of ``cluster_tls_names``."""
        assert self._node_names is not None
        if self.refusal is None and self._node_names.isdisjoint(identities):
            named = ", ".join(identities) or "no identity"
            self.refusal = (
                ErrorCode.PERMISSION_DENIED,
                f"this cluster port admits only the nodes in its cluster_tls_names; this "
                f"certificate names {named}",
            )

    def _who(self, hello: Hello) -> str:
        """How a refused Hello introduced itself, for the log line."""
        if hello.user:
            return f" as user {hello.user!r}"
        if hello.token:
            return " with a token"
        if self._certificate_identities:
            return f" with a client certificate for {', '.join(self._certificate_identities)}"
        return ""

    def _check_workers(self, hello: Hello) -> None:
        """Refuse a cluster link from a node with another worker count: worker
        i links to worker i of each peer, so some routers would get no link."""
        workers = self._settings.workers
        if hello.link is LinkKind.CLUSTER and workers and hello.workers not in (0, workers):
            raise RemoteProtocolError(
                f"node {hello.node or '?'} runs {hello.workers} workers and this node "
                f"{workers}: every node of a cluster must run the same --workers (worker i "
                "links to worker i of each peer)",
                ErrorCode.MALFORMED_FRAME,
            )

    def _admissible(self, frame: Publish) -> tuple[Run, ...] | None:
        """The runs of ``frame`` this connection may publish: each message
        within max_message_bytes, each key allowed by the principal's
        permissions. Rejected runs get one stream Error per frame, or, for
        an acked frame, the whole frame is refused in its ack's place (an
        ack must never cover a message that was not stored): None then."""
        runs = frame.runs
        gate = self._gate
        limit = self._settings.max_message_bytes
        if gate is None and (not limit or not any(len(run.messages) > limit for run in runs)):
            return runs
        kept: list[Run] = []
        refused: tuple[ErrorCode, str] | None = None
        rejected = 0
        for run in runs:
            problem: tuple[ErrorCode, str] | None = None
            if gate is not None and not gate.allows(run.key):
                problem = (
                    ErrorCode.PERMISSION_DENIED,
                    f"publishing to {run.key.decode(errors='replace')!r} is not allowed for "
                    f"principal {self.principal.name if self.principal else ''!r}",
                )
            elif limit and len(run.messages) > limit:
                largest = max(u32_array(memoryview(run.sizes)))
                if largest > limit:
                    problem = (
                        ErrorCode.LIMIT_EXCEEDED,
                        f"a message of {largest} bytes on {run.key.decode(errors='replace')!r} "
                        f"exceeds max_message_bytes ({limit})",
                    )
            if problem is None:
                kept.append(run)
            else:
                refused = refused or problem
                rejected += run.count
        if refused is None:
            return runs
        code, message = refused
        if frame.ack:
            self._durable.refuse_acked(
                frame.stream, code, f"{message}; nothing of this frame was stored"
            )
            return None
        self._stream_error(
            code, f"{message} ({rejected} message(s) of this frame not published)", frame.stream
        )
        return tuple(kept)

    def _handle_frames(self, frames: Sequence[Frame]) -> None:
        router = self._router
        outlet = self._outlet
        durable = self._durable
        store = durable.store
        for frame in frames:
            if type(frame) is Publish:
                runs = self._admissible(frame)
                if runs is None:
                    continue  # refused whole, answered in its ack's place
                if store is None and not frame.ack:
                    router.publish(router.encode(runs, frame.stamp_ts_broker), outlet, frame.stream)
                else:
                    durable.publish(frame, runs)
            elif type(frame) is Subscribe:
                refusal = self._subscribe_refusal(frame.pattern)
                if refusal is not None:
                    self._stream_error(ErrorCode.PERMISSION_DENIED, refusal, frame.stream)
                    continue
                subscription = router.subscribe(
                    outlet, frame.stream, frame.pattern, frame.slow_consumer, frame.credit
                )
                if subscription is not None and store is not None:
                    durable.replay(subscription, frame.start, frame.start_time, frame.start_offsets)
            elif type(frame) is Fetch:
                durable.fetch(frame)
            elif type(frame) is ListPartitions:
                durable.list_partitions(frame)
            elif type(frame) is Consume or type(frame) is Settle:
                self._consumers.handle(frame)
            elif type(frame) is Flow:
                router.grant(outlet, frame.stream, frame.credit)
            elif type(frame) is Unsubscribe:
                router.unsubscribe(outlet, frame.stream)
            elif type(frame) is Ping:
                outlet.send_control(encode_frame(Pong(frame.nonce)))
            elif type(frame) is Hello:
                self.client_name = frame.client_name
                if frame.link is not LinkKind.CLIENT:
                    if frame.link is LinkKind.CLUSTER and frame.node == router.node_id:
                        raise RemoteProtocolError(
                            "a router tried to link to its own node (check --peers)",
                            ErrorCode.MALFORMED_FRAME,
                        )
                    self._check_workers(frame)
                    outlet.kind = frame.link
                    outlet.max_pending_bytes = 0  # links: per-subscription bounds only
                outlet.peer = f"{frame.client_name}@{self.peer}"
                if frame.max_frame_bytes:
                    outlet.max_frame_bytes = max(frame.max_frame_bytes, MIN_MAX_FRAME_BYTES)
                outlet.send_control(encode_frame(self._welcome(frame)))
            elif type(frame) is Error:
                detail = f"{frame.code.name}: {frame.message}"
                if frame.stream:
                    log.warning(
                        "connection %s: client error on stream %d: %s",
                        self.peer,
                        frame.stream,
                        detail,
                    )
                    continue
                self._close_reason(CloseReason.CLIENT_ERROR, detail)
                raise trio.ClosedResourceError("client sent an Error frame")
            # Pong: receiving it already refreshed the idle timer.

    def _subscribe_refusal(self, pattern: bytes) -> str | None:
        """Why this principal may not subscribe to ``pattern`` (None: it may).
        Invalid patterns pass here and are refused by the router as such.

        A router link (admitted with ``link = true``) subscribes to whatever
        its node's clients want, each of whom that node has checked already:
        its interest is not filtered again here.
        """
        permissions = self.principal.permissions if self.principal is not None else None
        if permissions is None or self._outlet.kind is not LinkKind.CLIENT:
            return None
        try:
            validate_pattern(pattern)
        except RemoteProtocolError:
            return None
        return permissions.subscribe_refusal(pattern)

    def _stream_error(self, code: ErrorCode, message: str, stream: int) -> None:
        self._durable.stream_error(code, message, stream)

    def _welcome(self, hello: Hello) -> Welcome:
        settings = self._settings
        return Welcome(
            protocol_version=PROTOCOL_VERSION,
            server_name=SERVER_NAME,
            max_frame_bytes=settings.max_frame_bytes,
            heartbeat_interval_ms=int(settings.heartbeat_interval * 1000),
            idle_timeout_ms=int(settings.idle_timeout * 1000),
            max_message_bytes=settings.max_message_bytes,
            principal=self.principal.name if self.principal is not None else "",
        )

    async def _writer(self, connection_scope: trio.CancelScope) -> None:
        outlet = self._outlet
        stream = self._stream
        counters = self._counters
        try:
            while True:
                if not outlet.has_work and not self._unsent:
                    self._writer_idle = True
                    await self._work.wait()
                    self._writer_idle = False
                    self._work = trio.Event()
                failure = outlet.failure
                if failure is not None:
                    self._greet()  # the Error frame must follow a preamble to be read
                parts = outlet.take()
                if self._unsent:
                    parts.insert(0, self._unsent)
                    self._unsent = b""
                if failure is not None:
                    self._close_reason(CloseReason.for_error(failure[0]), failure[1])
                    parts.append(encode_frame(Error(failure[0], failure[1])))
                if parts:
                    data = b"".join(parts)
                    with trio.CancelScope() as send_scope:
                        self._send_scope = send_scope
                        if failure is not None:
                            send_scope.deadline = trio.current_time() + CLOSE_TIMEOUT
                        started = outlet.write_started = trio.current_time()
                        try:
                            await stream.send_all(data)
                        finally:
                            outlet.wrote(trio.current_time() - started)
                    self._send_scope = None
                    if send_scope.cancelled_caught:
                        # The write was abandoned mid-frame (see _wake): nothing
                        # more can be framed on this stream, so close it as is.
                        failure = outlet.failure or failure
                        if failure is not None:
                            self._close_reason(CloseReason.for_error(failure[0]), failure[1])
                        return
                    counters.bytes_sent += len(data)
                if failure is not None:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._close_reason(CloseReason.TRANSPORT_ERROR, str(exc) or type(exc).__name__)
        finally:
            self._writer_idle = False
            connection_scope.cancel()

    async def _keepalive(self) -> None:
        """Ping a quiet peer and close one that misses a deadline.

        Before the Hello: ``handshake_timeout`` from the connection's start
        (bytes trickling in do not extend it). After: a frame must complete
        within ``idle_timeout`` of the last one, so a Ping (sent after
        ``heartbeat_interval`` without a frame) is unanswered for at most
        ``idle_timeout - heartbeat_interval``; while a frame is arriving, it
        instead has ``frame_timeout`` plus one second per
        MIN_FRAME_BYTES_PER_SECOND bytes received so far. Every limit is
        stretched by this connection's share of TIMEOUT_JITTER.
        """
        settings = self._settings
        interval = settings.heartbeat_interval
        stretch = self._timeout_stretch
        opened = trio.current_time()
        nonce = 0
        while True:
            now = trio.current_time()
            if self._reading_held:
                await trio.sleep(min(interval, 1.0))
                continue
            partial_bytes = self._machine.partial_frame_bytes
            if self._machine.state is not State.OPEN:
                limit = settings.handshake_timeout * stretch
                deadline = opened + limit
                wake = min(deadline, now + interval)  # the Hello may come meanwhile
                problem = f"no Hello within {limit:.1f} s of connecting"
            elif self._frame_started is not None and partial_bytes:
                grace = settings.frame_timeout * stretch
                elapsed = now - self._frame_started
                deadline = self._frame_started + grace + partial_bytes / MIN_FRAME_BYTES_PER_SECOND
                wake = min(deadline, now + interval)  # the frame may end meanwhile
                problem = (
                    f"a frame arrived too slowly: {partial_bytes} bytes in {elapsed:.1f} s "
                    f"(after {grace:.1f} s, frames must keep arriving at "
                    f"{MIN_FRAME_BYTES_PER_SECOND // 1024} KiB/s)"
                )
            else:
                limit = settings.idle_timeout * stretch
                quiet_for = now - self._last_received
                deadline = self._last_received + limit
                problem = f"no frame received for {quiet_for:.1f} s (limit {limit:.1f} s)"
                if interval <= quiet_for < limit:
                    nonce += 1
                    self._outlet.send_control(encode_frame(Ping(nonce)))
                wake = min(deadline, now + interval - quiet_for % interval)
            if now >= deadline:
                self._outlet.fail(ErrorCode.IDLE_TIMEOUT, problem)
                return
            await trio.sleep_until(max(wake, now + 0.01))


def _direct_fd(stream: trio.abc.Stream) -> int:
    """The socket descriptor of a plain TCP or Unix stream (-1 otherwise:
    TLS must encrypt through its stream, an in-process pipe has no socket)."""
    if isinstance(stream, trio.SocketStream):
        return stream.socket.fileno()
    return -1


def describe_peer(stream: trio.abc.Stream) -> str:
    """host:port of a socket stream's peer, or a generic name."""
    transport = getattr(stream, "transport_stream", stream)  # under TLS
    socket = getattr(transport, "socket", None)
    if socket is None:
        return "in-process"
    try:
        address = socket.getpeername()
    except OSError:
        return "unknown"
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return f"unix:{address}" if address else "unix"
