"""A local etcd for tests, benchmarks and trying a cluster on one machine.

Debian's ``etcd-server`` package provides the binary (``make test``
installs it when missing). It is started on loopback ports in a data dir
of the caller's, with ``--heartbeat-interval=50 --election-timeout=500``:
etcd's floor for a lease is 1.5 x its election timeout, so with its
defaults (1 s) a 1 s node lease would be granted as 2 s and failover would
wait twice as long. Those values suit loopback and a LAN, not a WAN.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import trio

#: How long etcd may take to answer its first request (0.3 s here).
START_TIMEOUT = 15.0

#: etcd's Raft timing for a local cluster, in milliseconds.
TUNED_FLAGS = ("--heartbeat-interval=50", "--election-timeout=500")


class EtcdNotFound(Exception):
    """There is no ``etcd`` binary on PATH."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
@trio.lowlevel.enable_ki_protection
def local_etcd(
    data_dir: Path, client_port: int = 0, host: str = "127.0.0.1", wrapper: Sequence[str] = ()
) -> Iterator[str]:
    """Run a one-member etcd in ``data_dir`` and yield its ``etcd://`` URL;
    it is stopped by PID on exit. ``client_port`` 0 picks a free port.
    ``host`` and ``wrapper`` (a command prefix that execs etcd, keeping its
    PID: ``ip netns exec NS``) let fault tests run it in a network
    namespace of its own.

    Raises EtcdNotFound without the binary, RuntimeError (with the end of
    etcd's log) if it does not start. Inside ``trio.run`` a KeyboardInterrupt
    (a stopped benchmark) waits for the next checkpoint while etcd starts
    and stops: raised inside ``Popen`` after the fork, it would leave etcd
    running with no one to stop it."""
    binary = shutil.which("etcd")
    if binary is None:
        raise EtcdNotFound("etcd is not installed: apt-get install -y etcd-server")
    data_dir.mkdir(parents=True, exist_ok=True)
    client_port = client_port or _free_port()
    client = f"http://{host}:{client_port}"
    peer = f"http://{host}:{_free_port()}"
    log_path = data_dir / "etcd.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                *wrapper,
                binary,
                "--name=broky-local",
                f"--data-dir={data_dir / 'data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=broky-local={peer}",
                *TUNED_FLAGS,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_healthy(process, client, log_path)
        yield f"etcd://{host}:{client_port}"
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def _wait_healthy(process: subprocess.Popen[bytes], client: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            with urllib.request.urlopen(f"{client}/health", timeout=1) as answer:
                if b"true" in answer.read():
                    return
        except (urllib.error.URLError, OSError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"etcd did not start (exit status {process.poll()}):\n{tail}")
        time.sleep(0.05)
