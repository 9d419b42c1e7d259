"""Run directories of supervisors that are gone are removed (broky.mesh.rundir)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broky.mesh.rundir import OWNER_FILE, make_run_dir, process_start_time, stale_run_dirs


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _run_dir(base: Path, name: str, owner: str | None) -> Path:
    path = base / name
    path.mkdir()
    if owner is not None:
        (path / OWNER_FILE).write_text(owner, encoding="ascii")
    return path


def _socket_file(path: Path, *, listening: bool) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    if listening:
        sock.listen(1)
        return sock
    sock.close()  # the file stays: nobody listens on it
    return None


def test_only_run_directories_whose_owner_is_gone_are_stale(tmp_path: Path) -> None:
    me = os.getpid()
    dead = _run_dir(tmp_path, "broky-run-dead", f"{_dead_pid()} 1\n")
    reused = _run_dir(tmp_path, "broky-run-reused", f"{me} 1\n")  # our PID, another start time
    alive = _run_dir(tmp_path, "broky-run-alive", f"{me} {process_start_time(me)}\n")
    legacy_dead = _run_dir(tmp_path, "broky-abc123", None)
    _socket_file(legacy_dead / "worker-0.sock", listening=False)
    legacy_live = _run_dir(tmp_path, "broky-def456", None)
    listener = _socket_file(legacy_live / "worker-0.sock", listening=True)
    other = _run_dir(tmp_path, "broky-bench-nats-x", None)  # not a run directory
    (other / "nats.conf").write_text("", encoding="ascii")
    unrelated = _run_dir(tmp_path, "something-else", f"{_dead_pid()} 1\n")
    try:
        assert sorted(stale_run_dirs(tmp_path)) == sorted([dead, reused, legacy_dead])
        made = make_run_dir(str(tmp_path))
    finally:
        assert listener is not None
        listener.close()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [made.name, alive.name, legacy_live.name, other.name, unrelated.name]
    )
    assert made.name.startswith("broky-run-")
    assert (made / OWNER_FILE).read_text(encoding="ascii").split() == [
        str(me),
        str(process_start_time(me)),
    ]


def _serve(tmp_path: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "broky", "serve", "--port", "0", "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        start_new_session=True,
    )
    assert process.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if "workers" in line and "node" in line:
            return process
        assert line, "broky serve exited before it served"
    raise AssertionError("broky serve did not start within 30 s")


def _run_dirs(tmp_path: Path) -> list[Path]:
    return sorted(path for path in tmp_path.iterdir() if path.name.startswith("broky-run-"))


def _stop(process: subprocess.Popen[str], sig: signal.Signals) -> None:
    """Signal the process group, wait, and close the pipe; SIGKILL what remains."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(15)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # workers of a killed supervisor
        if process.stderr is not None:
            process.stderr.close()


@pytest.mark.slow
def test_a_supervisor_cleans_up_after_one_killed_by_sigkill(tmp_path: Path) -> None:
    first = _serve(tmp_path)
    try:
        (left_behind,) = _run_dirs(tmp_path)
        os.kill(first.pid, signal.SIGKILL)  # the supervisor alone: no cleanup possible
        first.wait(5)
        assert left_behind.exists()
    finally:
        _stop(first, signal.SIGKILL)
    second = _serve(tmp_path)
    try:
        (current,) = _run_dirs(tmp_path)
        assert current != left_behind
        assert not left_behind.exists()
    finally:
        _stop(second, signal.SIGTERM)
    assert not _run_dirs(tmp_path)  # a clean stop removes its own
