"""Reading received frames for forwarding: the broker's per-run loop.

``walk(view, max_frame_bytes, limit, decode)`` reads the whole frames at the
start of ``view`` (size-prefixed) the way a broker's ProtocolMachine hands
them over with ``receive_forwarding``: an unacked, unstamped Publish frame
whose runs are all laid out as chunks (none with more than ``limit`` bytes
of messages; 0: no bound) becomes a ForwardPublish of EncodedRuns,
consecutive ones of one stream merged into one; every other frame is
``decode(frame)``. It stops at the first incomplete frame or one over
``max_frame_bytes`` and returns where that is. With ``deliveries`` it reads
Deliver frames that way instead (a router's link receiving the runs another
router forwards).

Consecutive runs of one ForwardPublish with the same key and ts_broker are
coalesced into one run (up to ``MAX_COALESCED_BYTES`` of messages), exactly
as if the publisher had sent them as one: a publisher sending one message
per frame then costs the router, the writer and every subscriber one run per
read instead of one per message. Order is kept; only run boundaries move,
and nothing in the protocol gives them meaning.

Two implementations do exactly the same: the C extension
``broky.protocol._forward`` (Cython, built by ``pip install`` where a
compiler is there) and ``walk_pure`` below, which runs where it is not, on
big-endian hosts, and when ``BROKY_PURE=1`` is set (CI runs the hot-path
tests both ways). ``IMPLEMENTATION`` says which one this process uses.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Final, Protocol

from broky.protocol.chunk_reading import ChunkParts, read_forwardable, read_runs_frame
from broky.protocol.chunks import encode_run_chunk
from broky.protocol.constants import BodyType
from broky.protocol.frames import EncodedRun, ForwardPublish, Frame, Received
from broky.protocol.framing import FrameReader

Decode = Callable[[memoryview], Frame]


class Walk(Protocol):
    """The signature both implementations share."""

    def __call__(
        self,
        view: memoryview,
        max_frame_bytes: int,
        limit: int,
        decode: Decode,
        deliveries: bool = False,
    ) -> tuple[list[Received], int]: ...


_U32 = struct.Struct("<I")
#: Most message bytes a coalesced run gathers: enough that a run's fixed
#: costs vanish per message, small enough that splitting one for a
#: subscriber's frame or credit stays cheap.
MAX_COALESCED_BYTES: Final = 64 * 1024
#: Most messages a coalesced run gathers (zero-length messages have no bytes).
MAX_COALESCED_MESSAGES: Final = 4096


class _Coalescer:
    """Consecutive chunk runs of one ForwardPublish, gathered into EncodedRuns."""

    def __init__(self) -> None:
        self.group: list[ChunkParts] = []
        self.group_bytes = 0
        self.group_messages = 0

    def add(self, parts: ChunkParts, into: list[EncodedRun]) -> None:
        key, ts_broker, count, _, messages, _ = parts
        group = self.group
        if group and (
            key != group[0][0]
            or ts_broker != group[0][1]
            or self.group_bytes + len(messages) > MAX_COALESCED_BYTES
            or self.group_messages + count > MAX_COALESCED_MESSAGES
            or len(group) == MAX_COALESCED_MESSAGES  # runs of no messages
        ):
            self.flush(into)
        self.group.append(parts)
        self.group_bytes += len(messages)
        self.group_messages += count

    def flush(self, into: list[EncodedRun]) -> None:
        group = self.group
        if not group:
            return
        key, ts_broker, count, _, _, chunk = group[0]
        if len(group) == 1:
            into.append(EncodedRun(key, count, bytes(chunk)))
        else:
            into.append(
                EncodedRun(
                    key,
                    self.group_messages,
                    encode_run_chunk(
                        key,
                        ts_broker,
                        b"".join(parts[3] for parts in group),
                        b"".join(parts[4] for parts in group),
                    ),
                )
            )
        self.group = []
        self.group_bytes = self.group_messages = 0


def walk_pure(
    view: memoryview, max_frame_bytes: int, limit: int, decode: Decode, deliveries: bool = False
) -> tuple[list[Received], int]:
    """The pure-Python implementation (see the module docstring)."""
    wanted = BodyType.DELIVER if deliveries else BodyType.PUBLISH
    frames: list[Received] = []
    merged: ForwardPublish | None = None
    coalescer = _Coalescer()
    position, end = 0, len(view)
    while end - position >= 4:
        size = _U32.unpack_from(view, position)[0]
        if size > max_frame_bytes or end - position - 4 < size:
            break
        frame = view[position + 4 : position + 4 + size]
        position += 4 + size
        head = read_runs_frame(frame)
        if head is not None:
            body_type, stream, stamp, ack, count = head
            if body_type == wanted and not (stamp or ack):
                runs = read_forwardable(frame, count, limit)
                if runs is not None:
                    if merged is None or merged.stream != stream:
                        if merged is not None:
                            coalescer.flush(merged.runs)
                        merged = ForwardPublish(stream, [])
                        frames.append(merged)
                    for parts in runs:
                        coalescer.add(parts, merged.runs)
                    continue
        if merged is not None:
            coalescer.flush(merged.runs)
            merged = None
        frames.append(decode(frame))
    if merged is not None:
        coalescer.flush(merged.runs)
    return frames, position


def _compiled() -> Walk | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        from broky.protocol import _forward  # noqa: PLC0415
    except ImportError:
        return None
    return _forward.walk


walk_compiled = _compiled()
#: What this process uses: the compiled reader when it is there.
walk: Walk = walk_compiled or walk_pure
IMPLEMENTATION = "compiled" if walk_compiled is not None else "pure"


def receive_forwarding(
    reader: FrameReader,
    data: bytes | bytearray,
    limit: int,
    decode: Decode,
    deliveries: bool = False,
) -> list[Received]:
    """What ``reader.feed(data)`` completes, read as ``walk`` reads it
    (frames completed by different reads are never merged)."""
    view = memoryview(data)
    frames: list[Received] = []
    if reader.buffered_bytes:
        completed: list[memoryview] = []
        view = reader.complete_pending(view, completed)
        if not completed:
            return frames
        # The completed frame is a view past the size prefix of its own
        # buffer: walk that buffer whole.
        framed = memoryview(completed[0].obj)
        frames, _ = walk(framed, len(framed), limit, decode, deliveries)
    walked, position = walk(view, reader.max_frame_bytes, limit, decode, deliveries)
    frames += walked
    reader.keep_tail(view[position:])
    return frames
