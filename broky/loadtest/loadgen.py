"""Load generators for ``broky bench`` and the benchmarks: each runs in its own process.

Pre-encoded publishers write ready-made Publish frames with blocking
``sendall`` (C speed, so the broker is the bottleneck); raw subscribers count
messages per frame, not per message, so they keep up with the broker; client
publishers go through the real client library. Counters are shared
``multiprocessing.Value``s sampled by the parent at the start and end of the
measurement window. Against a broker with TLS (``broky bench --address
--tls-ca``), each generator takes the ``tls`` context: blocking sockets are
wrapped with it, client-library ones pass it to ``connect``.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from functools import partial
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

import trio

from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.subscription import Subscription as ClientSubscription
from broky.loadtest.histogram import LatencyHistogram
from broky.protocol.codec import decode_frame, encode_frame, encode_run_chunk, runs_frame_parts
from broky.protocol.constants import BodyType, SlowConsumerPolicy
from broky.protocol.frames import Deliver, Notice, Publish, Subscribe, Subscribed
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


def _secure(
    sock: socket.socket, address: tuple[str, int], tls: ssl.SSLContext | None
) -> socket.socket:
    """``sock``, connected to ``address``, wrapped in TLS when ``tls`` is given."""
    if tls is None:
        return sock
    return tls.wrap_socket(sock, server_hostname=address[0])


def _open(
    address: tuple[str, int], first_frames: Sequence[bytes], tls: ssl.SSLContext | None
) -> socket.socket:
    sock = _secure(socket.create_connection(address), address, tls)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(encode_preamble() + b"".join(first_frames))
    return sock


def _receive(sock: socket.socket) -> bytes | None:
    """What a readable socket holds (b"" at EOF), or None when that is not
    yet a whole TLS record: the selector reported bytes, not plaintext."""
    try:
        return sock.recv(RECEIVE_BYTES)
    except ssl.SSLWantReadError:
        return None


def raw_publisher(
    address: tuple[str, int],
    key: str,
    payload_size: int,
    messages_per_run: int,
    rate: float,
    sent: Synchronized[int],
    stop: Event,
    limit: int = 0,
    *,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """Write pre-encoded Publish frames at ``rate`` messages/s (0: as fast as
    the broker reads them), until ``stop`` or ``limit`` messages (0: none)."""
    frame = publish_frame(key, payload_size, messages_per_run)
    sock = _open(address, [encode_frame(credentials.hello("bench-pub"))], tls)
    sock.settimeout(0.5)
    paced_sends(partial(sock.sendall, frame), messages_per_run, rate, sent, stop, limit)
    _close_gently(sock)


def paced_sends(
    send: Callable[[], object],
    messages_per_send: int,
    rate: float,
    sent: Synchronized[int],
    stop: Event,
    limit: int = 0,
) -> None:
    """Call ``send`` (one batch of ``messages_per_send``) at ``rate``
    messages/s (0: back to back) until ``stop``, ``limit`` messages (0: no
    limit) or a socket error; ``sent`` counts the messages sent."""
    start = time.perf_counter()
    count = 0
    while not stop.is_set() and not (limit and count >= limit):
        if rate:
            ahead = count / rate - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
        try:
            send()
        except OSError:  # timed out or cut off: the run is over for this publisher
            break
        count += messages_per_send
        sent.value = count


def stop_process(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """Terminate a server we started, by PID; kill it after 5 s."""
    process.terminate()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _close_gently(sock: socket.socket) -> None:
    """Half-close and wait for the broker's EOF: closing a socket with unread
    input (the Welcome) sends a reset, and the broker would lose whatever it
    had not yet read."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(2.0)
        while sock.recv(RECEIVE_BYTES):
            pass
    except OSError:
        pass
    finally:
        sock.close()


