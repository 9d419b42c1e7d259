"""Micro-benchmark of the broker's per-run path, in one process: decode a
Publish frame, route it through a Router with one ``bench.>`` subscription,
and take the Deliver frames as the subscriber's writer would.

Run: ``.venv/bin/python -m benchmarks.bench_route [--seconds S]``. Prints one
JSON object per case: microseconds per message and per frame for (a) one run
of 100 messages, (b) 100 runs of one message over 100 keys, (c) one message
per frame. The number to watch is (b) and (c) against (a): the per-run cost.
"""

from __future__ import annotations

import argparse
import json
import time

from broky.protocol.codec import decode_frame, encode_run_chunk, runs_frame_parts
from broky.protocol.constants import BodyType, SlowConsumerPolicy
from broky.protocol.frames import Publish
from broky.protocol.message import encode_message, pack_sizes
from broky.router.router import Router, RouterLimits

PAYLOAD_BYTES = 100


def _frame(keys: list[bytes], per_run: int) -> bytes:
    message = encode_message(b"x" * PAYLOAD_BYTES)
    chunks = [
        encode_run_chunk(key, 0, pack_sizes([len(message)] * per_run), message * per_run)
        for key in keys
    ]
    return b"".join(runs_frame_parts(BodyType.PUBLISH, 1, chunks))


def measure(name: str, frame: bytes, messages_per_frame: int, seconds: float) -> dict[str, object]:
    """Decode, route and take ``frame`` repeatedly for ``seconds``."""
    router = Router(RouterLimits(outbox_bytes=1 << 30, outbox_messages=1 << 30))
    outlet = router.attach(lambda: None)
    router.subscribe(outlet, 1, b"bench.>", SlowConsumerPolicy.DROP, 0)
    outlet.take()
    view = memoryview(frame)[4:]
    frames = 0
    # CPU time of this process: what the path costs, whatever else the
    # (shared) machine runs meanwhile.
    start = time.process_time()
    deadline = start + seconds
    while time.process_time() < deadline:
        for _ in range(100):
            decoded = decode_frame(view)
            assert isinstance(decoded, Publish)
            router.publish(router.encode(decoded.runs, False), outlet, 1)
        while outlet.has_work:
            outlet.take()
        frames += 100
    elapsed = time.process_time() - start
    messages = frames * messages_per_frame
    return {
        "case": name,
        "us_per_message": round(elapsed * 1e6 / messages, 3),
        "us_per_frame": round(elapsed * 1e6 / frames, 2),
        "messages_per_s": round(messages / elapsed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per case")
    args = parser.parse_args()
    keys = [b"bench.k%d" % index for index in range(100)]
    cases = [
        ("one_run_of_100", _frame(keys[:1], 100), 100),
        ("100_runs_of_1", _frame(keys, 1), 100),
        ("1_message_per_frame", _frame(keys[:1], 1), 1),
    ]
    for name, frame, count in cases:
        print(json.dumps(measure(name, frame, count, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
