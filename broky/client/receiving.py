"""The client's incoming side: what the broker's frames do to the client's state.

The reader task (``Client._reader``) decodes frames and hands each to
``_handle``, which routes it to its subscription, consumer, request, ping or
acked frame; ``_shutdown`` fails all of them at once when the connection
ends. Like ``Publisher`` (its base class) this holds no socket: ``Client``
owns the socket tasks and the public API.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import trio

from broky.client.consumer import Consumer
from broky.client.errors import (
    AuthenticationError,
    BrokyError,
    PublishRefused,
    SubscriptionError,
)
from broky.client.publishing import Publisher
from broky.client.subscription import Subscription
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES, ErrorCode
from broky.protocol.frames import (
    DeletedSubscription,
    Deliver,
    Error,
    Fetched,
    Frame,
    LocatedDeliver,
    Notice,
    Partitions,
    Ping,
    Pong,
    PublishAck,
    Redelivered,
    Settled,
    Subscribed,
    Welcome,
)

log = logging.getLogger("broky.client")

#: Publish-stream errors about messages this client may not send.
_REFUSALS: Final = (ErrorCode.PERMISSION_DENIED, ErrorCode.LIMIT_EXCEEDED)
#: Errors in an acked frame's place that say its messages were not stored
#: (or, for NotLeader after a failover, not acknowledged): ``OwnerUnavailable``
#: is retried by the client itself (broky.client.acked); ``NotLeader``,
#: ``NotEnoughReplicas`` and ``SequenceGap`` by broky.client.cluster. Each
#: answers one frame: a code missing here left its frame waiting, and the
#: next PublishAck was taken for that frame's.
_ACK_FAILURES: Final = (
    ErrorCode.STORAGE_FAILURE,
    ErrorCode.OWNER_UNAVAILABLE,
    ErrorCode.NOT_LEADER,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.OUT_OF_ORDER_SEQUENCE,
    ErrorCode.SEQUENCE_GAP,
)


class Receiver(Publisher):
    """The receiving half of ``Client`` (its base class, over ``Publisher``):
    the subscriptions, pending requests and pings the broker's frames answer."""

    def __init__(self, publish_stream: int, idempotent: bool = True) -> None:
        super().__init__(publish_stream, idempotent)
        #: The broker's Welcome (its limits, who it authenticated us as).
        self.server: Welcome | None = None
        # request/response streams (ListPartitions, Fetch)
        self._requests: dict[int, tuple[trio.Event, list[Frame]]] = {}
        self._subscriptions: dict[int, Subscription | Consumer] = {}
        self._pings: dict[int, trio.Event] = {}
        self._welcome = trio.Event()
        self.closed = False
        self._error = None
        #: The first publish refusal since the last flush (flush raises it).
        self._refused: PublishRefused | None = None
        self.on_error: Callable[[Error], None] = self._log_error

    def _handle(self, frame: Frame | LocatedDeliver) -> None:
        if type(frame) is LocatedDeliver:
            subscription = self._subscriptions.get(frame.stream)
            if subscription is not None:
                subscription._deliver_located(frame)
        elif type(frame) is Deliver:
            subscription = self._subscriptions.get(frame.stream)
            if subscription is not None:
                subscription._deliver(frame.runs)
        elif type(frame) is Subscribed:
            subscription = self._subscriptions.get(frame.stream)
            if subscription is not None:
                subscription._confirmed.set()
        elif type(frame) is Pong:
            event = self._pings.pop(frame.nonce, None)
            if event is not None:
                event.set()
        elif type(frame) is Ping:
            self._send_control(Pong(frame.nonce))
        elif type(frame) is Notice:
            subscription = self._subscriptions.get(frame.stream)
            if subscription is not None:
                subscription.dropped_by_broker += frame.count
            log.warning("stream %d: the broker dropped %d messages", frame.stream, frame.count)
        elif type(frame) is PublishAck:
            self._handle_ack(frame)
        elif type(frame) is Redelivered or type(frame) is Settled:
            consumer = self._subscriptions.get(frame.stream)
            if isinstance(consumer, Consumer):
                consumer._receive(frame)
        elif (
            type(frame) is Fetched
            or type(frame) is Partitions
            or type(frame) is DeletedSubscription
        ):
            self._answer(frame.stream, frame)
        elif type(frame) is Error:
            self._handle_error(frame)
        elif type(frame) is Welcome:
            self.server = frame
            self._set_frame_limit(
                frame.max_frame_bytes or DEFAULT_MAX_FRAME_BYTES, frame.max_message_bytes
            )
            self._welcome.set()

    def _handle_error(self, frame: Error) -> None:
        if frame.stream == 0:
            if frame.code is ErrorCode.AUTHENTICATION_FAILED:
                if self.server is not None:
                    # Welcomed earlier: the broker revoked these credentials
                    # since (a configuration reload), the login itself was fine.
                    message = f"the broker closed the connection: {frame.message}"
                else:
                    message = (
                        f"the broker refused the connection: {frame.message} (pass user= and "
                        "password=, or token=, to broky.connect, or a client certificate the "
                        "broker maps to a user; --user/--password/--token on the command line)"
                    )
                self._shutdown(AuthenticationError(frame.code, message))
                return
            self._shutdown(
                BrokyError(frame.code, f"the broker closed the connection: {frame.message}")
            )
            return
        subscription = self._subscriptions.get(frame.stream)
        if subscription is not None:
            self._subscriptions.pop(frame.stream, None)
            subscription._fail(SubscriptionError(frame.code, frame.message))
        elif frame.stream in self._requests:
            self._answer(frame.stream, frame)
        elif frame.stream == self._publish_stream and (
            frame.code in _ACK_FAILURES or (frame.code in _REFUSALS and self._acks.in_flight)
        ):
            # The broker answers a failed or refused acked frame with an error in its place.
            self._acks.failed(frame.code, frame.message)
            self._acks_done.set()
        elif frame.stream == self._publish_stream and frame.code in _REFUSALS:
            log.warning("the broker refused published messages: %s", frame.message)
            self._refused = self._refused or PublishRefused(frame.code, frame.message)
        else:
            self.on_error(frame)

    def _answer(self, stream: int, frame: Frame) -> None:
        request = self._requests.pop(stream, None)
        if request is not None:
            request[1].append(frame)
            request[0].set()

    @staticmethod
    def _log_error(frame: Error) -> None:
        log.warning(
            "broker error on stream %d: %s: %s", frame.stream, frame.code.name, frame.message
        )

    def _shutdown(self, error: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        self._error = error
        for subscription in list(self._subscriptions.values()):
            subscription._fail(error)
        for event in self._pings.values():
            event.set()
        for done, _ in self._requests.values():
            done.set()
        self._acks_done.set()
        self._welcome.set()
        self._space.set()
