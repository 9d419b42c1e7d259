"""Load generators for the benchmarks: each runs in its own process.

Pre-encoded publishers write ready-made Publish frames with blocking
``sendall`` (C speed, so the broker is the bottleneck); raw subscribers count
messages per frame, not per message, so they keep up with the broker; client
publishers go through the real client library. Counters are shared
``multiprocessing.Value``s sampled by the parent at the start and end of the
measurement window.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Sequence
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

import trio

from broky.client.client import connect
from broky.protocol.codec import decode_frame, encode_frame, encode_run_chunk, runs_frame_parts
from broky.protocol.constants import BodyType, SlowConsumerPolicy
from broky.protocol.frames import Deliver, Hello, Notice, Publish, Subscribe, Subscribed
from broky.protocol.framing import FrameReader, encode_preamble
from broky.protocol.message import encode_message, pack_sizes

RECEIVE_BYTES = 1 << 20


def publish_frame(key: str, payload_size: int, messages_per_run: int) -> bytes:
    """One Publish frame holding one run of identical messages."""
    message = encode_message(b"x" * payload_size)
    chunk = encode_run_chunk(
        key.encode(), 0, pack_sizes([len(message)] * messages_per_run), message * messages_per_run
    )
    return b"".join(runs_frame_parts(BodyType.PUBLISH, 1, [chunk]))


def _open(address: tuple[str, int], first_frames: Sequence[bytes]) -> socket.socket:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(encode_preamble() + b"".join(first_frames))
    return sock


def raw_publisher(
    address: tuple[str, int],
    key: str,
    payload_size: int,
    messages_per_run: int,
    rate: float,
    sent: Synchronized[int],
    stop: Event,
) -> None:
    """Write pre-encoded Publish frames at ``rate`` messages/s (0: as fast as
    the broker reads them)."""
    frame = publish_frame(key, payload_size, messages_per_run)
    sock = _open(address, [encode_frame(Hello(client_name="bench-pub"))])
    sock.settimeout(0.5)
    start = time.perf_counter()
    count = 0
    while not stop.is_set():
        if rate:
            ahead = count / rate - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
        try:
            sock.sendall(frame)
        except TimeoutError:
            break
        count += messages_per_run
        sent.value = count
    sock.close()


def raw_subscribers(
    address: tuple[str, int],
    patterns: Sequence[str],
    received: Synchronized[int],
    dropped: Synchronized[int],
    ready: Event,
    stop: Event,
) -> None:
    """One socket per pattern; count delivered and dropped messages per frame."""
    selector = selectors.DefaultSelector()
    readers = {}
    sockets: dict[int, socket.socket] = {}
    for stream, pattern in enumerate(patterns, start=1):
        sock = _open(
            address,
            [
                encode_frame(Hello(client_name="bench-sub")),
                encode_frame(Subscribe(stream, pattern.encode(), SlowConsumerPolicy.DROP, 0)),
            ],
        )
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        readers[sock] = [FrameReader(64 << 20), False]
        sockets[sock.fileno()] = sock
    ready_count = 0
    while not stop.is_set():
        for key, _ in selector.select(0.1):
            sock = sockets[key.fd]
            data = sock.recv(RECEIVE_BYTES)
            if not data:
                selector.unregister(sock)
                continue
            state = readers[sock]
            reader = state[0]
            assert isinstance(reader, FrameReader)
            if not state[1]:
                data = data[8:]  # the broker's preamble
                state[1] = True
            count = 0
            for view in reader.feed(data):
                frame = decode_frame(view)
                if isinstance(frame, (Deliver, Publish)):
                    count += sum(run.count for run in frame.runs)
                elif isinstance(frame, Notice):
                    dropped.value += frame.count
                elif isinstance(frame, Subscribed):
                    ready_count += 1
                    if ready_count == len(patterns):
                        ready.set()
            received.value += count
    for sock in sockets.values():
        sock.close()


def client_publisher(
    address: tuple[str, int],
    key: str,
    payload_size: int,
    rate: float,
    sent: Synchronized[int],
    stop: Event,
) -> None:
    """Publish through the client library at ``rate`` messages/s (0: flat out)."""

    async def run() -> None:
        payload = b"x" * payload_size
        count = 0
        start = time.perf_counter()
        async with connect(f"{address[0]}:{address[1]}", name="bench-client-pub") as client:
            while not stop.is_set():
                for _ in range(500):
                    await client.publish(key, payload)
                count += 500
                sent.value = count
                if rate:
                    ahead = count / rate - (time.perf_counter() - start)
                    if ahead > 0:
                        await trio.sleep(ahead)
            await client.flush()

    trio.run(run)


def wait_for(predicate: object, timeout: float) -> None:
    """Poll a zero-argument callable until it returns true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise TimeoutError("benchmark setup timed out")
