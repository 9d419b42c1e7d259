"""Durable publish end to end: acked publishes through a real broker process.

Run: ``.venv/bin/python -m benchmarks.bench_durable [--duration S] [--dir DIR]``.
Prints one JSON object per line. A ``broky serve`` process (one worker) keeps
topic ``bench.>`` durable (one partition per publisher key) with the policy
under test; publisher connections in this process publish 100-byte payloads
with ``ack=True`` and count a message only once its ack arrived. In the same
run, ``raw_write_fsync`` measures this disk's ceiling (write + fdatasync of
1000-message runs, no broker, no log code), so the ratio survives a noisy
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from benchmarks.bench_storage import make_run, raw_writer
from broky import connect

PAYLOAD = b"x" * 100
PUBLISHERS = 4
#: Messages a publisher queues before waiting for their acks (its window).
WINDOW = 20_000


def write_config(path: Path, data_dir: Path, fsync: str) -> None:
    path.write_text(
        f'host = "127.0.0.1"\nport = 0\nworkers = 1\nlog_level = "warning"\n'
        f'data_dir = "{data_dir}"\nsystem_events = false\nsystem_metrics_interval = 0\n'
        f'[[durable]]\nname = "bench"\npattern = "bench.>"\npartitions = {PUBLISHERS}\n'
        f'fsync = "{fsync}"\n'
    )


async def publisher(address: str, index: int, deadline: float, counts: list[int]) -> None:
    async with connect(address, name=f"bench-{index}") as client:
        key = f"bench.p{index}"
        while time.monotonic() < deadline:
            for _ in range(WINDOW):
                await client.publish(key, PAYLOAD, ack=True)
            acked = await client.flush_acks()
            counts[index] += sum(ack.last_offset - ack.first_offset + 1 for ack in acked)


async def measure(address: str, duration: float) -> int:
    counts = [0] * PUBLISHERS
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        for index in range(PUBLISHERS):
            nursery.start_soon(publisher, address, index, start + duration, counts)
    return round(sum(counts) / (time.monotonic() - start))


def broker_rate(root: Path, fsync: str, duration: float) -> int:
    config = root / f"{fsync}.toml"
    write_config(config, root / f"data-{fsync}", fsync)
    process = subprocess.Popen(
        [sys.executable, "-m", "broky", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        address = line.strip().rsplit(" ", 1)[-1]
        return trio.run(measure, address, duration)
    finally:
        process.terminate()
        process.wait(10)


def emit(scenario: str, **fields: object) -> None:
    print(json.dumps({"scenario": scenario, **fields}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per scenario")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as name:
        root = Path(name)
        group = [make_run(1000)]
        fd = os.open(root / "raw", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            raw, _ = raw_writer(fd, group)
            raw.run_for(args.duration)
        finally:
            os.close(fd)
        emit("raw_write_fsync", messages_per_fsync=1000, msgs_per_s=raw.rate)
        summary: dict[str, object] = {"raw_write_fsync_msgs_per_s": raw.rate}
        for fsync in ("always", "interval"):
            rate = broker_rate(root, fsync, args.duration)
            emit(
                f"broker_acked_fsync_{fsync}",
                publishers=PUBLISHERS,
                window=WINDOW,
                msgs_per_s=rate,
                ratio_to_raw=round(rate / raw.rate, 2),
            )
            summary[f"acked_{fsync}_msgs_per_s"] = rate
    emit("summary", **summary)


if __name__ == "__main__":
    main()
