"""The ceiling: a trio byte pump that splits frames but parses nothing.

Publishers' frames are forwarded verbatim to every subscriber; a connection
is a subscriber if its first frame after Hello is a Subscribe. This is the
least work any trio broker must do (read, split on length prefixes, write),
measured in the same run as Broky so the ratio means something on a noisy
machine. Run as ``python -m benchmarks.pump`` (prints "pump listening on H:P").
"""

from __future__ import annotations

import struct

import trio

from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.frames import Subscribe, Subscribed
from broky.protocol.framing import FrameReader, encode_preamble

_U32 = struct.Struct("<I")
#: Bytes buffered per subscriber before the pump drops (as Broky does).
MAX_BUFFERED = 4 << 20


class Subscriber:
    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = [encode_preamble()]
        self.buffered = 0
        self.wake = trio.Event()


class Pump:
    def __init__(self) -> None:
        self.subscribers: set[Subscriber] = set()

    async def handle(self, stream: trio.SocketStream) -> None:
        reader = FrameReader(64 << 20)
        data = await stream.receive_some(1 << 18)
        data = data[8:]
        frames = reader.feed(data)
        while len(frames) < 2:
            more = await stream.receive_some(1 << 18)
            if not more:
                return
            frames += reader.feed(more)
        first = decode_frame(frames[1])
        if isinstance(first, Subscribe):
            await self.serve_subscriber(stream, first.stream)
        else:
            self.forward(frames[1:])  # the first frame after Hello is already a Publish
            await self.serve_publisher(stream, reader)

    def forward(self, frames: list[memoryview]) -> None:
        if not frames:
            return
        parts: list[bytes | memoryview] = []
        size = 0
        for view in frames:
            parts.append(_U32.pack(len(view)))
            parts.append(view)
            size += 4 + len(view)
        for subscriber in self.subscribers:
            if subscriber.buffered + size > MAX_BUFFERED:
                continue
            subscriber.parts.extend(parts)
            subscriber.buffered += size
            subscriber.wake.set()

    async def serve_publisher(self, stream: trio.SocketStream, reader: FrameReader) -> None:
        while True:
            data = await stream.receive_some(1 << 18)
            if not data:
                return
            self.forward(reader.feed(data))

    async def serve_subscriber(self, stream: trio.SocketStream, stream_id: int) -> None:
        subscriber = Subscriber()
        subscriber.parts.append(encode_frame(Subscribed(stream_id)))
        self.subscribers.add(subscriber)
        try:
            while True:
                if not subscriber.parts:
                    await subscriber.wake.wait()
                    subscriber.wake = trio.Event()
                data = b"".join(subscriber.parts)
                subscriber.parts = []
                subscriber.buffered = 0
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass
        finally:
            self.subscribers.discard(subscriber)


async def main() -> None:
    pump = Pump()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    host, port = listeners[0].socket.getsockname()[:2]
    print(f"pump listening on {host}:{port}", flush=True)
    await trio.serve_listeners(pump.handle, listeners)


if __name__ == "__main__":
    trio.run(main)
