"""Client-library benchmark: how fast one ``broky.Client`` subscriber receives,
and the publish-to-iterator latency between two clients at a low rate.

Run: ``.venv/bin/python -m benchmarks.bench_client [--duration S] [--profile]``.
Prints one JSON object per line (one per scenario), so runs can be compared.

Scenarios (100-byte payloads):
- ``receive_message``: a pre-encoded publisher process flat out (runs of
  ``--run`` messages) -> ``broky serve --workers 1`` -> a ``broky.Client``
  subscriber in another process iterating ``async for message in sub``.
- ``receive_batch``: the same load, the subscriber iterating ``async for batch
  in sub.batches()``.
- ``latency``: ``broky bench latency`` at ``--rate`` messages/s, one message
  per ``publish``, client to client.

With ``--source feeder`` the receive scenarios replace broker and publisher
with a feeder process that plays the broker's part of the handshake and then
writes pre-encoded Deliver frames flat out (TCP backpressure paces it): the
client's own receive capacity, which a broker and a publisher sharing the
same cores do not cap. ``--source both`` (the default) runs each way.

Against the broker, the subscriber may be the bottleneck: the broker drops for
it (policy ``drop``) once its credit and outbox run out, so each result
reports what was published, what arrived, and the Notices' count of what the
broker dropped. ``lost`` is published - received over the whole run, after
the subscriber has drained.
With ``--profile`` the subscriber runs under cProfile and the result lists the
functions with the most own time (cProfile's overhead inflates per-call costs;
read the shares, not the absolute times).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import multiprocessing
import pstats
import select
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, Final

import trio

import broky
from benchmarks.interrupt import stop_children_on_signals
from broky.loadtest import loadgen
from broky.loadtest.bench import BenchOptions, run_scenario
from broky.loadtest.load import Load
from broky.loadtest.servers import broky_command, cpu_seconds, server_process
from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.frames import (
    Deliver,
    Flow,
    Ping,
    Pong,
    Run,
    Subscribe,
    Subscribed,
    Welcome,
)
from broky.protocol.framing import FrameReader, encode_preamble
from broky.protocol.message import encode_message, pack_sizes

CONTEXT: Final = multiprocessing.get_context("fork")
KEY: Final = "bench.data"
#: Seconds between the subscriber's copies of its count into shared memory.
SAMPLE_INTERVAL: Final = 0.05
#: Seconds without a new message after which a drained subscriber is done.
QUIET: Final = 0.5
#: Functions listed from the subscriber's profile.
PROFILE_TOP: Final = 15
#: Runs per Deliver frame the feeder writes (the broker's are of this order).
FEEDER_RUNS_PER_FRAME: Final = 16


def deliver_frames(stream: int, size: int, per_run: int) -> bytes:
    """One Deliver frame of FEEDER_RUNS_PER_FRAME runs of ``per_run`` messages."""
    message = encode_message(b"x" * size)
    run = Run(KEY.encode(), 1, per_run, pack_sizes([len(message)] * per_run), message * per_run)
    return encode_frame(Deliver(stream, (run,) * FEEDER_RUNS_PER_FRAME))


def feeder(
    listener: socket.socket, size: int, per_run: int, sent: Synchronized[int], stop: Event
) -> None:
    """Play the broker for one client: welcome it, confirm its subscription,
    write Deliver frames within its flow-control credit until ``stop``, and
    answer its Pings until it closes; ``sent`` counts the messages written."""
    sock, _ = listener.accept()
    sock.sendall(encode_preamble() + encode_frame(Welcome(server_name="bench-feeder")))
    sock.recv(len(encode_preamble()), socket.MSG_WAITALL)
    reader = FrameReader(1 << 20)
    per_frame = per_run * FEEDER_RUNS_PER_FRAME
    frame_bytes, credit, count = b"", 0, 0
    with contextlib.suppress(OSError):
        while True:
            wait = 0.5
            if frame_bytes and credit >= per_frame and not stop.is_set():
                sock.sendall(frame_bytes)
                credit -= per_frame
                count += per_frame
                sent.value = count
                wait = 0.0  # only look for Flow frames
            if not select.select([sock], [], [], wait)[0]:
                continue
            data = sock.recv(1 << 16)
            if not data:
                break
            for view in reader.feed(data):
                frame = decode_frame(view)
                if isinstance(frame, Subscribe):
                    frame_bytes = deliver_frames(frame.stream, size, per_run)
                    credit = frame.credit or 1 << 62
                    sock.sendall(encode_frame(Subscribed(frame.stream)))
                elif isinstance(frame, Flow):
                    credit += frame.credit
                elif isinstance(frame, Ping):
                    sock.sendall(encode_frame(Pong(frame.nonce)))
    sock.close()


@contextmanager
def _as_pair(command: list[str]) -> Iterator[tuple[int, tuple[str, int]]]:
    """A Broky server process, as (pid, address) like the feeder."""
    with server_process(command) as server:
        yield server.pid, server.address


@contextmanager
def feeder_process(
    size: int, per_run: int, sent: Synchronized[int], stop: Event
) -> Iterator[tuple[int, tuple[str, int]]]:
    """A feeder on a free local port, as (pid, address) like a server."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        process = CONTEXT.Process(target=feeder, args=(listener, size, per_run, sent, stop))
        process.start()
        try:
            yield process.pid or 0, listener.getsockname()
        finally:
            stop.set()
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()


