"""The busiest keys: per-key counters with a bounded number of keys.

Users ask for per-topic figures; a label per key would let a stream of
unique keys (``orders.<id>``) explode any metrics system. So the router
counts per key in a table of at most ``capacity`` keys (8 x K), and the
metrics show the K busiest.

Cost: once per run, not per message: one dict lookup and two additions for
a key already tracked (the router does those inline, calling ``count`` only
for a key not tracked yet, and for only one run in 64 of untracked keys:
``broky.router.fanout``). When a new key finds the table full,
the table is cut back to its K busiest keys (``heapq.nlargest``, O(capacity)),
which happens at most once per ``capacity - K`` new keys: O(log K) amortised.

Accuracy: a key's figures are exact while it stays tracked; they start
with the run that admitted it, so a key's first runs (on average 64 runs of
untracked keys go by per admission) are not in them. A key cut from
the table loses its counts and starts again from zero if it comes back, so a
figure is a lower bound for a key that has ever dropped out of the top K; a
hot key is never cut in favour of cold ones. Prometheus's ``rate()`` treats
such a restart as a counter reset.
"""

from __future__ import annotations

import heapq
from array import array
from typing import Final

import attrs

#: Keys tracked per key reported: the headroom that lets a newly busy key
#: build up a count before the next cut.
TRACKED_PER_REPORTED: Final = 8
#: Fewest keys tracked, whatever K is.
MIN_TRACKED: Final = 1024
#: Default number of busiest keys reported (K).
DEFAULT_TOP_TOPICS: Final = 10


@attrs.frozen
class TopicFigures:
    """What one key has carried since it entered the table."""

    key: str
    messages: int
    bytes: int


class TopicCounter:
    """Messages and bytes per key, for at most ``capacity`` keys; see the module docstring.

    Owned by the router (one thread): ``count`` is its hot-path call,
    ``top`` a read for metrics.
    """

    __slots__ = ("capacity", "cuts", "passed", "table", "top_k")

    def __init__(self, top_k: int = DEFAULT_TOP_TOPICS) -> None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.top_k = top_k
        self.capacity = max(TRACKED_PER_REPORTED * top_k, MIN_TRACKED)
        #: key -> [messages, bytes]; a mutable pair so that a hit updates in
        #: place. The router adds to a tracked key's pair itself (no call
        #: per run), so the dict is only ever changed in place, never
        #: replaced. An array of C integers, not a list: the compiled
        #: fan-out adds to it without allocating an int object per run.
        self.table: dict[bytes, array[int]] = {}
        #: How many times the table was cut back (for tests and curiosity).
        self.cuts = 0
        #: Runs of untracked keys the router passed uncounted since it last
        #: admitted one (broky.router.fanout: one in ADMIT_EVERY is admitted).
        self.passed = [0]

    def count(self, key: bytes, messages: int, size: int) -> None:
        """Add one run's messages and bytes to ``key``'s figures."""
        figures = self.table.get(key)
        if figures is None:
            if len(self.table) >= self.capacity:
                self._cut()
            self.table[key] = array("q", (messages, size))
            return
        figures[0] += messages
        figures[1] += size

    def _cut(self) -> None:
        keep = heapq.nlargest(self.top_k, self.table.items(), key=lambda item: item[1][0])
        self.table.clear()
        self.table.update(keep)
        self.cuts += 1

    def __len__(self) -> int:
        return len(self.table)

    def top(self, limit: int | None = None) -> list[TopicFigures]:
        """The busiest keys by messages, busiest first (``limit`` defaults to K)."""
        busiest = heapq.nlargest(
            limit or self.top_k, self.table.items(), key=lambda item: item[1][0]
        )
        return [
            TopicFigures(key.decode(errors="replace"), figures[0], figures[1])
            for key, figures in busiest
        ]
