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
from collections.abc import Sequence
from functools import partial

import trio

from broky.connection.admission import Admission, Refusal
from broky.connection.consumers import ConsumerRequests
from broky.connection.durable_requests import DurableRequests
from broky.connection.hello import accept_hello
from broky.connection.liveness import Liveness
from broky.connection.reasons import CloseReason
from broky.connection.settings import ConnectionCounters, ConnectionSettings
from broky.connection.tls_handshake import tls_handshake
from broky.connection.writer import CLOSE_TIMEOUT, ConnectionWriter
from broky.durable.forwarding import Forwarder
from broky.durable.store import DurableStore
from broky.protocol.codec import encode_frame
from broky.protocol.connection import ProtocolMachine, Role, State
from broky.protocol.constants import ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import (
    Consume,
    DeleteSubscription,
    EncodedRun,
    Error,
    Fetch,
    Flow,
    ForwardPublish,
    Hello,
    ListPartitions,
    Ping,
    Pong,
    Publish,
    Received,
    Run,
    Settle,
    Subscribe,
    Unsubscribe,
)
from broky.protocol.framing import foreign_preamble_reply
from broky.router.outbox import Outlet
from broky.router.relief import yield_to_subscribers
from broky.router.router import Router
from broky.security.auth import Authenticator, Principal
from broky.security.quotas import QuotaLedger
from broky.socket_reads import RECEIVE_BYTES, stream_receiver
from broky.subscriptions.service import SubscriptionService

