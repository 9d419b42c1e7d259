"""Runs of durable topics as the router queues them: where each lives in its log."""

from __future__ import annotations

from broky.protocol.frames import EncodedRun


class DurableEncodedRun(EncodedRun):
    """A run of a durable topic after its append: where it lives in the log.

    ``log`` identifies the partition (its owner object), so that a replaying
    subscription can tell which runs it already read from the log.

    A plain class, not attrs: its base is the compiled ``EncodedRun`` where
    that is built, whose fields attrs cannot see.
    """

    __slots__ = ("base_offset", "log")

    def __init__(self, key: bytes, count: int, chunk: bytes, log: object, base_offset: int) -> None:
        super().__init__(key, count, chunk)
        self.log = log
        self.base_offset = base_offset

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, DurableEncodedRun)
        return (self.key, self.count, self.chunk, self.log, self.base_offset) == (
            other.key,
            other.count,
            other.chunk,
            other.log,
            other.base_offset,
        )

    __hash__ = None

    def __repr__(self) -> str:
        return (
            f"DurableEncodedRun(key={self.key!r}, count={self.count!r}, chunk={self.chunk!r}, "
            f"log={self.log!r}, base_offset={self.base_offset!r})"
        )
