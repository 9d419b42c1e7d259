"""A subscription's common take: the front runs that fit one write, in one sweep.

``sweep(runs, budget, frame_room)`` looks at a subscription's queued runs
from the front while fewer than ``budget`` bytes are gathered (the last run
may overshoot it, as a write batch may). If the gathered chunks also fit one
Deliver frame (``frame_room`` bytes of runs, 4 bytes of offset each), it
removes them from ``runs`` and returns ``(chunks, bytes, messages)``; if
not, it leaves ``runs`` alone and returns None, and the caller takes them
run by run, splitting and framing as needed. Without flow control this is
every take under load: at many keys one run per message, so this per-run
loop is worth a compiled twin.

Two implementations do exactly the same: the C extension
``broky.router._fanout`` (Cython) and ``sweep_pure``, which runs where it is
not built and with ``BROKY_PURE=1``; a hypothesis property holds them equal.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable

from broky.protocol.frames import EncodedRun

Sweep = Callable[["deque[EncodedRun]", int, int], "tuple[list[bytes], int, int] | None"]


def sweep_pure(
    runs: deque[EncodedRun], budget: int, frame_room: int
) -> tuple[list[bytes], int, int] | None:
    """The pure-Python implementation (see the module docstring)."""
    chunks: list[bytes] = []
    taken_bytes = taken_messages = 0
    for run in runs:
        taken_bytes += len(run.chunk)
        taken_messages += run.count
        chunks.append(run.chunk)
        if taken_bytes >= budget:
            break
    if taken_bytes + 4 * len(chunks) > frame_room:
        return None
    if len(chunks) == len(runs):
        runs.clear()
    else:
        for _ in range(len(chunks)):
            runs.popleft()
    return chunks, taken_bytes, taken_messages


def _compiled() -> Sweep | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        from broky.router import _fanout  # noqa: PLC0415
    except ImportError:
        return None
    if getattr(_fanout, "RUN_TYPE", None) is not EncodedRun:
        return None  # built from older sources (a stale editable build): not this run type
    return _fanout.sweep


sweep_compiled = _compiled()
#: What this process uses: the compiled loop when it is there.
sweep: Sweep = sweep_compiled or sweep_pure