log = logging.getLogger("broky.connection")


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
        forwarder: Forwarder | None = None,
        subscriptions: SubscriptionService | None = None,
    ) -> None:
        self._stream = stream
        #: Identity, permissions and quota share (broky.connection.admission);
        #: a trusted connection (in-process, private sockets) has no authenticator.
        self._admission = Admission(
            None if trusted else authenticator,
            map_certificate=map_certificate,
            quotas=quotas,
            node_names=node_names,
        )
        self._router = router
        self._settings = settings
        self._counters = counters
        self.peer = peer
        self._machine = ProtocolMachine(Role.SERVER, settings.max_frame_bytes)
        self._machine.max_message_bytes = settings.max_message_bytes
        #: The outlet, the writer task and direct writes (broky.connection.writer).
        self._writer = ConnectionWriter(stream, router, counters, self._greet, self._close_reason)
        self._outlet = self._writer.outlet
        self._durable = DurableRequests(
            router, self._outlet, store, self._subscribe_refusal, forwarder
        )
        self._consumers = ConsumerRequests(
            self._outlet, subscriptions, self._subscribe_refusal, forwarder
        )
        #: Liveness clocks and the keepalive task (broky.connection.liveness).
        self._liveness = Liveness(settings, self._machine)
        self._reason: CloseReason | None = None
        self._reason_detail = ""
        self._greeted = False
        self.client_name = ""

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
                nursery.start_soon(self._writer.run, nursery.cancel_scope)
                nursery.start_soon(self._liveness.run, self._outlet)
                await self._reader()
                if self._outlet.failure is None:
                    nursery.cancel_scope.cancel()
        finally:
            self._writer.close()
            # Free the unfinished frame and everything queued now: the
            # connection object may live on (a log record, an observer's
            # list), but none of its buffers may (docs/architecture.md, Memory).
            self._machine.close()
            self._consumers.close_all()
            self._router.detach(self._outlet)
            self._admission.release()
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
        """Complete the TLS handshake (broky.connection.tls_handshake); False if it failed."""
        failure = await tls_handshake(stream, self._settings.handshake_timeout, self._admission)
        if failure is not None:
            self._close_reason(*failure)
        return failure is None

    def _greet(self) -> None:
        """Queue this side's preamble, once: it answers the peer's preamble, so
        that a peer speaking TLS or HTTP can be answered in its own language."""
        if not self._greeted:
            self._greeted = True
            self._outlet.send_control(self._machine.initiate())

    def _receive(self, data: bytes | bytearray) -> list[Received]:
        machine = self._machine
        if self._greeted:
            return machine.receive_forwarding(data)
        try:
            frames = machine.receive_forwarding(data)
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
        receive_some = stream_receiver(stream, RECEIVE_BYTES)
        receive = self._receive
        handle = self._handle_frames
        counters = self._counters
        router = self._router
        pressure = router.pressure
        try:
            while self._outlet.failure is None:
                data = await receive_some()
                if not data:
                    self._close_reason(CloseReason.CLIENT_CLOSED)
                    return
                counters.bytes_received += len(data)
                bucket = self._admission.bucket
                if bucket is not None:
                    pause = bucket.charge(len(data), trio.current_time())
                    if pause:
                        # Not read while throttled: TCP pushes back on the sender.
                        await self._liveness.hold_reading(partial(trio.sleep, pause))
                frames = receive(data)
                self._liveness.note_progress(bool(frames))
                if self.principal is None and frames:
                    frames = await self._admit(frames)
                router.routing = True
                try:
                    handle(frames)
                finally:
                    router.routing = False
                    if router.direct_writes:
                        router.run_direct_writes()
                if pressure.outlets:
                    await self._liveness.hold_reading(partial(yield_to_subscribers, pressure))
                if self._durable.congested:
                    # Durable backpressure (logs or owners' credit), via TCP.
                    await self._liveness.hold_reading(self._durable.wait_for_room)
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

    @property
    def principal(self) -> Principal | None:
        """Who the connection's Hello proved to be (None: not admitted yet)."""
        return self._admission.principal

    @property
    def refusal(self) -> Refusal | None:
        """Why the Hello will be refused whatever it says (None: it is checked)."""
        return self._admission.refusal

    @refusal.setter
    def refusal(self, refusal: Refusal | None) -> None:
        self._admission.refusal = refusal

    async def _admit(self, frames: list[Received]) -> list[Received]:
        """Authenticate the Hello (``frames[0]``) and decide what this
        connection may do; the frames to handle, none if it is refused.

        The one place the reader waits on something but the socket (the
        slow hash, in a worker thread); the handshake timeout bounds it.
        """
        hello = frames[0]
        assert isinstance(hello, Hello)  # the protocol machine checked it
        self.client_name = hello.client_name
        admission = self._admission
        refusal = await admission.admit(
            hello, self.peer.rsplit(":", 1)[0], self._settings.handshake_timeout
        )
        if refusal is not None:
            code, message = refusal
            self._close_reason(CloseReason.for_error(code), f"{message}{admission.who(hello)}")
            self._outlet.fail(code, message)
            return []
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
        admission = self._admission
        if admission.authenticator is None:
            return 0  # a trusted connection never authenticated
        before = admission.principal
        closing = admission.reload(authenticator, previous)
        if closing is not None:
            self._outlet.fail(ErrorCode.AUTHENTICATION_FAILED, closing)
            return -1
        if admission.principal is before:
            return 0
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

    def _admissible(self, frame: Publish) -> Sequence[Run] | None:
        """The runs of ``frame`` this connection may publish (Admission.check_runs).
        Rejected runs get one stream Error per frame, or, for an acked frame,
        the whole frame is refused in its ack's place (an ack must never
        cover a message that was not stored): None then."""
        checked = self._admission.check_runs(frame.runs, self._settings.max_message_bytes)
        if checked is None:
            return frame.runs
        kept, refusal, rejected = checked
        code, message = refusal
        if frame.ack:
            self._durable.refuse_acked(
                frame.stream, code, f"{message}; nothing of this frame was stored"
            )
            return None
        self._refused_runs(refusal, rejected, frame.stream)
        return kept

    def _forwardable(self, frame: ForwardPublish) -> list[EncodedRun]:
        """The runs of ``frame`` this principal may publish; refused ones get
        one stream Error, as for ``_admissible``."""
        checked = self._admission.check_forwarded(frame.runs)
        if checked is None:
            return frame.runs
        kept, refusal, rejected = checked
        self._refused_runs(refusal, rejected, frame.stream)
        return kept

    def _refused_runs(self, refusal: Refusal, rejected: int, stream: int) -> None:
        code, message = refusal
        self._stream_error(
            code, f"{message} ({rejected} message(s) of this frame not published)", stream
        )

    def _handle_frames(self, frames: Sequence[Received]) -> None:
        router = self._router
        outlet = self._outlet
        durable = self._durable
        store = durable.store
        for frame in frames:
            if type(frame) is ForwardPublish:
                forwarded = self._forwardable(frame)
                if store is None:
                    router.publish(forwarded, outlet, frame.stream)
                else:
                    durable.forward(frame.stream, forwarded)
            elif type(frame) is Publish:
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
                if frame.queue:
                    refusal = durable.queue_refusal(frame.pattern, frame.start)
                    if refusal is not None:
                        self._stream_error(ErrorCode.SUBSCRIPTION_REFUSED, refusal, frame.stream)
                        continue
                subscription = router.subscribe(
                    outlet,
                    frame.stream,
                    frame.pattern,
                    frame.slow_consumer,
                    frame.credit,
                    0 if frame.queue else durable.remote_owners(frame.pattern),
                    frame.queue,
                )
                if subscription is not None and store is not None:
                    durable.replay(subscription, frame.start, frame.start_time, frame.start_offsets)
            elif type(frame) is Fetch:
                durable.fetch(frame)
            elif type(frame) is ListPartitions:
                durable.list_partitions(frame)
            elif (
                type(frame) is Consume or type(frame) is Settle or type(frame) is DeleteSubscription
            ):
                self._consumers.handle(frame)
            elif type(frame) is Flow:
                if self._consumers.owns(frame.stream):
                    self._consumers.grant(frame.stream, frame.credit)
                else:
                    router.grant(outlet, frame.stream, frame.credit)
            elif type(frame) is Unsubscribe:
                if not self._consumers.close(frame.stream):
                    router.unsubscribe(outlet, frame.stream)
            elif type(frame) is Ping:
                outlet.send_control(encode_frame(Pong(frame.nonce)))
            elif type(frame) is Hello:
                self.client_name = frame.client_name
                welcome = accept_hello(
                    frame, outlet, router.node_id, self._settings, self.peer, self.principal
                )
                outlet.send_control(encode_frame(welcome))
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
        """Why this connection may not subscribe to ``pattern`` (None: it may)."""
        return self._admission.subscribe_refusal(pattern, self._outlet.kind)

    def _stream_error(self, code: ErrorCode, message: str, stream: int) -> None:
        self._durable.stream_error(code, message, stream)
