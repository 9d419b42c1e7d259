"""A real etcd for the cluster tests: one per test session, on loopback.

etcd comes from Debian's ``etcd-server`` (``make test`` installs it when
``etcd`` is missing). It runs with ``--heartbeat-interval=50
--election-timeout=500`` so a 1 s lease is granted as 1 s (etcd's floor is
1.5 x its election timeout), in a temp data dir, and is stopped by PID.
Each test works under its own key prefix, so tests share the server.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broky.cluster.etcd import EtcdClient

#: How long etcd may take to answer its first request (0.3 s here).
START_TIMEOUT = 15.0

_prefixes = itertools.count()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def etcd_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``etcd://127.0.0.1:PORT`` of a running etcd."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.fail("etcd is not installed: run `make test`, or `apt-get install -y etcd-server`")
    data_dir: Path = tmp_path_factory.mktemp("etcd")
    client_port, peer_port = _free_port(), _free_port()
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    log = (data_dir / "etcd.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            "--name=broky-test",
            f"--data-dir={data_dir / 'data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=broky-test={peer}",
            "--heartbeat-interval=50",
            "--election-timeout=500",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as answer:
                    if b"true" in answer.read():
                        break
            except (urllib.error.URLError, OSError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = (data_dir / "etcd.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"etcd did not start (exit {process.poll()}):\n{tail}")
            time.sleep(0.05)
        yield f"etcd://127.0.0.1:{client_port}"
    finally:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture
def prefix() -> bytes:
    """A key prefix no other test of the session uses."""
    return f"/broky-test/{os.getpid()}-{next(_prefixes)}/".encode()


@pytest.fixture
async def etcd(etcd_url: str) -> AsyncIterator[EtcdClient]:
    """A client of the session's etcd."""
    async with EtcdClient.from_url(etcd_url) as client:
        yield client
