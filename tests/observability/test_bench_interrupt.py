"""A SIGTERMed benchmark stops every process it started (benchmarks/interrupt.py).

``timeout`` and CI stop a benchmark with SIGTERM; without the handler Python
dies on it at once, skipping the ``finally`` blocks that stop etcd and the
broker nodes, which then run on with nobody to reap them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broky.loadtest.servers import _children

ROOT = Path(__file__).resolve().parents[2]

#: Names a benchmark uses when it starts a child process of its own.
SPAWNERS = ("Popen", "local_etcd", "LocalNode", "server_process", "peer_server", "CONTEXT.Process")


def _descendants(pid: int) -> dict[int, str]:
    """Every process under ``pid``, as PID -> its start time (so a PID the
    kernel reuses later is not mistaken for the same process)."""
    found: dict[int, str] = {}
    pending = _children(pid)
    while pending:
        child = pending.pop()
        started = _start_time(child)
        if started is not None:
            found[child] = started
            pending.extend(_children(child))
    return found


def _start_time(pid: int) -> str | None:
    """The start time of a live process, None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _alive(processes: dict[int, str]) -> list[int]:
    return [pid for pid, started in processes.items() if _start_time(pid) == started]


def test_every_spawning_benchmark_installs_the_handler() -> None:
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        source = path.read_text()
        if any(name in source for name in SPAWNERS):
            assert "stop_children_on_signals()" in source, path.name


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("etcd") is None, reason="needs etcd (make test installs it)")
def test_sigterm_stops_etcd_and_nodes(tmp_path: Path) -> None:
    with (tmp_path / "bench.log").open("wb") as log:
        bench = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_failover", "--cycles", "1", "--vbuckets", "8"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 30
        # etcd and the three nodes are its direct children.
        while len(_children(bench.pid)) < 4:
            assert bench.poll() is None, (tmp_path / "bench.log").read_text()
            assert time.monotonic() < deadline, "the benchmark did not start its cluster"
            time.sleep(0.05)
        started = _descendants(bench.pid)
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _alive(started) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(started) == [], (tmp_path / "bench.log").read_text()[-2000:]
    finally:
        for pid in [*_alive(started), *([bench.pid] if bench.poll() is None else [])]:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        bench.wait(timeout=10)
