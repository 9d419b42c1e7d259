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

import itertools
import selectors
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

import trio

from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.subscription import Subscription as ClientSubscription
from broky.loadtest.load import MESSAGE_MARK, Load, MarkCounter, broky_sends
from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.constants import SlowConsumerPolicy
from broky.protocol.frames import Deliver, Notice, Subscribe, Subscribed
from broky.protocol.framing import FrameReader, encode_preamble

RECEIVE_BYTES = 1 << 20


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


def open_publisher(
    address: tuple[str, int], tls: ssl.SSLContext | None, credentials: Credentials
) -> socket.socket:
    """A publisher's socket, Hello sent."""
    return _open(address, [encode_frame(credentials.hello("bench-pub"))], tls)


def raw_publisher(
    address: tuple[str, int],
    load: Load,
    rate: float,
    sent: Synchronized[int],
    stop: Event,
    limit: int = 0,
    *,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
    send_timeout: float = 0.5,
) -> None:
    """Write ``load``'s pre-encoded Publish frames at ``rate`` messages/s (0:
    as fast as the broker reads them), until ``stop`` or ``limit`` messages (0: none).

    A send blocked for ``send_timeout`` ends the run: a benchmark wants its
    publishers to notice ``stop`` soon, while a run that must send all of
    ``limit`` over a loaded machine (the broker slowing publishers by TCP
    backpressure, as it should) gives it far longer."""
    buffers = itertools.cycle(broky_sends(load))
    sock = open_publisher(address, tls, credentials)
    sock.settimeout(send_timeout)
    paced_sends(lambda: sock.sendall(next(buffers)), load.per_send, rate, sent, stop, limit)
    close_gently(sock)


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


def read_until(sock: socket.socket, stop: Event, handle: Callable[[bytes], object]) -> None:
    """Pass what ``sock`` receives to ``handle`` until ``stop`` or EOF
    (checking ``stop`` at least every 0.1 s)."""
    sock.settimeout(0.1)
    while not stop.is_set():
        try:
            data = sock.recv(RECEIVE_BYTES)
        except TimeoutError:
            continue
        if not data:
            return
        handle(data)


def stop_process(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """Terminate a server we started, by PID; kill it after 5 s."""
    process.terminate()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def close_gently(sock: socket.socket) -> None:
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


def open_subscriber(
    address: tuple[str, int],
    pattern: str,
    stream: int,
    tls: ssl.SSLContext | None,
    credentials: Credentials,
) -> socket.socket:
    """A socket that has sent Hello and a (drop-policy) Subscribe to ``pattern``."""
    subscribe = Subscribe(stream, pattern.encode(), SlowConsumerPolicy.DROP, 0)
    hello = credentials.hello("bench-sub")
    return _open(address, [encode_frame(hello), encode_frame(subscribe)], tls)


def _received(sock: socket.socket, size: int) -> bytes:
    data = sock.recv(size)
    if not data:
        raise ConnectionError("the broker closed the subscriber before confirming it")
    return data


def confirmed_subscriber(
    address: tuple[str, int],
    pattern: str,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> socket.socket:
    """A subscriber socket whose Subscribed has arrived (read up to it: the
    caller starts its publishers only after this returns, so nothing else
    has been sent yet)."""
    sock = open_subscriber(address, pattern, 1, tls, credentials)
    sock.settimeout(10)
    preamble = len(encode_preamble())
    data = b""
    while len(data) < preamble:
        data += _received(sock, preamble - len(data))
    reader = FrameReader(64 << 20)
    frames: list[memoryview] = []
    while not any(isinstance(decode_frame(view), Subscribed) for view in frames):
        frames = reader.feed(_received(sock, RECEIVE_BYTES))
    return sock


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
    """One socket per pattern; counts delivered messages by the constant head
    of every bench message (``bytes.count``: no per-message or per-run Python,
    so the subscriber keeps up with any broker on any key mix). ``dropped``
    stays 0: Notices are not parsed here, the broker's own counter reports
    drops (see ``broker_dropped``)."""
    selector = selectors.DefaultSelector()
    counters: dict[int, tuple[socket.socket, MarkCounter]] = {}
    for pattern in patterns:
        sock = confirmed_subscriber(address, pattern, tls, credentials)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        counters[sock.fileno()] = (sock, MarkCounter(MESSAGE_MARK))
    ready.set()
    while not stop.is_set():
        for key, _ in selector.select(0.1):
            sock, counter = counters[key.fd]
            data = _receive(sock)
            if data is None:
                continue
            if not data:
                selector.unregister(sock)
                continue
            received.value += counter.feed(data)
    for sock, _ in counters.values():
        sock.close()


def client_receiver(
    address: tuple[str, int],
    patterns: Sequence[str],
    received: Synchronized[int],
    dropped: Synchronized[int],
    ready: Event,
    stop: Event,
    *,
    batches: bool = False,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """Receive through ``broky.Client``: iterate per message, or with
    ``batches`` through ``Subscription.batches()``; ``dropped`` counts what
    the broker said it dropped for the subscription."""

    total = 0

    async def consume(subscription: ClientSubscription) -> None:
        nonlocal total
        try:
            if batches:
                async for batch in subscription.batches():
                    total += len(batch)
                    received.value = total
            else:
                async for _ in subscription:
                    total += 1
                    if not total & 255:
                        received.value = total
        finally:
            received.value = total
            dropped.value = subscription.dropped_by_broker

    async def run() -> None:
        async with (
            credentials.connect(f"{address[0]}:{address[1]}", "bench-receiver", tls) as client,
            trio.open_nursery() as nursery,
        ):
            for pattern in patterns:
                nursery.start_soon(consume, await client.subscribe(pattern))
            ready.set()
            await trio.to_thread.run_sync(stop.wait, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    trio.run(run)


def client_publisher(
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
    """Publish through the client library at ``rate`` messages/s (0: flat
    out), in rounds of 500, until ``stop`` or ``limit`` messages (0: none)."""

    async def run() -> None:
        payload = b"x" * payload_size
        count = 0
        start = time.perf_counter()
        async with credentials.connect(
            f"{address[0]}:{address[1]}", "bench-client-pub", tls
        ) as client:
            while not stop.is_set() and not (limit and count >= limit):
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
