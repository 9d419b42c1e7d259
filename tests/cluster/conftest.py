"""A real etcd for the cluster tests: one per test session, on loopback.

etcd comes from Debian's ``etcd-server`` (``make test`` installs it when
``etcd`` is missing); broky.cluster.local_etcd starts it with the Raft
timing that lets a 1 s lease be 1 s, in a temp data dir, and stops it by
PID. Each test works under its own key prefix, so tests share the server.
Its data lives in memory where the host allows (``MEMORY_DIR``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broky.cluster.etcd import EtcdClient
from broky.cluster.local_etcd import EtcdNotFound, local_etcd
from tests.cluster import netns

_prefixes = itertools.count()


#: Where the session's etcd keeps its data when the host has it: a tmpfs.
#: etcd fsyncs its log on every write (leases, ISR changes, elections);
#: on a small CI box whose disk the nodes under test fsync to as well, a
#: slow fsync there delays lease renewals past their TTL and turns into
#: failovers no test asked for. Its data is thrown away anyway.
MEMORY_DIR = Path("/dev/shm")


@pytest.fixture(scope="session")
def etcd_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``etcd://127.0.0.1:PORT`` of a running etcd."""
    in_memory = MEMORY_DIR.is_dir() and os.access(MEMORY_DIR, os.W_OK)
    data_dir = (
        Path(tempfile.mkdtemp(prefix="broky-etcd-", dir=MEMORY_DIR))
        if in_memory
        else tmp_path_factory.mktemp("etcd")
    )
    try:
        with local_etcd(data_dir) as url:
            yield url
    except EtcdNotFound as exc:
        pytest.fail(f"{exc} (or run `make test`)")
    finally:
        if in_memory:
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def prefix() -> bytes:
    """A key prefix no other test of the session uses."""
    return f"/broky-test/{os.getpid()}-{next(_prefixes)}/".encode()


@pytest.fixture
def cluster_name(prefix: bytes) -> str:
    """A cluster name (its keys under ``/broky/<name>/``) no other test uses;
    a module may override it with a letter of its own."""
    return "c" + prefix.decode().strip("/").replace("/", "-")


@pytest.fixture
async def etcd(etcd_url: str) -> AsyncIterator[EtcdClient]:
    """A client of the session's etcd."""
    async with EtcdClient.from_url(etcd_url) as client:
        yield client


@pytest.fixture(scope="session")
def netns_cleanup() -> Iterator[None]:
    """Remove, at the end of the session, any network namespace this
    process created that a test's own ``finally`` did not (tests/cluster/netns.py)."""
    yield
    if shutil.which("ip"):
        netns.sweep_mine()
