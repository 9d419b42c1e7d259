"""Latency histograms: HdrHistogram, so percentiles are honest to 3 digits.

Values are nanoseconds from 1 ns to 60 s with 3 significant digits (0.1%
relative error at every magnitude), the same histogram whatever the run's
length: memory is fixed, no sample is thrown away, and the tail (p99.9, max)
is exact to that precision rather than an average of a reservoir.
"""

from __future__ import annotations

from typing import Final

from hdrh.histogram import HdrHistogram

#: Largest latency recorded, in ns; anything above is clamped to it.
MAX_LATENCY_NS: Final = 60 * 10**9
#: Percentiles every report gives.
PERCENTILES: Final = (50.0, 90.0, 99.0, 99.9)


class LatencyHistogram:
    """Nanosecond latencies; encodes to bytes to cross a process boundary."""

    def __init__(self, histogram: HdrHistogram | None = None) -> None:
        self._histogram = histogram or HdrHistogram(1, MAX_LATENCY_NS, 3)

    def record(self, nanoseconds: int) -> None:
        """Add one sample (clamped to 1 ns .. MAX_LATENCY_NS)."""
        self._histogram.record_value(min(max(nanoseconds, 1), MAX_LATENCY_NS))

    def encode(self) -> bytes:
        """The histogram in HdrHistogram's compressed wire form."""
        return bytes(self._histogram.encode())

    @classmethod
    def decode(cls, data: bytes) -> LatencyHistogram:
        """The inverse of ``encode``."""
        return cls(HdrHistogram.decode(data))

    def merge(self, other: LatencyHistogram) -> None:
        """Add another histogram's samples to this one."""
        self._histogram.add(other._histogram)

    @property
    def count(self) -> int:
        """Samples recorded."""
        return int(self._histogram.get_total_count())

    def value_at(self, percentile: float) -> int:
        """The latency (ns) at ``percentile`` (0..100)."""
        return int(self._histogram.get_value_at_percentile(percentile))

    def summary(self) -> dict[str, float]:
        """p50/p90/p99/p99.9/max and the mean, in microseconds (JSON-ready)."""
        if not self.count:
            return {}
        summary = {f"p{p:g}_us": round(self.value_at(p) / 1000, 1) for p in PERCENTILES}
        summary["max_us"] = round(self._histogram.get_max_value() / 1000, 1)
        summary["mean_us"] = round(self._histogram.get_mean_value() / 1000, 1)
        return summary

    def distribution(self, points: int = 200) -> list[tuple[float, float]]:
        """(percentile, latency in us) pairs, denser towards the tail, for plots:
        percentiles 100 * (1 - 10**-x) for x evenly spaced from 0 to 5."""
        pairs = []
        for index in range(points + 1):
            percentile = 100.0 * (1 - 10 ** (-5.0 * index / points))
            pairs.append((percentile, self.value_at(percentile) / 1000))
        return pairs
