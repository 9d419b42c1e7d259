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

from broky.protocol.frames import Buffer
from broky.replication.fetch_codec import (
    FETCH_HEAD,
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
_LENGTH = struct.Struct("<I")
#: First byte of a FetchMany / FetchedMany header, and the header: kind, count.
FETCH_MANY_KIND: Final = 3
FETCHED_MANY_KIND: Final = 4
_MANY_HEAD = struct.Struct("<BxxxI")


def encode(message: Message) -> bytes:
    """One frame for ``message``."""
    return b"".join(_frame_parts(message))


#: A Fetch header's fields that change between one follower's rounds: its
#: offset, durable end and subscription state (the last four of FETCH_HEAD).
_FETCH_PROGRESS = struct.Struct("<qqqq")
#: Bytes of a Fetch frame before them: the frame's lengths and the header's
#: fixed fields (kind, name lengths, partition, epoch, node epoch).
_FETCH_PROGRESS_AT: Final = _LENGTHS.size + FETCH_HEAD.size - _FETCH_PROGRESS.size


class FetchTemplate:
    """One follower's Fetch frames, as ``encode`` makes them, filled in.

    A follower sends a Fetch per partition and round, and only its offsets
    and subscription state change between them: its topic, partition, epoch
    and node stay for the follower's life (broky.replication.follower). The
    frame is cut once from an encoded Fetch, so it stays byte-identical to
    ``encode`` (tests check); a round then packs four integers, where
    building a frozen Fetch and encoding it took most of the request's
    encode time on a follower (~8 % of its GIL-held time with the send).
    """

    __slots__ = ("_head", "_tail")

    def __init__(self, topic: str, partition: int, epoch: int, node: str, node_epoch: int) -> None:
        whole = encode(Fetch(topic, partition, epoch, node, node_epoch, 0, 0))
        self._head = whole[:_FETCH_PROGRESS_AT]
        self._tail = whole[_FETCH_PROGRESS_AT + _FETCH_PROGRESS.size :]

    def frame(self, offset: int, durable: int, state_epoch: int, state_version: int) -> bytes:
        """The frame of ``Fetch(..., offset, durable, state_epoch, state_version)``."""
        return b"".join(
            (
                self._head,
                _FETCH_PROGRESS.pack(offset, durable, state_epoch, state_version),
                self._tail,
            )
        )


def encode_fetch_many(fetches: list[bytes]) -> bytes:
    """The frame of a FetchMany of Fetch frames already encoded
    (``FetchTemplate``): ``encode(FetchMany(...))`` without the objects."""
    header = _MANY_HEAD.pack(FETCH_MANY_KIND, len(fetches))
    length = 4 + len(header) + sum(map(len, fetches))
    return b"".join((_LENGTHS.pack(length, len(header)), header, *fetches))


def _frame_parts(message: Message) -> list[Buffer]:
    """``message``'s frame in parts, joined once by ``encode``."""
    payload: list[Buffer] = []
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
    before buffering it.

    Frames are decoded from views of what was read: a read that holds
    whole frames (a follower's answers, a leader's fetches, in steady
    state) is not copied; only a frame cut short is buffered, and copied
    once when it is complete.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) >= 4:
                (length,) = _LENGTH.unpack_from(buffer)
                if 4 <= length <= MAX_FRAME_BYTES and len(buffer) < 4 + length:
                    return []  # the first frame is still incomplete
            data = bytes(buffer)
            buffer.clear()
        view = memoryview(data)
        messages: list[Message] = []
        position = 0
        while len(data) - position >= 4:
            (length,) = _LENGTH.unpack_from(data, position)
            if length > MAX_FRAME_BYTES or length < 4:
                raise ReplicationProtocolError(
                    f"frame length {length} outside 4..{MAX_FRAME_BYTES}"
                )
            end = position + 4 + length
            if end > len(data):
                break
            messages.append(_decode_frame(view[position + 4 : end], nested=False))
            position = end
        if position < len(data):
            buffer += view[position:]
        return messages


def _decode_frame(frame: memoryview, *, nested: bool) -> Message:
    """The message of one frame (without its length); a nested one (inside
    a FetchMany or FetchedMany) may not be another of those."""
    if len(frame) < 4:
        raise ReplicationProtocolError("frame shorter than its header length")
    (header_length,) = _LENGTH.unpack_from(frame)
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
        (length,) = _LENGTH.unpack_from(payload, position)
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