def raw_subscribers(
    address: tuple[str, int],
    patterns: Sequence[str],
    received: Synchronized[int],
    dropped: Synchronized[int],
    ready: Event,
    stop: Event,
    *,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """One socket per pattern; count delivered and dropped messages per frame."""
    selector = selectors.DefaultSelector()
    readers = {}
    sockets: dict[int, socket.socket] = {}
    for stream, pattern in enumerate(patterns, start=1):
        sock = _open(
            address,
            [
                encode_frame(credentials.hello("bench-sub")),
                encode_frame(Subscribe(stream, pattern.encode(), SlowConsumerPolicy.DROP, 0)),
            ],
            tls,
        )
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        readers[sock] = [FrameReader(64 << 20), False]
        sockets[sock.fileno()] = sock
    ready_count = 0
    while not stop.is_set():
        for key, _ in selector.select(0.1):
            sock = sockets[key.fd]
            data = _receive(sock)
            if data is None:
                continue
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
    *,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """Publish through the client library at ``rate`` messages/s (0: flat out)."""

    async def run() -> None:
        payload = b"x" * payload_size
        count = 0
        start = time.perf_counter()
        async with credentials.connect(
            f"{address[0]}:{address[1]}", "bench-client-pub", tls
        ) as client:
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


def slow_subscriber(
    address: tuple[str, int],
    pattern: str,
    read_bytes: int,
    pause: float,
    received: Synchronized[int],
    dropped: Synchronized[int],
    ready: Event,
    stop: Event,
    *,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """A subscriber that reads ``read_bytes`` every ``pause`` seconds through
    a small socket buffer: it falls behind any fast stream, and the broker's
    Notices tell how much it lost."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.connect(address)
    sock = _secure(sock, address, tls)
    sock.sendall(
        encode_preamble()
        + encode_frame(credentials.hello("bench-slow-sub"))
        + encode_frame(Subscribe(1, pattern.encode(), SlowConsumerPolicy.DROP, 0))
    )
    sock.settimeout(0.2)
    reader = FrameReader(64 << 20)
    preamble = True
    while not stop.is_set():
        try:
            data = sock.recv(read_bytes)
        except TimeoutError:
            continue
        if not data:
            break
        if preamble:
            data, preamble = data[8:], False
        for view in reader.feed(data):
            frame = decode_frame(view)
            if isinstance(frame, Deliver):
                received.value += sum(run.count for run in frame.runs)
            elif isinstance(frame, Notice):
                dropped.value += frame.count
            elif isinstance(frame, Subscribed):
                ready.set()
        time.sleep(pause)
    sock.close()


def latency_publisher(
    address: tuple[str, int],
    key: str,
    payload_size: int,
    rate: float,
    sent: Synchronized[int],
    stop: Event,
    limit: int = 0,
    *,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """Publish through the client library at a fixed ``rate``, each message
    stamped with ``ts_producer`` = the time it was *due* (ns since the epoch).

    Stamping the due time, not the send time, avoids coordinated omission: if
    the publisher (or the broker pushing back on it) falls behind, the
    messages sent late carry that delay in their latency instead of hiding
    it. Every message due by now is published before the next sleep.
    """

    async def run() -> None:
        payload = b"x" * payload_size
        period_ns = round(1e9 / rate)
        count = 0
        async with credentials.connect(
            f"{address[0]}:{address[1]}", "bench-latency-pub", tls
        ) as client:
            epoch_offset = time.time_ns() - round(trio.current_time() * 1e9)
            due = round(trio.current_time() * 1e9)
            while not stop.is_set() and not (limit and count >= limit):
                now = round(trio.current_time() * 1e9)
                while due <= now and not (limit and count >= limit):
                    await client.publish(key, payload, ts_producer=due + epoch_offset)
                    due += period_ns
                    count += 1
                sent.value = count
                await trio.sleep_until(due / 1e9)
            await client.flush()

    trio.run(run)


def latency_subscriber(
    address: tuple[str, int],
    patterns: Sequence[str],
    received: Synchronized[int],
    results: Queue[bytes],
    ready: Event,
    stop: Event,
    *,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """Subscribe through the client library and record, per message, now -
    ts_producer in an HDR histogram; put its encoding on ``results`` at the end."""
    histogram = LatencyHistogram()

    async def consume(subscription: ClientSubscription) -> None:
        record = histogram.record
        async for message in subscription:
            record(time.time_ns() - message.ts_producer)
            received.value += 1

    async def run() -> None:
        async with (
            credentials.connect(f"{address[0]}:{address[1]}", "bench-latency-sub", tls) as client,
            trio.open_nursery() as nursery,
        ):
            for pattern in patterns:
                subscription = await client.subscribe(pattern)
                nursery.start_soon(consume, subscription)
            ready.set()
            await trio.to_thread.run_sync(stop.wait, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    trio.run(run)
    results.put(histogram.encode())
