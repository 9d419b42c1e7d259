"""The cyclic garbage collector's settings for a broker process.

A broker allocates a few objects per run it forwards or stores (the decoded
``Run`` and its views, a routing entry, a chunk), and almost none of them
form reference cycles: reference counting frees them. With CPython's default
thresholds (700, 10, 10) a collection still runs every 700 allocations, and
objects that live for one group-commit round (a few ms) survive into the
older generations, whose passes walk every long-lived object, the broker's
own modules and tables included. Measured on a durable publish of
one-message runs (``benchmarks/bench_durable.py``, 1,000 keys), that was
about a third of the broker's CPU.

So a broker process freezes what it imported (``gc.freeze``: modules,
classes and configuration are never collected) and collects less often. The
cost is memory held by cyclic garbage between passes, bounded by the
thresholds: at most ``GENERATION0`` young objects wait for a pass.
"""

from __future__ import annotations

import gc
from typing import Final

#: Allocations between generation-0 passes (CPython: 700). 10,000 lets a
#: round's objects die by reference counting before a pass looks at them.
GENERATION0: Final = 10_000
#: Generation-0 passes between generation-1 passes (CPython: 10).
GENERATION1: Final = 20
#: Generation-1 passes between full passes (CPython: 10); a full pass also
#: waits until a quarter of the long-lived objects are new.
GENERATION2: Final = 100


def tune_collector() -> None:
    """Freeze everything allocated so far and set the broker's thresholds.

    Call once a process has imported and configured itself, before it
    serves: what is frozen then is never walked again.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GENERATION0, GENERATION1, GENERATION2)
