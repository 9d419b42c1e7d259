"""A raw-frame consumer of durable subscriptions, for tests over real sockets.

Speaks ``Consume`` / ``Deliver`` / ``Redelivered`` / ``Settle`` /
``Settled`` itself (the client library's consumer is built elsewhere), so a
test sees exactly what the broker sends.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from broky import Config
from broky.protocol.constants import SettleKind, StartKind, SubscriptionKind
from broky.protocol.frames import (
    Consume,
    Deliver,
    Error,
    Flow,
    Frame,
    Redelivered,
    Settle,
    Settled,
    Subscribed,
    Unsubscribe,
)
from broky.protocol.message import decode_run
from tests.conftest import RawConnection


def subscriptions_config(data_dir: Path, partitions: int = 2, **policy: Any) -> Config:
    table = {"name": "orders", "pattern": "orders.>", "partitions": partitions, **policy}
    return Config.from_mapping(
        {"port": 0, "data_dir": str(data_dir), "durable": [table], "system_events": True}
    )


@attrs.frozen
class Delivery:
    partition: int
    offset: int
    count: int
    key: str
    payload: bytes
    key_partition: bytes
    tags: tuple[tuple[str, str], ...]


def ranges(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted offsets as inclusive ranges."""
    found: list[tuple[int, int]] = []
    for offset in sorted(set(offsets)):
        if found and found[-1][1] == offset - 1:
            found[-1] = (found[-1][0], offset)
        else:
            found.append((offset, offset))
    return found


class Consumer:
    """One consumer stream on a raw connection (one consumer per connection)."""

    def __init__(self, raw: RawConnection, stream: int = 1) -> None:
        self.raw = raw
        self.stream = stream
        self._counts: dict[tuple[int, int], int] = {}
        self.errors: list[Error] = []
        self.receipts: list[Settled] = []
        #: Called with each Settled as it arrives (else they pile up in ``receipts``).
        self.on_settled: Callable[[Settled], None] | None = None
        self._sequence = 0

    async def consume(self, subscription: str, **fields: Any) -> Frame:
        """Send Consume; the broker's answer (Subscribed or an Error)."""
        fields.setdefault("pattern", b"orders.>")
        await self.raw.send_frame(Consume(self.stream, subscription, **fields))
        while True:
            frame = await self.raw.receive_frame()
            if isinstance(frame, Subscribed | Error):
                return frame

    async def next(self) -> list[Delivery]:
        """The messages of the next Deliver frame (errors and receipts are kept)."""
        while True:
            frame = await self.raw.receive_frame()
            if isinstance(frame, Redelivered):
                for partition, offset, count in zip(
                    frame.partitions, frame.offsets, frame.counts, strict=True
                ):
                    self._counts[(partition, offset)] = count
            elif isinstance(frame, Deliver):
                found = []
                for run in frame.runs:
                    for message in decode_run(run):
                        where = (message.partition, message.offset)
                        found.append(
                            Delivery(
                                message.partition,
                                message.offset,
                                self._counts.pop(where, 1),
                                message.key,
                                message.payload,
                                message.key_partition,
                                message.tags,
                            )
                        )
                return found
            elif isinstance(frame, Error):
                self.errors.append(frame)
            elif isinstance(frame, Settled):
                if self.on_settled is not None:
                    self.on_settled(frame)
                else:
                    self.receipts.append(frame)

    async def take(self, count: int) -> list[Delivery]:
        found: list[Delivery] = []
        while len(found) < count:
            found.extend(await self.next())
        return found

    async def take_all(self, quiet: float) -> list[Delivery]:
        """Every delivery until none came for ``quiet`` seconds."""
        found: list[Delivery] = []
        while True:
            with trio.move_on_after(quiet) as waited:
                found.extend(await self.next())
            if waited.cancelled_caught:
                return found

    async def settle(
        self,
        deliveries: Iterable[Delivery],
        kind: SettleKind = SettleKind.ACK,
        *,
        receipt: bool = False,
        delay_ms: int = -1,
        reason: str = "",
    ) -> int:
        """Settle ``deliveries`` as ranges in one frame; the sequence (0: no receipt)."""
        entries = [
            (partition, first, last)
            for partition in sorted({d.partition for d in deliveries})
            for first, last in ranges(d.offset for d in deliveries if d.partition == partition)
        ]
        sequence = 0
        if receipt:
            self._sequence += 1
            sequence = self._sequence
        await self.raw.send_frame(
            Settle(
                self.stream,
                sequence=sequence,
                kind=kind,
                partitions=tuple(e[0] for e in entries),
                first_offsets=tuple(e[1] for e in entries),
                last_offsets=tuple(e[2] for e in entries),
                delay_ms=delay_ms,
                reason=reason,
                topic="orders",
            )
        )
        return sequence

    async def receipt(self, sequence: int) -> Settled:
        """Wait for the Settled of ``sequence`` (deliveries meanwhile are lost: use
        only when nothing else is expected)."""
        while True:
            for settled in self.receipts:
                if settled.sequence == sequence:
                    return settled
            frame = await self.raw.receive_frame()
            if isinstance(frame, Settled):
                self.receipts.append(frame)
            elif isinstance(frame, Error):
                self.errors.append(frame)

    async def flow(self, credit: int) -> None:
        await self.raw.send_frame(Flow(self.stream, credit))

    async def close(self) -> None:
        await self.raw.send_frame(Unsubscribe(self.stream))


@asynccontextmanager
async def connect(address: tuple[str, int], name: str = "consumer") -> AsyncIterator[RawConnection]:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    await sock.connect(address)
    stream = trio.SocketStream(sock)
    try:
        raw = RawConnection(stream)
        await raw.handshake(name)
        yield raw
    finally:
        await stream.aclose()


__all__ = [
    "Consumer",
    "Delivery",
    "StartKind",
    "SubscriptionKind",
    "connect",
    "ranges",
    "subscriptions_config",
]
