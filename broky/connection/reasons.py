"""Why a connection closed: one enumerated reason per close, logged once and counted."""

from __future__ import annotations

import enum

from broky.protocol.constants import ErrorCode


class CloseReason(enum.Enum):
    """Every way a broker connection can end. Values are metric label values."""

    CLIENT_CLOSED = "client_closed"
    """The client closed its side (EOF)."""
    CLIENT_ERROR = "client_error"
    """The client sent an Error frame and went away."""
    PROTOCOL_ERROR = "protocol_error"
    """The client broke the protocol (bad preamble, malformed or oversize frame)."""
    SLOW_CONSUMER = "slow_consumer"
    """A subscription with the Disconnect policy overflowed its outbox."""
    IDLE_TIMEOUT = "idle_timeout"
    """Nothing was received for longer than the idle timeout."""
    SERVER_SHUTDOWN = "server_shutdown"
    """The broker is stopping."""
    TRANSPORT_ERROR = "transport_error"
    """The socket failed (reset, broken pipe)."""
    AUTHENTICATION_FAILED = "authentication_failed"
    """The Hello's credentials were missing or wrong."""
    PERMISSION_DENIED = "permission_denied"
    """The principal may not do what the Hello asked (open a router link)."""
    LIMIT_EXCEEDED = "limit_exceeded"
    """A connection-level limit was reached (max_connections)."""

    @classmethod
    def for_error(cls, code: ErrorCode) -> CloseReason:
        """The close reason that goes with an Error frame the broker sends."""
        return _BY_CODE.get(code, cls.PROTOCOL_ERROR)


_BY_CODE = {
    ErrorCode.SLOW_CONSUMER: CloseReason.SLOW_CONSUMER,
    ErrorCode.IDLE_TIMEOUT: CloseReason.IDLE_TIMEOUT,
    ErrorCode.SERVER_SHUTDOWN: CloseReason.SERVER_SHUTDOWN,
    ErrorCode.AUTHENTICATION_FAILED: CloseReason.AUTHENTICATION_FAILED,
    ErrorCode.PERMISSION_DENIED: CloseReason.PERMISSION_DENIED,
    ErrorCode.LIMIT_EXCEEDED: CloseReason.LIMIT_EXCEEDED,
}
