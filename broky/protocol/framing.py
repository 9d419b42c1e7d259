"""Splitting a byte stream into frames, and the connection preamble.

The reader hands out zero-copy views into the bytes it was fed whenever a
frame lies wholly inside one chunk, and copies only frames that straddle two
chunks. It rejects an oversize frame as soon as its 4-byte size prefix is
known, before buffering any of it.
"""

from __future__ import annotations

import struct
from typing import Final

from broky.protocol.constants import MAGIC, PROTOCOL_VERSION, ErrorCode
from broky.protocol.errors import RemoteProtocolError

_U32 = struct.Struct("<I")
_PREAMBLE: Final = struct.Struct(f"<{len(MAGIC)}sH")
_HTTP_METHODS: Final = (
    b"GET ",
    b"POST",
    b"PUT ",
    b"HEAD",
    b"DELE",
    b"OPTI",
    b"PATC",
    b"CONN",
    b"PRI ",
)


def encode_preamble(version: int = PROTOCOL_VERSION) -> bytes:
    """The 8 bytes each side sends first."""
    return _PREAMBLE.pack(MAGIC, version)


#: A fatal TLS alert record (TLS 1.0 record version, which every TLS client
#: reads): level 2 (fatal), description 40 (handshake_failure). A TLS client
#: that says hello to a plain port gets it and fails at once, not on a timeout.
TLS_HANDSHAKE_FAILURE_ALERT: Final = b"\x15\x03\x01\x00\x02\x02\x28"
_HTTP_BAD_REQUEST_BODY: Final = (
    b"400 Bad Request: this port speaks the Broky protocol, not HTTP.\n"
    b"Use a Broky client library; metrics are served on the broker's metrics port.\n"
)
#: The whole answer to an HTTP request on a Broky port.
HTTP_BAD_REQUEST: Final = (
    b"HTTP/1.1 400 Bad Request\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: " + str(len(_HTTP_BAD_REQUEST_BODY)).encode() + b"\r\n"
    b"Connection: close\r\n\r\n" + _HTTP_BAD_REQUEST_BODY
)


def _is_tls_client_hello(data: bytes) -> bool:
    return data[:1] == b"\x16" and data[1:2] == b"\x03"


def _is_http_request(data: bytes) -> bool:
    return data[:4] in _HTTP_METHODS or data.startswith(b"HTTP/")


def describe_foreign_preamble(data: bytes) -> str:
    """Say, as helpfully as possible, what a peer with a bad preamble speaks."""
    if _is_tls_client_hello(data):
        return (
            "the peer sent a TLS ClientHello to a plain-TCP Broky port: connect without TLS, "
            "or to the broker's TLS listener"
        )
    if _is_http_request(data):
        return "the peer sent an HTTP request to a Broky port: Broky speaks its own binary protocol"
    return f"the peer did not send the Broky preamble {MAGIC!r} (got {data[:8]!r})"


def foreign_preamble_reply(data: bytes) -> bytes | None:
    """The bytes that answer a bad preamble in a language the peer reads.

    A TLS ClientHello gets a fatal TLS alert and an HTTP request a
    ``400 Bad Request`` with a plain-text body; for anything else this returns
    None, and the caller answers in Broky (its preamble and an Error frame).
    """
    if _is_tls_client_hello(data):
        return TLS_HANDSHAKE_FAILURE_ALERT
    if _is_http_request(data):
        return HTTP_BAD_REQUEST
    return None


def parse_preamble(data: bytes) -> int:
    """Validate an 8-byte preamble and return the peer's protocol version."""
    magic, version = _PREAMBLE.unpack(data)
    if magic != MAGIC:
        raise RemoteProtocolError(describe_foreign_preamble(data), ErrorCode.BAD_PREAMBLE)
    if version != PROTOCOL_VERSION:
        raise RemoteProtocolError(
            f"unsupported protocol version {version}; this side speaks version {PROTOCOL_VERSION}",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    return int(version)


class FrameReader:
    """Bytes in, complete frames (the FlatBuffer after each size prefix) out."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._pending = bytearray()
        self._frame_size = -1  # size of the pending frame, once its prefix is known

    @property
    def bytes_needed(self) -> int:
        """How many more bytes complete the pending frame (or its prefix)."""
        if self._frame_size < 0:
            return 4 - len(self._pending)
        return 4 + self._frame_size - len(self._pending)

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._pending)

    def clear(self) -> None:
        """Drop the incomplete frame, if any: called when the connection
        closes, so that its buffer (up to ``max_frame_bytes``) is freed at
        once rather than whenever the connection object is collected."""
        self._pending = bytearray()
        self._frame_size = -1

    def _check(self, size: int) -> int:
        if size > self.max_frame_bytes:
            raise RemoteProtocolError(
                f"frame of {size} bytes exceeds the limit of {self.max_frame_bytes} bytes",
                ErrorCode.FRAME_TOO_LARGE,
            )
        return size

    def feed(self, data: bytes | bytearray) -> list[memoryview]:
        """Add received bytes; return every frame they complete, in order.

        ``data`` must not be mutated afterwards: frames may be views into it.
        """
        frames: list[memoryview] = []
        view = memoryview(data)
        if self._pending:
            view = self.complete_pending(view, frames)
            if self._pending:
                return frames
        position, end = 0, len(view)
        while end - position >= 4:
            size = self._check(_U32.unpack_from(view, position)[0])
            if end - position - 4 < size:
                break
            frames.append(view[position + 4 : position + 4 + size])
            position += 4 + size
        self.keep_tail(view[position:])
        return frames

    def keep_tail(self, tail: memoryview) -> None:
        """Keep ``tail``, the start of a frame (nothing is pending): checks
        its size prefix once the 4 bytes are there."""
        if len(tail) >= 4:
            self._frame_size = self._check(_U32.unpack_from(tail, 0)[0])
        if tail:
            self._pending += tail

    def complete_pending(self, view: memoryview, frames: list[memoryview]) -> memoryview:
        """Feed the pending frame from ``view``, appending it to ``frames``
        once complete; returns the rest of ``view`` (empty while pending)."""
        pending = self._pending
        if self._frame_size < 0:
            take = 4 - len(pending)
            pending += view[:take]
            view = view[take:]
            if len(pending) < 4:
                return view
            self._frame_size = self._check(_U32.unpack_from(pending, 0)[0])
        take = 4 + self._frame_size - len(pending)
        pending += view[:take]
        if len(pending) == 4 + self._frame_size:
            frames.append(memoryview(bytes(pending))[4:])
            self._pending = bytearray()
            self._frame_size = -1
        return view[take:]