def subscriber(
    address: tuple[str, int],
    mode: str,
    received: Synchronized[int],
    dropped: Synchronized[int],
    profile_path: str,
    ready: Event,
    stop: Event,
) -> None:
    """Count what one client subscription receives, per message or per batch,
    until ``stop``; the count goes to ``received`` every SAMPLE_INTERVAL."""
    count = 0

    async def consume(subscription: broky.Subscription) -> None:
        nonlocal count
        if mode == "batch":
            async for batch in subscription.batches():
                count += len(batch)
        else:
            async for _message in subscription:
                count += 1

    async def run() -> None:
        async with broky.connect(f"{address[0]}:{address[1]}", name="bench-client-sub") as client:
            subscription = await client.subscribe(KEY)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume, subscription)
                ready.set()
                while not stop.is_set():
                    await trio.sleep(SAMPLE_INTERVAL)
                    received.value = count
                nursery.cancel_scope.cancel()
            received.value = count
            dropped.value = subscription.dropped_by_broker

    if profile_path:
        profiler = cProfile.Profile()
        profiler.runcall(trio.run, run)
        profiler.dump_stats(profile_path)
    else:
        trio.run(run)


def profile_top(path: str) -> list[dict[str, Any]]:
    """The PROFILE_TOP functions with the most own time in a cProfile dump."""
    stats = pstats.Stats(path)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: item[1][2],
        reverse=True,
    )[:PROFILE_TOP]
    return [
        {
            "function": f"{Path(file).name}:{line}({name})",
            "calls": calls,
            "own_share": round(own / total, 3),
            "cumulative_s": round(cumulative, 3),
        }
        for (file, line, name), (_, calls, own, cumulative, _) in rows
    ]


def wait_quiet(counter: Synchronized[int]) -> None:
    """Wait until ``counter`` stopped growing for QUIET seconds (at most 10 s)."""
    deadline = time.monotonic() + 10
    last, last_change = counter.value, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - last_change < QUIET:
        time.sleep(SAMPLE_INTERVAL)
        if counter.value != last:
            last, last_change = counter.value, time.monotonic()


