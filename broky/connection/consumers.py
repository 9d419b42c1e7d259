"""A connection's durable-subscription requests: ``Consume`` and ``Settle``.

Beside ``durable_requests.py`` for the same reason: the handler owns the
socket and admission, this module talks to the subscriptions. The wire
frames and the broker-side state machine (``broky.subscriptions``) exist;
until the partition owners drive dispatchers, a ``Consume`` is refused with
``SubscriptionRefused`` and a ``Settle`` with ``UnknownStream``, each as a
stream error, so a client learns at once instead of waiting for messages.
"""

from __future__ import annotations

from broky.protocol.codec import encode_frame
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Consume, Error, Settle
from broky.router.outbox import Outlet


class ConsumerRequests:
    """Serve one connection's Consume and Settle frames (never waits)."""

    def __init__(self, outlet: Outlet) -> None:
        self._outlet = outlet

    def handle(self, frame: Consume | Settle) -> None:
        if isinstance(frame, Consume):
            code = ErrorCode.SUBSCRIPTION_REFUSED
            message = (
                f"subscription {frame.subscription!r}: this broker does not serve "
                "durable subscriptions yet"
            )
        else:
            code = ErrorCode.UNKNOWN_STREAM
            message = f"settle on stream {frame.stream}: no consumer is attached on it"
        self._outlet.send_control(encode_frame(Error(code, message, frame.stream)))
