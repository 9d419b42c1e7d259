"""Protocol errors, split by whose fault they are (the h11 convention).

``RemoteProtocolError``: the peer sent something invalid; the receiver answers
with an ``Error`` frame carrying ``code`` and closes (or, for a stream error,
keeps the connection). ``LocalProtocolError``: our own code tried to send
something invalid, a bug or bad arguments on this side.
"""

from __future__ import annotations

from broky.protocol.constants import ErrorCode


class ProtocolError(Exception):
    """Base class: carries the wire code that describes the failure."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.MALFORMED_FRAME) -> None:
        super().__init__(message)
        self.code = code


class RemoteProtocolError(ProtocolError):
    """The peer violated the protocol."""


class LocalProtocolError(ProtocolError):
    """This side tried to do something the protocol does not allow."""
