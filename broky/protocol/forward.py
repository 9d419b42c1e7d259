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
from collections.abc import Callable, Sequence

from broky.protocol.chunks import read_forwardable_runs, read_runs_frame
from broky.protocol.constants import BodyType
from broky.protocol.frames import ForwardPublish, Frame, Received

Decode = Callable[[memoryview], Frame]


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


def _compiled() -> Callable[[Sequence[memoryview], int, Decode], list[Received]] | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        from broky.protocol._forward import forwardable as compiled  # noqa: PLC0415
    except ImportError:
        return None
    return compiled


forwardable_compiled = _compiled()
#: What this process uses: the compiled reader when it is there.
forwardable = forwardable_compiled or forwardable_pure
IMPLEMENTATION = "compiled" if forwardable_compiled is not None else "pure"
