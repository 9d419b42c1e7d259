"""Storage benchmark: durable appends, replay reads, and this disk's ceiling.

Run: ``.venv/bin/python -m benchmarks.bench_storage [--duration S] [--dir DIR]``.
Prints one JSON object per line. Messages carry 100-byte payloads (152-byte
FlatBuffers). Scenarios:

- ``raw_write_fsync``: ``os.write`` + ``fdatasync`` of the same bytes per
  group as the log writes, with no log code: the disk's ceiling, measured in
  the same run, so that the ratio survives a noisy machine.
- ``append_fsync_always``: the broker's pattern under ``fsync=always``: append
  a group of runs (one write), then ``sync()`` (one fdatasync), then the
  messages count as acknowledged. Reported per run length and group size.
- ``append_fsync_interval``: appends with the 1 s fsync window.
- ``replay_read``: ``read(offset, 1 MiB)`` from the start to the end, CRC
  checked, as a replaying subscriber or the Spark connector would.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable

from broky.protocol.frames import Run
from broky.protocol.message import encode_message, pack_sizes
from broky.storage.batch import encode_batch
from broky.storage.config import FsyncPolicy, LogConfig
from broky.storage.log import PartitionLog

PAYLOAD_BYTES = 100
#: (messages per run, runs per sync): one long run, and a group of shorter
#: runs such as one Publish frame with several keys brings.
SHAPES = ((1000, 1), (250, 4), (100, 10))


def make_run(count: int) -> Run:
    message = encode_message(b"x" * PAYLOAD_BYTES, ts_producer=1)
    return Run(b"bench.durable", 0, count, pack_sizes([len(message)] * count), message * count)


#: The raw ceiling and the log take turns in this many slices of the
#: duration, so that a burst of noise from other work on a shared disk hits
#: both sides alike and the ratio stays meaningful.
ROUNDS = 10


class Meter:
    """Messages done and seconds spent by one side of a comparison."""

    def __init__(self, step: Callable[[], int]) -> None:
        self.step = step
        self.done = 0
        self.elapsed = 0.0

    def run_for(self, seconds: float) -> None:
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            self.done += self.step()
        self.elapsed += elapsed

    @property
    def rate(self) -> int:
        return round(self.done / self.elapsed)


def raw_writer(fd: int, group: list[Run]) -> tuple[Meter, int]:
    """The ceiling: the same bytes per group as the log writes, no log code."""
    data = b"".join(encode_batch(0, 0, run) for run in group)
    count = sum(run.count for run in group)

    def step() -> int:
        os.write(fd, data)
        os.fdatasync(fd)
        return count

    return Meter(step), len(data)


def log_writer(log: PartitionLog, group: list[Run]) -> Meter:
    count = sum(run.count for run in group)
    always = log.config.fsync is FsyncPolicy.ALWAYS

    def step() -> int:
        log.append(group)
        if always:
            log.sync()  # the acknowledgement point: one fsync per group
        return count

    return Meter(step)


def compare(
    root: str, name: str, group: list[Run], policy: FsyncPolicy, duration: float
) -> tuple[dict[str, object], dict[str, object], PartitionLog]:
    """Run the raw ceiling and the log in alternating slices; both results."""
    log = PartitionLog.open(os.path.join(root, name), LogConfig(fsync=policy))
    fd = os.open(os.path.join(root, f"{name}.raw"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        raw, group_bytes = raw_writer(fd, group)
        appender = log_writer(log, group)
        for _ in range(ROUNDS):
            raw.run_for(duration / ROUNDS)
            appender.run_for(duration / ROUNDS)
    finally:
        os.close(fd)
        os.unlink(os.path.join(root, f"{name}.raw"))
    log.sync()
    stats = log.statistics()
    count = sum(run.count for run in group)
    ceiling: dict[str, object] = {
        "msgs_per_s": raw.rate,
        "mb_per_s": round(raw.rate / count * group_bytes / 1e6, 1),
    }
    result: dict[str, object] = {
        "msgs_per_s": appender.rate,
        "mb_per_s": round(stats.appended_bytes / appender.elapsed / 1e6, 1),
        "fsyncs": stats.fsyncs,
        "us_per_group": round(appender.elapsed / (appender.done / count) * 1e6, 1),
    }
    return ceiling, result, log


def replay(log: PartitionLog) -> dict[str, object]:
    offset = log.start_offset
    start = time.perf_counter()
    messages = 0
    while offset < log.end_offset:
        batches = log.read(offset, 1024 * 1024)
        messages += sum(batch.count for batch in batches)
        offset = batches[-1].next_offset
    elapsed = time.perf_counter() - start
    return {"msgs_per_s": round(messages / elapsed), "messages": messages}


def emit(scenario: str, **fields: object) -> None:
    print(json.dumps({"scenario": scenario, **fields}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per side and shape")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    summary: dict[str, object] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        for run_length, runs_per_sync in SHAPES:
            group = [make_run(run_length)] * runs_per_sync
            shape = {"messages_per_run": run_length, "runs_per_sync": runs_per_sync}
            name = f"always-{run_length}x{runs_per_sync}"
            ceiling, result, log = compare(root, name, group, FsyncPolicy.ALWAYS, args.duration)
            ratio = round(appender_rate(result) / appender_rate(ceiling), 2)
            emit("raw_write_fsync", **shape, **ceiling)
            emit("append_fsync_always", **shape, **result, ratio_to_raw=ratio)
            summary[f"always_{run_length}x{runs_per_sync}_msgs_per_s"] = result["msgs_per_s"]
            summary[f"always_{run_length}x{runs_per_sync}_ratio_to_raw"] = ratio
            if run_length == SHAPES[0][0]:
                read = replay(log)
                emit("replay_read", **read)
                summary["replay_msgs_per_s"] = read["msgs_per_s"]
            log.close()
        run_length, runs_per_sync = SHAPES[1]
        group = [make_run(run_length)] * runs_per_sync
        ceiling, result, log = compare(root, "interval", group, FsyncPolicy.INTERVAL, args.duration)
        log.close()
        emit(
            "append_fsync_interval",
            messages_per_run=run_length,
            runs_per_sync=runs_per_sync,
            **result,
            ratio_to_raw=round(appender_rate(result) / appender_rate(ceiling), 2),
        )
        summary["interval_msgs_per_s"] = result["msgs_per_s"]
    emit("summary", **summary)


def appender_rate(result: dict[str, object]) -> int:
    rate = result["msgs_per_s"]
    assert isinstance(rate, int)
    return rate


if __name__ == "__main__":
    main()
