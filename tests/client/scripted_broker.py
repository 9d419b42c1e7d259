"""A scripted broker for consumer tests: the broker's side of one
connection, built on the server-side ProtocolMachine, answering Hello,
Consume, Settle and Ping as docs/protocol.md says a broker does and
recording every other frame the client sends.
"""

from __future__ import annotations

from typing import TypeVar

import trio

from broky.protocol.codec import encode_frame
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES, ErrorCode
from broky.protocol.frames import (
    Consume,
    Deliver,
    Error,
    Frame,
    Hello,
    Ping,
    Pong,
    Run,
    Settle,
    Settled,
    Subscribed,
    Welcome,
)

F = TypeVar("F")


class ScriptedBroker:
    """The broker's side of one connection, as far as consumers need it."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.machine = ProtocolMachine(Role.SERVER, DEFAULT_MAX_FRAME_BYTES)
        self.received: list[Frame] = []
        self.refuse: str = ""
        self.receipts = True
        #: Runs delivered to each consumer right after its Subscribed.
        self.deliver_on_consume: tuple[Run, ...] = ()
        self._changed = trio.Event()

    async def serve(self) -> None:
        await self.stream.send_all(self.machine.initiate())
        while data := await self.stream.receive_some(65536):
            for frame in self.machine.receive_data(data):
                await self._handle(frame)

    async def _handle(self, frame: Frame) -> None:
        if isinstance(frame, Hello):
            await self.send(Welcome())
            return
        if isinstance(frame, Ping):
            await self.send(Pong(frame.nonce))
            return
        self.received.append(frame)
        self._changed.set()
        if isinstance(frame, Consume):
            if self.refuse:
                await self.send(Error(ErrorCode.SUBSCRIPTION_REFUSED, self.refuse, frame.stream))
            else:
                await self.send(Subscribed(frame.stream))
                if self.deliver_on_consume:
                    await self.send(Deliver(frame.stream, self.deliver_on_consume))
        elif isinstance(frame, Settle) and self.receipts:
            await self.send(Settled(frame.stream, frame.sequence, stale=1))

    async def send(self, frame: Frame) -> None:
        await self.stream.send_all(encode_frame(frame))

    def of(self, kind: type[F]) -> list[F]:
        return [frame for frame in self.received if isinstance(frame, kind)]

    async def wait_for(self, kind: type[F], count: int = 1) -> list[F]:
        while len(self.of(kind)) < count:
            self._changed = trio.Event()
            await self._changed.wait()
        return self.of(kind)
