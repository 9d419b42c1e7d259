"""Event-loop lag: how late a task that asked to wake up actually woke.

The router runs on the broker's trio thread, so loop lag is router lag: a
batch that hogs the loop delays every connection. The probe sleeps
``interval`` seconds at a time and records how much longer the sleep took,
into fixed Prometheus-style buckets (bounded memory, cumulative counts).
"""

from __future__ import annotations

from collections import deque
from typing import Final

import trio

#: Seconds between probes: often enough to catch a stall, rare enough to cost nothing.
DEFAULT_PROBE_INTERVAL: Final = 0.1
#: Upper bounds of the histogram's buckets, in seconds (+Inf is implied).
LAG_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: Samples kept for ``recent_max`` (10 s at the default interval).
RECENT_SAMPLES: Final = 100


class LoopLagProbe:
    """Measures loop lag; read by the metrics collector and the ``$SYS`` snapshot."""

    def __init__(self, interval: float = DEFAULT_PROBE_INTERVAL) -> None:
        self.interval = interval
        #: Cumulative count per bucket of LAG_BUCKETS, then the +Inf bucket.
        self.bucket_counts = [0] * (len(LAG_BUCKETS) + 1)
        self.samples = 0
        self.total_seconds = 0.0
        self._recent: deque[float] = deque(maxlen=RECENT_SAMPLES)

    def record(self, lag: float) -> None:
        """Count one sample (seconds late)."""
        self.samples += 1
        self.total_seconds += lag
        self._recent.append(lag)
        for index, bound in enumerate(LAG_BUCKETS):
            if lag <= bound:
                self.bucket_counts[index] += 1
        self.bucket_counts[-1] += 1

    @property
    def recent_max(self) -> float:
        """The worst lag among the last RECENT_SAMPLES samples."""
        return max(self._recent, default=0.0)

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            expected = trio.current_time() + self.interval
            await trio.sleep(self.interval)
            self.record(max(trio.current_time() - expected, 0.0))
