"""Replication frames: ``u32 length`` (of what follows), ``u32 header
length``, the header and, for Fetched, its runs' bytes (broky.replication.wire
describes the messages). Sans I/O: bytes in, messages out.

``Fetch`` and ``Fetched``, a pair per partition and round, have binary headers
(broky.replication.fetch_codec). ``FetchMany`` and ``FetchedMany`` carry
them for one node pair: a header of kind ``MANY_KINDS`` and a count, then
that many frames of their own as the payload, each a whole frame as
``encode`` makes it (a FetchedMany's: Fetched or Refused; a FetchMany's:
Fetch). The rare messages have JSON headers
(broky.replication.wire), readable in a packet capture. A header's first
byte tells which: ``{`` opens a JSON one.
"""

from __future__ import annotations

import struct
from typing import Final

from broky.replication.fetch_codec import (
    FETCH_KIND,
    FETCHED_KIND,
    decode_fetch,
    decode_fetched,
    encode_fetch,
    encode_fetched,
)
from broky.replication.wire import (
    Fetch,
    Fetched,
    FetchedMany,
    FetchMany,
    Message,
    Refused,
    ReplicationProtocolError,
    decode_json,
    json_header,
)

#: Largest frame accepted: a fetch answer is bounded by FETCH_MAX_BYTES plus
#: its headers, so 16 MiB leaves room and refuses garbage lengths early.
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024

_LENGTHS = struct.Struct("<II")
#: First byte of a FetchMany / FetchedMany header, and the header: kind, count.
FETCH_MANY_KIND: Final = 3
FETCHED_MANY_KIND: Final = 4
_MANY_HEAD = struct.Struct("<BxxxI")


def encode(message: Message) -> bytes:
    """One frame for ``message``."""
    return b"".join(_frame_parts(message))


def _frame_parts(message: Message) -> list[bytes]:
    """``message``'s frame in parts, joined once by ``encode``."""
    payload: list[bytes] = []
    if isinstance(message, Fetch):
        header = encode_fetch(message)
    elif isinstance(message, Fetched):
        header, payload = encode_fetched(message)
    elif isinstance(message, FetchMany | FetchedMany):
        inner: tuple[Message, ...]
        if isinstance(message, FetchMany):
            kind, inner = FETCH_MANY_KIND, message.fetches
        else:
            kind, inner = FETCHED_MANY_KIND, message.answers
        header = _MANY_HEAD.pack(kind, len(inner))
        payload = [part for each in inner for part in _frame_parts(each)]
    else:
        header = json_header(message)
    length = 4 + len(header) + sum(map(len, payload))
    return [_LENGTHS.pack(length, len(header)), header, *payload]


class FrameReader:
    """Bytes in, messages out; refuses a frame longer than MAX_FRAME_BYTES
    before buffering it."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        messages: list[Message] = []
        while len(self._buffer) >= 4:
            (length,) = struct.unpack_from("<I", self._buffer)
            if length > MAX_FRAME_BYTES or length < 4:
                raise ReplicationProtocolError(
                    f"frame length {length} outside 4..{MAX_FRAME_BYTES}"
                )
            if len(self._buffer) < 4 + length:
                break
            frame = memoryview(bytes(self._buffer[4 : 4 + length]))
            del self._buffer[: 4 + length]
            messages.append(_decode_frame(frame, nested=False))
        return messages


def _decode_frame(frame: memoryview, *, nested: bool) -> Message:
    """The message of one frame (without its length); a nested one (inside
    a FetchMany or FetchedMany) may not be another of those."""
    if len(frame) < 4:
        raise ReplicationProtocolError("frame shorter than its header length")
    (header_length,) = struct.unpack_from("<I", frame)
    if header_length > len(frame) - 4:
        raise ReplicationProtocolError("header longer than its frame")
    header = frame[4 : 4 + header_length]
    payload = frame[4 + header_length :]
    kind = header[0] if header_length else 0
    if kind == FETCH_KIND:
        return decode_fetch(header)
    if kind == FETCHED_KIND:
        return decode_fetched(header, payload)
    if kind in (FETCH_MANY_KIND, FETCHED_MANY_KIND) and not nested:
        return _decode_many(kind, header, payload)
    return decode_json(bytes(header))


def _decode_many(kind: int, header: memoryview, payload: memoryview) -> Message:
    if len(header) != _MANY_HEAD.size:
        raise ReplicationProtocolError("a FetchMany or FetchedMany header has the wrong size")
    _kind, count = _MANY_HEAD.unpack(header)
    inner: list[Message] = []
    position = 0
    while position < len(payload):
        if len(payload) - position < 4:
            raise ReplicationProtocolError("a nested frame's length is cut short")
        (length,) = struct.unpack_from("<I", payload, position)
        end = position + 4 + length
        if end > len(payload):
            raise ReplicationProtocolError("a nested frame runs past its frame")
        inner.append(_decode_frame(payload[position + 4 : end], nested=True))
        position = end
    if len(inner) != count:
        raise ReplicationProtocolError(f"{len(inner)} nested frames, {count} announced")
    if kind == FETCH_MANY_KIND:
        fetches = tuple(message for message in inner if isinstance(message, Fetch))
        if len(fetches) != count:
            raise ReplicationProtocolError("a FetchMany holds something other than Fetch")
        return FetchMany(fetches)
    answers = tuple(message for message in inner if isinstance(message, Fetched | Refused))
    if len(answers) != count:
        raise ReplicationProtocolError("a FetchedMany holds something other than answers")
    return FetchedMany(answers)
