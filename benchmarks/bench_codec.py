"""Codec micro-benchmark: the broker's decode -> route -> encode path, in process.

Run: ``.venv/bin/python -m benchmarks.bench_codec [--messages N] [--repeat R] [--profile]``.
Prints one JSON object per line, one per shape, with microseconds of CPU per
message. What one "read batch" costs is measured: the bytes of 100 messages
fed to a server ``ProtocolMachine`` (framing and decoding), each Publish
routed the way the connection handler does it
(``router.publish(router.encode(...))``) through one wildcard subscription
``bench.>``, then one ``Outlet.take()`` building the Deliver frames. No
sockets and no trio: only the CPU the broker spends per message.

Shapes (100-byte payloads, 152-byte messages):
- ``one_run``: a Publish frame holding 1 run of 100 messages of one key;
- ``many_runs``: a Publish frame of 100 runs of 1 message over 100 keys;
- ``one_per_frame``: 100 Publish frames of 1 message each, over 100 keys.

``--profile`` prints a cProfile of ``many_runs`` and ``one_per_frame`` to
stderr, the hot functions first.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from collections.abc import Callable

from broky.protocol.codec import encode_frame, encode_run_chunk, runs_frame_parts
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES, BodyType
from broky.protocol.frames import Hello, Publish
from broky.protocol.framing import encode_preamble
from broky.protocol.message import encode_message, pack_sizes
from broky.router.router import Router

PAYLOAD_BYTES = 100
#: Messages per read batch (and per Publish frame, where a frame holds several).
BATCH_MESSAGES = 100
#: Distinct keys cycled over by the many-key shapes.
KEYS = 100


def _chunk(key: bytes, messages: int) -> bytes:
    message = encode_message(b"x" * PAYLOAD_BYTES)
    return encode_run_chunk(key, 0, pack_sizes([len(message)] * messages), message * messages)


def _frame(chunks: list[bytes]) -> bytes:
    return b"".join(runs_frame_parts(BodyType.PUBLISH, 1, chunks))


def read_batch(shape: str) -> bytes:
    """The bytes of one read batch (``BATCH_MESSAGES`` messages) of ``shape``."""
    keys = [f"bench.k{index}".encode() for index in range(KEYS)]
    if shape == "one_run":
        return _frame([_chunk(b"bench.k0", BATCH_MESSAGES)])
    if shape == "many_runs":
        return _frame([_chunk(keys[index % KEYS], 1) for index in range(BATCH_MESSAGES)])
    if shape == "one_per_frame":
        return b"".join(_frame([_chunk(keys[index % KEYS], 1)]) for index in range(BATCH_MESSAGES))
    raise ValueError(f"unknown shape {shape!r}")


SHAPES = ("one_run", "many_runs", "one_per_frame")


def pipeline(shape: str) -> Callable[[], int]:
    """A function that pushes one read batch of ``shape`` through decode,
    route and Deliver encoding; it returns the Deliver bytes produced."""
    data = read_batch(shape)
    machine = ProtocolMachine(Role.SERVER, DEFAULT_MAX_FRAME_BYTES)
    machine.receive_data(encode_preamble() + encode_frame(Hello(client_name="bench")))
    router = Router()
    publisher = router.attach(lambda: None)
    subscriber = router.attach(lambda: None)
    router.subscribe(subscriber, 1, b"bench.>")
    subscriber.take()  # the Subscribed confirmation

    def one_batch() -> int:
        for frame in machine.receive_data(data):
            assert type(frame) is Publish
            router.publish(
                router.encode(frame.runs, frame.stamp_ts_broker), publisher, frame.stream
            )
        return sum(len(part) for part in subscriber.take())

    return one_batch


def measure(shape: str, messages: int, repeat: int) -> dict[str, object]:
    """Best of ``repeat`` timings of ``messages`` messages through ``shape``."""
    one_batch = pipeline(shape)
    batches = max(1, messages // BATCH_MESSAGES)
    delivered = one_batch()
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(batches):
            one_batch()
        best = min(best, time.process_time() - started)
    return {
        "scenario": f"codec_{shape}",
        "messages": batches * BATCH_MESSAGES,
        "us_per_message": round(best / (batches * BATCH_MESSAGES) * 1e6, 3),
        "deliver_bytes_per_batch": delivered,
    }


def profile(shape: str, messages: int) -> None:
    """cProfile of ``messages`` messages through ``shape``, to stderr."""
    one_batch = pipeline(shape)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(max(1, messages // BATCH_MESSAGES)):
        one_batch()
    profiler.disable()
    print(f"--- profile of {shape} ---", file=sys.stderr)
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    for shape in SHAPES:
        print(json.dumps(measure(shape, args.messages, args.repeat)), flush=True)
    if args.profile:
        for shape in ("many_runs", "one_per_frame"):
            profile(shape, args.messages // 4)


if __name__ == "__main__":
    main()
