"""A writer process killed with SIGKILL at random moments loses nothing it
acknowledged: with fsync=always, every offset it reported after ``sync()`` is
present after recovery, exactly once, in order, with its bytes intact."""

from __future__ import annotations

import multiprocessing
import os
import random
import select
import signal
import time
from pathlib import Path
from typing import BinaryIO

from broky.protocol.message import decode_run
from broky.storage.config import FsyncPolicy, LogConfig
from broky.storage.log import PartitionLog
from tests.storage.runs import make_run

#: Cycles of start, append, kill, recover: the issue asks for at least 50,
#: and at a few tens of milliseconds each, 100 cost about four seconds.
CYCLES = 100
#: Small segments so that kills also land around rolls.
CONFIG = LogConfig(segment_bytes=64 * 1024, fsync=FsyncPolicy.ALWAYS)
#: Fork: the child needs no imports, so a cycle costs milliseconds, not the
#: ~0.2 s of a fresh interpreter; it is still a separate process, killed for real.
CONTEXT = multiprocessing.get_context("fork")


def payload(offset: int) -> bytes:
    return b"message-%d" % offset


def key(offset: int) -> bytes:
    return b"k.%d" % (offset // 7 % 3)


def writer(directory: str, ack_fd: int, seed: int) -> None:
    """Append runs, sync, then report "first last" for each: the acknowledgement."""
    rng = random.Random(seed)
    log = PartitionLog.open(directory, CONFIG)
    while True:
        runs = []
        offset = log.end_offset
        for _ in range(rng.randint(1, 4)):
            count = rng.randint(1, 40)
            runs.append(make_run(key(offset), [payload(offset + i) for i in range(count)]))
            offset += count
        result = log.append(runs)
        log.sync()
        os.write(ack_fd, b"%d %d\n" % (result.first_offset, result.last_offset))


def check(log: PartitionLog, start: int) -> int:
    """Every message from ``start`` has the offset, key and payload it was
    written with; returns the end offset."""
    offset = start
    while offset < log.end_offset:
        batches = log.read(offset, 256 * 1024)
        for batch in batches:
            assert batch.base_offset == offset, "dense: no gap, no duplicate"
            for message in decode_run(batch.run):
                assert message.payload == payload(offset)
                offset += 1
            assert batch.key == key(batch.base_offset)
    return offset


def test_acknowledged_appends_survive_sigkill(tmp_path: Path) -> None:
    directory = str(tmp_path / "partition")
    rng = random.Random(5)
    acknowledged = -1
    verified = 0
    deadline = time.monotonic() + 60
    for cycle in range(CYCLES):
        assert time.monotonic() < deadline, "crash cycles are meant to take seconds"
        read_end, write_end = os.pipe()
        child = CONTEXT.Process(target=writer, args=(directory, write_end, cycle))
        child.start()
        os.close(write_end)
        with os.fdopen(read_end, "rb", buffering=0) as acks:
            # The kill lands a random time after the writer's first
            # acknowledgement, not after its start: on a loaded machine a
            # start can take longer than the sleep, and a cycle would test
            # nothing.
            head = _first_line(acks, deadline)
            time.sleep(rng.uniform(0.002, 0.03))
            os.kill(child.pid or 0, signal.SIGKILL)
            child.join()
            assert child.exitcode == -signal.SIGKILL
            lines = (head + acks.read()).split(b"\n")
        for line in lines[:-1]:  # the last piece may be a line cut short
            first, last = map(int, line.split())
            assert first == acknowledged + 1, "acknowledged offsets are dense"
            acknowledged = last
        log = PartitionLog.open(directory, CONFIG)
        try:
            assert log.end_offset > acknowledged, (
                f"cycle {cycle}: acknowledged up to {acknowledged}, recovered {log.end_offset}"
            )
            verified = check(log, verified)
            acknowledged = log.end_offset - 1  # what the next writer continues from
        finally:
            log.abandon()  # leave it as a crash would, for the next child to recover
    log = PartitionLog.open(directory, CONFIG)
    with log:
        assert check(log, 0) == log.end_offset
        assert log.end_offset >= CYCLES, "every writer acknowledged something"


def _first_line(pipe: BinaryIO, deadline: float) -> bytes:
    """Read up to and including the first newline (the first acknowledgement)."""
    got = b""
    while not got.endswith(b"\n"):
        ready, _, _ = select.select([pipe], [], [], max(deadline - time.monotonic(), 0))
        assert ready, "a writer acknowledged nothing in time"
        chunk = pipe.read(1)
        assert chunk, "the writer died before its first acknowledgement"
        got += chunk
    return got
