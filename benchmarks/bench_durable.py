"""Durable publish end to end: acked publishes through a real broker process.

Run: ``.venv/bin/python -m benchmarks.bench_durable [--duration S] [--dir DIR]``.
Prints one JSON object per line. A ``broky serve`` process (one worker) keeps
topic ``bench.>`` durable (one partition per publisher key) with the policy
under test; publisher connections in this process publish 100-byte payloads
with ``ack=True`` and count a message only once its ack arrived; then one
subscriber replays everything from the earliest offset (``Start.earliest()``,
decoding every message in the client), the replay read rate. In the same
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
from broky import Start, connect

PAYLOAD = b"x" * 100
PUBLISHERS = 8
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


async def measure(address: str, duration: float, pid: int) -> dict[str, object]:
    """Acked publish rate and the cores the broker and this client used
    meanwhile, then the rate of a replay of everything from the earliest."""
    counts = [0] * PUBLISHERS
    server_before, client_before = cpu_seconds(pid), time.process_time()
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        for index in range(PUBLISHERS):
            nursery.start_soon(publisher, address, index, start + duration, counts)
    elapsed = time.monotonic() - start
    figures: dict[str, object] = {
        "msgs_per_s": round(sum(counts) / elapsed),
        "server_cpu": round((cpu_seconds(pid) - server_before) / elapsed, 2),
        "client_cpu": round((time.process_time() - client_before) / elapsed, 2),
    }
    async with connect(address, name="bench-replay") as client:
        total = sum(info.end_offset - info.start_offset for info in await client.partitions())
        start = time.monotonic()
        received = 0
        async with client.subscription("bench.>", start=Start.earliest()) as subscription:
            async for _ in subscription:
                received += 1
                if received == total:
                    break
        figures["replay_msgs_per_s"] = round(total / (time.monotonic() - start))
    return figures


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_rate(root: Path, fsync: str, duration: float) -> dict[str, object]:
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
        return trio.run(measure, address, duration, process.pid)
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
            figures = broker_rate(root, fsync, args.duration)
            replay_rate = figures.pop("replay_msgs_per_s")
            rate = figures["msgs_per_s"]
            assert isinstance(rate, int)
            emit(
                f"broker_acked_fsync_{fsync}",
                publishers=PUBLISHERS,
                window=WINDOW,
                **figures,
                ratio_to_raw=round(rate / raw.rate, 2),
            )
            summary[f"acked_{fsync}_msgs_per_s"] = rate
            if fsync == "always":
                emit("broker_replay_earliest", msgs_per_s=replay_rate)
                summary["replay_msgs_per_s"] = replay_rate
    emit("summary", **summary)


if __name__ == "__main__":
    main()
