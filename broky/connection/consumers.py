"""A connection's durable-subscription requests: ``Consume``, ``Settle``,
``Flow`` on a consumer stream, and ``DeleteSubscription``.

Beside ``durable_requests.py`` for the same reason: the handler owns the
socket and admission, this module talks to the worker's subscription
service (``broky.subscriptions.service``). It keeps the connection's
consumers by stream id, so the handler can route ``Flow`` to them, and
detaches them all when the connection ends (their unacked messages are
redelivered at once, not after the ack timeout).

A client's consumer whose pattern reaches partitions other workers own is
a :class:`~broky.durable.consumer_relays.SpreadConsumer` (one part per
owner, over the owner channels); on an owner channel (a ``Durable`` link)
a ``Consume`` is served for this worker's own partitions only. A client's
``DeleteSubscription`` asks every owner worker
(:class:`~broky.durable.subscription_deletes.SpreadDeletion`); on an owner
channel it deletes this worker's share and answers with what it deleted.
"""

from __future__ import annotations

from collections.abc import Callable

from broky.durable.consumer_parts import owners_of
from broky.durable.consumer_relays import SpreadConsumer
from broky.durable.forwarding import Forwarder
from broky.durable.subscription_deletes import SpreadDeletion
from broky.protocol.codec import encode_frame
from broky.protocol.constants import DeletePhase, ErrorCode, LinkKind
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Consume, DeletedSubscription, DeleteSubscription, Error, Settle
from broky.router.matcher import validate_pattern
from broky.router.outbox import Outlet
from broky.subscriptions.consumers import ConsumerLink, Refused
from broky.subscriptions.deletion import Deletion
from broky.subscriptions.service import SubscriptionService

#: Why the connection's principal may not read a pattern (None: it may).
Refusal = Callable[[bytes], "str | None"]


class ConsumerRequests:
    """Serve one connection's Consume and Settle frames (never waits)."""

    def __init__(
        self,
        outlet: Outlet,
        service: SubscriptionService | None,
        refusal: Refusal,
        forwarder: Forwarder | None = None,
    ) -> None:
        self._outlet = outlet
        self._service = service
        self._refusal = refusal
        #: Channels to the other workers (None: one worker).
        self._forwarder = forwarder
        self._links: dict[int, ConsumerLink | SpreadConsumer] = {}

    def _error(self, code: ErrorCode, message: str, stream: int) -> None:
        self._outlet.send_control(encode_frame(Error(code, message, stream)))

    def handle(self, frame: Consume | Settle | DeleteSubscription) -> None:
        if isinstance(frame, Consume):
            self._consume(frame)
            return
        if isinstance(frame, DeleteSubscription):
            self._delete(frame)
            return
        link = self._links.get(frame.stream)
        if link is None or link.closed:
            self._error(
                ErrorCode.UNKNOWN_STREAM,
                f"settle on stream {frame.stream}: no consumer is attached on it",
                frame.stream,
            )
            return
        if isinstance(link, SpreadConsumer):
            link.settle(frame)
            return
        assert self._service is not None  # a link exists only with a service
        self._service.settle(link, frame)

    def _consume(self, frame: Consume) -> None:
        service = self._service
        stream = frame.stream
        if service is None:
            self._error(
                ErrorCode.SUBSCRIPTION_REFUSED,
                f"subscription {frame.subscription!r}: this broker has no durable topics",
                stream,
            )
            return
        existing = self._links.get(stream)
        if (existing is not None and not existing.closed) or stream in self._outlet.subscriptions:
            self._error(ErrorCode.DUPLICATE_STREAM, f"stream {stream} is already open", stream)
            return
        if not self._readable(frame.subscription, frame.pattern, stream):
            return
        kind = self._outlet.kind
        owners = owners_of(service, frame.pattern)
        forwarder = self._forwarder
        if forwarder is not None and kind is LinkKind.CLIENT and owners - {service.store.worker}:
            spread = SpreadConsumer(frame, self._outlet, service, forwarder, owners)
            self._links[stream] = spread
            spread.start()
            return
        self._links[stream] = service.consume(
            frame, self._outlet, own_only=kind is LinkKind.DURABLE
        )

    def _readable(self, subscription: str, pattern: bytes, stream: int) -> bool:
        """Whether ``pattern`` is valid and the principal may read it (else
        the stream error is sent)."""
        try:
            validate_pattern(pattern)
        except RemoteProtocolError as exc:
            self._error(exc.code, f"subscription {subscription!r}: {exc}", stream)
            return False
        refusal = self._refusal(pattern)
        if refusal is not None:
            self._error(ErrorCode.PERMISSION_DENIED, refusal, stream)
            return False
        return True

    def _delete(self, frame: DeleteSubscription) -> None:
        service = self._service
        stream = frame.stream
        if service is None:
            self._error(
                ErrorCode.UNKNOWN_SUBSCRIPTION,
                f"subscription {frame.subscription!r}: this broker has no durable topics",
                stream,
            )
            return
        # No pattern: it may be any subscription, so the principal must be
        # allowed to read every key.
        if not self._readable(frame.subscription, frame.pattern or b">", stream):
            return
        if self._outlet.kind is LinkKind.DURABLE:
            # Another worker asks for one phase of this worker's share.
            service.delete(
                frame.subscription, frame.pattern, frame.force, self._deleted(stream), frame.phase
            )
            return
        if frame.phase is not DeletePhase.WHOLE:
            self._error(
                ErrorCode.SUBSCRIPTION_REFUSED,
                f"subscription {frame.subscription!r}: DeleteSubscription phase "
                f"{frame.phase.name} is for the owner channels between workers; "
                "a client sends Whole (0)",
                stream,
            )
            return
        owners = owners_of(service, frame.pattern or b">") | {service.store.worker}
        SpreadDeletion(frame, self._outlet, service, self._forwarder, owners).start()

    def _deleted(self, stream: int) -> Callable[[Deletion | Refused], None]:
        def answer(result: Deletion | Refused) -> None:
            if isinstance(result, Refused):
                self._error(result.code, str(result), stream)
            else:
                self._outlet.send_control(
                    encode_frame(DeletedSubscription(stream, result.partitions, result.consumers))
                )

        return answer

    def owns(self, stream: int) -> bool:
        """Whether ``stream`` is one of this connection's consumers (Flow goes there)."""
        link = self._links.get(stream)
        return link is not None and not link.closed

    def grant(self, stream: int, credit: int) -> None:
        link = self._links.get(stream)
        if isinstance(link, SpreadConsumer):
            link.grant(credit)
        elif link is not None and self._service is not None:
            self._service.grant(link, credit)

    def close(self, stream: int) -> bool:
        """Detach the consumer on ``stream`` (Unsubscribe); False if there is none."""
        link = self._links.pop(stream, None)
        if isinstance(link, SpreadConsumer):
            link.detach()
            return True
        if link is None or self._service is None:
            return False
        self._service.detach(link)
        return True

    def close_all(self) -> None:
        """The connection ended: detach every consumer."""
        for stream in list(self._links):
            self.close(stream)
