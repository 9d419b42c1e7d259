"""Reading received frames for forwarding: the broker's per-run loop.

``forwardable(views, limit, decode)`` turns the frames one read completed
into what a broker's ProtocolMachine hands over with ``receive_forwarding``:
each unacked, unstamped Publish frame whose runs are all laid out as chunks
(none with more than ``limit`` bytes of messages; 0: no bound) becomes a
ForwardPublish of EncodedRuns, consecutive ones of one stream merged into
one; every other frame is ``decode(view)``.

Two implementations do exactly the same: the C extension
``broky.protocol._forward`` (Cython, built by ``pip install`` where a
compiler is there) and the pure-Python one below, which runs where it is
not, on big-endian hosts, and when ``BROKY_PURE=1`` is set (CI runs the
hot-path tests both ways). ``IMPLEMENTATION`` says which one this process
uses.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence

from broky.protocol.chunks import read_forwardable_runs, read_runs_frame
from broky.protocol.constants import BodyType
from broky.protocol.frames import ForwardPublish, Frame, Received
from broky.protocol.framing import FrameReader

Decode = Callable[[memoryview], Frame]
_U32 = struct.Struct("<I")


def forwardable_pure(views: Sequence[memoryview], limit: int, decode: Decode) -> list[Received]:
    """The pure-Python implementation (see the module docstring)."""
    frames: list[Received] = []
    merged: ForwardPublish | None = None
    for view in views:
        head = read_runs_frame(view)
        if head is not None:
            body_type, stream, stamp, ack, count = head
            if body_type == BodyType.PUBLISH and not (stamp or ack):
                runs = read_forwardable_runs(view, count, limit)
                if runs is not None:
                    if merged is not None and merged.stream == stream:
                        merged.runs.extend(runs)
                    else:
                        merged = ForwardPublish(stream, runs)
                        frames.append(merged)
                    continue
        frames.append(decode(view))
        merged = None
    return frames


def walk_pure(
    view: memoryview, max_frame_bytes: int, limit: int, decode: Decode
) -> tuple[list[Received], int]:
    """The frames ``view`` holds whole, read as ``forwardable`` reads them,
    and where the first incomplete (or oversize) frame starts: the caller
    keeps that tail (FrameReader.keep_tail, which refuses an oversize one)."""
    views: list[memoryview] = []
    position, end = 0, len(view)
    while end - position >= 4:
        size = _U32.unpack_from(view, position)[0]
        if size > max_frame_bytes or end - position - 4 < size:
            break
        views.append(view[position + 4 : position + 4 + size])
        position += 4 + size
    return forwardable_pure(views, limit, decode), position


Walk = Callable[[memoryview, int, int, Decode], tuple[list[Received], int]]
Forwardable = Callable[[Sequence[memoryview], int, Decode], list[Received]]


def _compiled() -> tuple[Forwardable, Walk] | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        from broky.protocol import _forward  # noqa: PLC0415
    except ImportError:
        return None
    return _forward.forwardable, _forward.walk


compiled = _compiled()
forwardable_compiled, walk_compiled = compiled if compiled is not None else (None, None)
#: What this process uses: the compiled reader when it is there.
forwardable: Forwardable = forwardable_compiled or forwardable_pure
walk: Walk = walk_compiled or walk_pure
IMPLEMENTATION = "compiled" if compiled is not None else "pure"


def receive_forwarding(
    reader: FrameReader, data: bytes | bytearray, limit: int, decode: Decode
) -> list[Received]:
    """What ``reader.feed(data)`` completes, read as ``forwardable`` reads it
    (frames completed by one read merge only within that read)."""
    view = memoryview(data)
    frames: list[Received] = []
    if reader.buffered_bytes:
        first: list[memoryview] = []
        view = reader.complete_pending(view, first)
        if reader.buffered_bytes:
            return frames
        frames = forwardable(first, limit, decode)
    walked, position = walk(view, reader.max_frame_bytes, limit, decode)
    frames += walked
    reader.keep_tail(view[position:])
    return frames
