"""Exceptions the client raises: each carries the broker's wire code."""

from __future__ import annotations

from broky.protocol.constants import ErrorCode


class BrokyError(Exception):
    """An error reported by (or about) the broker; ``code`` says which."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{message} [{code.name}]")
        self.code = code


class ConnectionClosed(BrokyError):
    """The connection is gone; the message says why."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL) -> None:
        super().__init__(code, message)


class SubscriptionError(BrokyError):
    """The broker refused or ended one subscription; the connection stays up."""


class AuthenticationError(BrokyError):
    """The broker refused this client's credentials (or wanted some)."""


class PublishRefused(BrokyError):
    """The broker refused some published messages (permissions, message size);
    raised by ``flush``. The connection stays up; the rest was routed."""