def measure_receive(
    mode: str, source: str, duration: float, size: int, per_run: int, rate: float, profile: bool
) -> dict[str, Any]:
    """One raw publisher -> the broker, or a feeder, -> one client subscriber
    iterating per ``mode``."""
    received = CONTEXT.Value("q", 0, lock=False)
    dropped = CONTEXT.Value("q", 0, lock=False)
    sent = CONTEXT.Value("q", 0, lock=False)
    ready, stop_subscriber, stop_publisher = CONTEXT.Event(), CONTEXT.Event(), CONTEXT.Event()
    upstream = (
        feeder_process(size, per_run, sent, stop_publisher)
        if source == "feeder"
        else _as_pair(broky_command(1))
    )
    with tempfile.TemporaryDirectory() as scratch, upstream as (pid, address):
        profile_path = str(Path(scratch) / "subscriber.prof") if profile else ""
        consumer = CONTEXT.Process(
            target=subscriber,
            args=(address, mode, received, dropped, profile_path, ready, stop_subscriber),
        )
        consumer.start()
        if not ready.wait(15):
            raise RuntimeError("the subscriber was not confirmed within 15 s")
        publisher = CONTEXT.Process(
            target=loadgen.raw_publisher,
            args=(address, Load(run=per_run, size=size), rate, sent, stop_publisher),
        )
        if source == "broker":
            publisher.start()
        time.sleep(min(1.0, duration / 3))  # warm-up
        start_received, start_sent = received.value, sent.value
        start_cpu = cpu_seconds(consumer.pid or 0), cpu_seconds(pid)
        start = time.perf_counter()
        time.sleep(duration)
        elapsed = time.perf_counter() - start
        window_received, window_sent = received.value - start_received, sent.value - start_sent
        subscriber_cpu = cpu_seconds(consumer.pid or 0) - start_cpu[0]
        server_cpu = cpu_seconds(pid) - start_cpu[1]
        stop_publisher.set()
        wait_quiet(received)
        stop_subscriber.set()
        for process in (publisher, consumer) if source == "broker" else (consumer,):
            process.join(30 if profile else 5)
            if process.is_alive():
                process.kill()
                process.join()
        result: dict[str, Any] = {
            "scenario": f"receive_{mode}",
            "source": source,
            "payload_bytes": size,
            "messages_per_run": per_run,
            "offered_per_s": round(rate) if rate else "max",
            "seconds": round(elapsed, 3),
            "published_per_s": round(window_sent / elapsed),
            "received_per_s": round(window_received / elapsed),
            "subscriber_cpu_utilisation": round(subscriber_cpu / elapsed, 2),
            # What one full core would receive: the figure a busy machine keeps.
            "received_per_subscriber_cpu_s": round(window_received / subscriber_cpu)
            if subscriber_cpu
            else None,
            f"{source}_cpu_utilisation": round(server_cpu / elapsed, 2),
            "published": sent.value,
            "received": received.value,
            "lost": sent.value - received.value,
            "dropped_by_broker": dropped.value,
            "profiled": profile,
        }
        if profile:
            result["profile_top"] = profile_top(profile_path)
    return result


def measure_latency(rate: float, duration: float, size: int) -> dict[str, Any]:
    """``broky bench latency``: one client publishing one message per call at
    ``rate``, one client subscriber timing each message."""
    options = BenchOptions(scenario="latency", interval=1 / rate, duration=duration, size=size)
    with server_process(broky_command(1)) as server:
        result = run_scenario(options, "broky", server)
    return {
        "scenario": "latency",
        "offered_per_s": round(rate),
        "payload_bytes": size,
        "published": result["published"],
        "delivered": result["delivered"],
        "latency_us": result["latency"],
        "server_cpu_utilisation": result["server_cpu_utilisation"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per scenario")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--run", type=int, default=100, help="messages per pre-encoded run")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="receive scenarios: offered msg/s (0: flat out)"
    )
    parser.add_argument(
        "--latency-rate", type=float, default=5000.0, help="latency scenario: msg/s"
    )
    parser.add_argument(
        "--source",
        choices=("broker", "feeder", "both"),
        default="both",
        help="receive scenarios: what the subscriber reads from",
    )
    parser.add_argument("--profile", action="store_true", help="profile the subscriber")
    parser.add_argument(
        "--only",
        action="append",
        choices=("receive_message", "receive_batch", "latency"),
        help="run only this scenario (repeatable)",
    )
    args = parser.parse_args()
    stop_children_on_signals()
    chosen = args.only or ["receive_message", "receive_batch", "latency"]
    for scenario in chosen:
        if scenario == "latency":
            print(json.dumps(measure_latency(args.latency_rate, args.duration, args.size)))
            continue
        mode = scenario.removeprefix("receive_")
        for source in ("broker", "feeder") if args.source == "both" else (args.source,):
            result = measure_receive(
                mode, source, args.duration, args.size, args.run, args.rate, args.profile
            )
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
