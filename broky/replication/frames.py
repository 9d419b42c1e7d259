"""Replication frames: ``u32 length`` (of what follows), ``u32 header
length``, the header and, for Fetched, its runs' bytes (broky.replication.wire
describes the messages). Sans I/O: bytes in, messages out.

``Fetch`` and ``Fetched``, a pair per partition and round, have binary headers
(broky.replication.fetch_codec); the rare messages have JSON headers
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
    Message,
    ReplicationProtocolError,
    decode_json,
    json_header,
)

#: Largest frame accepted: a fetch answer is bounded by FETCH_MAX_BYTES plus
#: its headers, so 16 MiB leaves room and refuses garbage lengths early.
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024

_LENGTHS = struct.Struct("<II")


def encode(message: Message) -> bytes:
    """One frame for ``message``."""
    payload: list[bytes] = []
    if isinstance(message, Fetch):
        header = encode_fetch(message)
    elif isinstance(message, Fetched):
        header, payload = encode_fetched(message)
    else:
        header = json_header(message)
    length = 4 + len(header) + sum(map(len, payload))
    return b"".join((_LENGTHS.pack(length, len(header)), header, *payload))


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
            (header_length,) = struct.unpack_from("<I", frame)
            if header_length > length - 4:
                raise ReplicationProtocolError("header longer than its frame")
            header = frame[4 : 4 + header_length]
            kind = header[0] if header_length else 0
            if kind == FETCH_KIND:
                messages.append(decode_fetch(header))
            elif kind == FETCHED_KIND:
                messages.append(decode_fetched(header, frame[4 + header_length :]))
            else:
                messages.append(decode_json(bytes(header)))
        return messages
