"""Per-principal quotas: connections at once, and bytes received per second.

Set in a user's ``[[users]]`` table (``max_connections``,
``max_ingress_bytes_per_second``; 0 or absent: no quota of its own). Both
are counted per worker process, as Kafka counts its quotas per broker: a
worker enforces them without asking the others, so a node of N workers lets
a principal have up to N times each quota.

A principal over its byte rate is throttled, not refused: its connections
stop being read until the excess has drained at the rate, so TCP pushes back
on the publisher (Kafka's quotas delay responses to the same end). Nothing
is dropped and nothing fails; the pause is taken once per received chunk,
never per message. A principal's connections share one bucket, so opening
more connections buys no more bandwidth.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

import attrs

#: Seconds of traffic the bucket holds: the burst allowed after a quiet spell.
BURST_SECONDS: Final = 1.0


@attrs.frozen(slots=True)
class Quotas:
    """One principal's quotas (0: none)."""

    max_connections: int = 0
    max_ingress_bytes_per_second: int = 0


NO_QUOTAS: Final = Quotas()


class TokenBucket:
    """The bytes a principal may still send now: refilled at ``rate`` per
    second, holding at most BURST_SECONDS' worth."""

    def __init__(self, rate: int, now: float) -> None:
        self.rate = rate
        self.capacity = rate * BURST_SECONDS
        self.level = self.capacity
        self.stamp = now

    def charge(self, size: int, now: float) -> float:
        """Take ``size`` received bytes; the seconds to pause reading (0: none).

        The level may go negative (a chunk arrived whole); the pause is the
        time the debt takes to refill, so the average rate holds exactly.
        """
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        self.level -= size
        return 0.0 if self.level >= 0 else -self.level / self.rate


class QuotaLedger:
    """One worker's count of each principal's connections, and their shared
    byte buckets. Touched only from the worker's trio thread."""

    def __init__(self) -> None:
        self._connections: Counter[str] = Counter()
        self._buckets: dict[str, TokenBucket] = {}

    def admit(self, name: str, quotas: Quotas) -> str | None:
        """Count a new connection of ``name``; why it is refused, or None."""
        limit = quotas.max_connections
        if limit and self._connections[name] >= limit:
            return (
                f"user {name!r} already has {limit} connection(s) to this worker, its "
                "max_connections: close one first"
            )
        self._connections[name] += 1
        return None

    def release(self, name: str) -> None:
        """A connection ``admit`` counted has closed."""
        self._connections[name] -= 1
        if self._connections[name] <= 0:
            del self._connections[name]
            self._buckets.pop(name, None)

    def connections(self, name: str) -> int:
        """How many connections ``name`` has here now."""
        return self._connections[name]

    def bucket(self, name: str, quotas: Quotas, now: float) -> TokenBucket | None:
        """The bucket ``name``'s connections share (None: no byte rate quota).
        A changed rate (a reload) starts a fresh bucket."""
        rate = quotas.max_ingress_bytes_per_second
        if not rate:
            self._buckets.pop(name, None)
            return None
        bucket = self._buckets.get(name)
        if bucket is None or bucket.rate != rate:
            bucket = self._buckets[name] = TokenBucket(rate, now)
        return bucket
