"""The broker's durable publish path in one process: CPU per acked message.

Run: ``.venv/bin/python -m benchmarks.bench_durable_path [--messages N]
[--keys MIX ...] [--fsync POLICY]``. Prints one JSON object per line.

``bench_durable`` measures acked publishes end to end (client processes, a
``broky serve``, sockets), which on a shared 2-core machine mixes the
broker's cost with the client's and with whatever else runs. This one feeds
the broker's own code the frames an idempotent client sends (built with the
client's encoder, 100-byte payloads) and times everything from the frame's
bytes to its ``PublishAck``: decode, topic and partition choice, the
owners' rounds (deduplication, the append, the fsync), fan-out and acks;
one trio thread plus the owners' worker threads, as in ``broky serve``.
The CPU seconds of the process per message are what the code costs,
whatever share of the machine the run got (``msgs_per_s`` is reported too,
but only means something on a calm machine). Key mixes as in
``bench_durable``: ``one`` (one key per frame), ``many`` (1,000 keys
cycled message by message), ``key_partition`` (one key, a distinct
``key_partition`` per message, in one run per frame as the client batches
them: the broker splits it by partition). Every message must be acknowledged:
``lost`` says how many were not.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

import trio

from broky.connection.durable_requests import DurableRequests
from broky.durable.store import DurableStore
from broky.gcpolicy import tune_for_broker
from broky.protocol.chunks import encode_run_chunk
from broky.protocol.codec import decode_frame
from broky.protocol.constants import LinkKind
from broky.protocol.frames import Publish, PublishAck
from broky.protocol.message import encode_message, pack_sizes
from broky.protocol.producer_frames import producer_frame_parts
from broky.router.router import Router
from broky.storage.config import FsyncPolicy, LogConfig
from broky.storage.topics import TopicPolicy

PAYLOAD = b"x" * 100
PARTITIONS = 8
#: Messages per Publish frame: about what the client puts in its 256 KiB frames.
FRAME_MESSAGES = 1_500
#: Frames in flight before the feeder waits for acks (a client's window).
WINDOW_FRAMES = 64
KEY_MIXES = ("one", "many", "key_partition")
PRODUCER = 0x5EED


def frames(mix: str, messages: int) -> list[bytes]:
    """The bodies (after the size prefix) of the frames an idempotent
    client sends for ``messages`` messages of key mix ``mix``."""
    bodies = []
    sequence = 1
    for first in range(0, messages, FRAME_MESSAGES):
        count = min(FRAME_MESSAGES, messages - first)
        chunks = []
        if mix == "one":
            message = encode_message(PAYLOAD)
            chunks.append(
                encode_run_chunk(
                    b"bench.one", 0, pack_sizes([len(message)] * count), message * count
                )
            )
        elif mix == "key_partition":  # one key: the client sends one run of them all
            encoded = [
                encode_message(PAYLOAD, b"%d" % index) for index in range(first, first + count)
            ]
            chunks.append(
                encode_run_chunk(
                    b"bench.one", 0, pack_sizes([len(m) for m in encoded]), b"".join(encoded)
                )
            )
        else:
            for index in range(first, first + count):
                key, message = b"bench.k%d" % (index % 1000), encode_message(PAYLOAD)
                chunks.append(encode_run_chunk(key, 0, pack_sizes([len(message)]), message))
        data = b"".join(
            producer_frame_parts(1, chunks, producer_id=PRODUCER, first_sequence=sequence)
        )
        bodies.append(data[4:])
        sequence += count
    return bodies


class _AckCounter:
    """Stands in for a connection's outlet: counts the acked messages."""

    kind = LinkKind.CLIENT

    def __init__(self) -> None:
        self.acked = 0
        self.frames = 0
        self.errors = 0
        self.changed = trio.Event()

    def send_control(self, data: bytes) -> None:
        frame = decode_frame(memoryview(data)[4:])
        if isinstance(frame, PublishAck):
            self.acked += sum(
                last - first + 1
                for first, last in zip(frame.first_offsets, frame.last_offsets, strict=True)
            )
        else:
            self.errors += 1
        self.frames += 1
        self.changed.set()


async def _drive(directory: str, bodies: list[bytes], fsync: str) -> dict[str, Any]:
    router = Router()
    policy = TopicPolicy(
        name="bench",
        pattern=b"bench.>",
        partitions=PARTITIONS,
        log=LogConfig(fsync=FsyncPolicy(fsync)),
    )
    store = DurableStore(directory, [policy], router)
    outlet = _AckCounter()
    requests = DurableRequests(router, outlet, store, lambda pattern: None)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        started, cpu_before = time.perf_counter(), time.process_time()
        for sent, body in enumerate(bodies, 1):
            while sent - outlet.frames > WINDOW_FRAMES or store.congested:
                outlet.changed = trio.Event()
                await outlet.changed.wait()
            frame = decode_frame(body)
            assert isinstance(frame, Publish)
            requests.publish(frame, frame.runs)
            await trio.lowlevel.checkpoint()
        while outlet.frames < len(bodies):
            outlet.changed = trio.Event()
            await outlet.changed.wait()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_before
        nursery.cancel_scope.cancel()
    return {"elapsed": elapsed, "cpu": cpu, "acked": outlet.acked, "errors": outlet.errors}


def measure(mix: str, messages: int, fsync: str) -> dict[str, Any]:
    bodies = frames(mix, messages)
    with tempfile.TemporaryDirectory(prefix="broky-bench-path-") as directory:
        result = trio.run(_drive, directory, bodies, fsync)
    acked = result["acked"]
    return {
        "scenario": "durable_publish_path",
        "keys": mix,
        "fsync": fsync,
        "partitions": PARTITIONS,
        "messages": messages,
        "acked": acked,
        "lost": messages - acked,
        "error_frames": result["errors"],
        "cpu_us_per_msg": round(result["cpu"] / max(acked, 1) * 1e6, 2),
        "msgs_per_s": round(acked / result["elapsed"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--keys", action="append", choices=KEY_MIXES)
    parser.add_argument("--fsync", default="always", choices=[p.value for p in FsyncPolicy])
    args = parser.parse_args()
    tune_for_broker()
    for mix in args.keys or KEY_MIXES:
        print(json.dumps(measure(mix, args.messages, args.fsync)), flush=True)


if __name__ == "__main__":
    main()
