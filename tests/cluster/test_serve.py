"""``broky serve --cluster`` nodes as processes, and ``broky cluster status``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.status import read_status

VBUCKETS = 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Node:
    """One ``broky serve --cluster`` process, stopped by PID."""

    def __init__(self, etcd_url: str, cluster: str, node_id: str, log: Path) -> None:
        self.node_id = node_id
        self.log = log
        with log.open("wb") as output:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "broky",
                    "serve",
                    "--port",
                    str(free_port()),
                    "--workers",
                    "1",
                    "--log-level",
                    "info",
                    "--cluster",
                    etcd_url,
                    "--node-id",
                    node_id,
                    "--cluster-name",
                    cluster,
                    "--vbuckets",
                    str(VBUCKETS),
                ],
                stdout=output,
                stderr=subprocess.STDOUT,
            )

    def stop(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)
        self.process.wait(timeout=10)


@pytest.fixture
def cluster_name(prefix: bytes) -> str:
    return "t" + prefix.decode().strip("/").replace("/", "-")


@pytest.fixture
def nodes(etcd_url: str, cluster_name: str, tmp_path: Path) -> Iterator[list[Node]]:
    started = [Node(etcd_url, cluster_name, f"n{i}", tmp_path / f"n{i}.log") for i in (1, 2, 3)]
    try:
        yield started
    finally:
        for node in started:
            node.stop(signal.SIGKILL)


def status_json(etcd_url: str, cluster_name: str) -> dict[str, object]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "broky",
            "cluster",
            "status",
            "--etcd",
            etcd_url,
            "--cluster-name",
            cluster_name,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


async def wait_for(client: EtcdClient, keys: ClusterKeys, check: object) -> float:
    """Poll etcd until ``check(status)`` holds; returns the seconds it took."""
    assert callable(check)
    started = trio.current_time()
    while not check(await read_status(client, keys)):  # noqa: ASYNC110 - polling etcd
        await trio.sleep(0.02)
    return trio.current_time() - started


async def test_nodes_join_fail_over_and_leave(
    nodes: list[Node], etcd: EtcdClient, etcd_url: str, cluster_name: str
) -> None:
    keys = ClusterKeys.for_cluster(cluster_name)
    with trio.fail_after(30):
        await wait_for(etcd, keys, lambda s: len(s.members) == 3 and len(s.vbuckets) == VBUCKETS)
    report = await trio.to_thread.run_sync(status_json, etcd_url, cluster_name)
    assert sorted(report["members"]) == ["n1", "n2", "n3"]  # type: ignore[call-overload]
    vbuckets = report["vbuckets"]
    assert isinstance(vbuckets, dict)
    assert len(vbuckets) == VBUCKETS
    assert all(entry["epoch"] == 1 and len(entry["isr"]) == 3 for entry in vbuckets.values())

    # SIGKILL: the node's lease expires (1 s) and its vbuckets fail over.
    status = await read_status(etcd, keys)
    killed = nodes[0]
    led = {v for v, s in status.vbuckets.items() if s.state.leader == killed.node_id}
    killed.stop(signal.SIGKILL)
    with trio.fail_after(10):
        elapsed = await wait_for(
            etcd,
            keys,
            lambda s: (
                killed.node_id not in s.members
                and all(s.vbuckets[v].state.leader not in (None, killed.node_id) for v in led)
            ),
        )
    # A liveness bound (1 s lease + reaction), loose for loaded CI machines;
    # benchmarks/bench_failover.py measures the distribution.
    assert elapsed < 5.0, f"failover after SIGKILL took {elapsed:.2f} s"
    after = await read_status(etcd, keys)
    for vbucket in led:
        assert after.vbuckets[vbucket].state.epoch == status.vbuckets[vbucket].state.epoch + 1

    # SIGTERM: the node revokes its lease as it leaves, so failover is at once.
    stopped = nodes[1]
    stopped.stop(signal.SIGTERM)
    assert stopped.process.returncode == 0, stopped.log.read_text()
    with trio.fail_after(10):
        await wait_for(
            etcd,
            keys,
            lambda s: (
                set(s.members) == {"n3"}
                and all(entry.state.leader == "n3" for entry in s.vbuckets.values())
            ),
        )
    done = await trio.run_process(
        [
            sys.executable,
            "-m",
            "broky",
            "cluster",
            "status",
            "--etcd",
            etcd_url,
            "--cluster-name",
            cluster_name,
            "--topic",
            "orders",
            "--partitions",
            "2",
        ],
        capture_stdout=True,
    )
    text = done.stdout.decode()
    assert text.startswith("1 live node(s), controller n3")
    assert "orders/1 -> vbucket" in text
    assert f"{VBUCKETS} vbuckets placed, {VBUCKETS} under-replicated, 0 offline" in text


async def test_a_paused_node_is_replaced_and_comes_back_as_a_new_life(
    nodes: list[Node], etcd: EtcdClient, cluster_name: str
) -> None:
    """SIGSTOP past the lease (a zombie): its vbuckets fail over while it
    sleeps; after SIGCONT it finds its lease gone, registers again with a
    new node epoch, leads nothing, and its old life is in no ISR."""
    keys = ClusterKeys.for_cluster(cluster_name)
    with trio.fail_after(30):
        await wait_for(etcd, keys, lambda s: len(s.members) == 3 and len(s.vbuckets) == VBUCKETS)
    before = await read_status(etcd, keys)
    paused = nodes[0]
    old_life = before.members[paused.node_id].epoch
    led = {v for v, s in before.vbuckets.items() if s.state.leader == paused.node_id}
    os.kill(paused.process.pid, signal.SIGSTOP)
    try:
        with trio.fail_after(10):
            await wait_for(
                etcd,
                keys,
                lambda s: (
                    paused.node_id not in s.members
                    and all(s.vbuckets[v].state.leader not in (None, paused.node_id) for v in led)
                ),
            )
    finally:
        os.kill(paused.process.pid, signal.SIGCONT)
    with trio.fail_after(10):
        await wait_for(etcd, keys, lambda s: paused.node_id in s.members)
    after = await read_status(etcd, keys)
    assert after.members[paused.node_id].epoch > old_life
    for vbucket, stored in after.vbuckets.items():
        assert stored.state.leader != paused.node_id
        assert (paused.node_id, old_life) not in stored.state.isr
        if vbucket in led:
            assert stored.state.epoch == before.vbuckets[vbucket].state.epoch + 1
    assert paused.process.poll() is None  # it kept running


def test_status_of_an_empty_cluster(etcd_url: str, cluster_name: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "broky",
            "cluster",
            "status",
            "--etcd",
            etcd_url,
            "--cluster-name",
            cluster_name,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "no cluster here yet" in done.stdout


def test_serve_refuses_a_cluster_without_node_id(etcd_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "broky", "serve", "--cluster", etcd_url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "needs node_id" in done.stderr


def test_status_reports_an_unreachable_etcd() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "broky", "cluster", "status", "--etcd", "etcd://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "cannot read the cluster" in done.stderr


def start_cluster_etcd(data_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broky",
                "cluster",
                "etcd",
                "--data-dir",
                str(data_dir),
                "--port",
                str(port),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )


async def test_cluster_etcd_runs_a_local_etcd_until_interrupted(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "etcd.out"
    process = start_cluster_etcd(tmp_path / "d", port, log)
    try:
        with trio.fail_after(20):
            while b"etcd listening" not in log.read_bytes():  # noqa: ASYNC110 - a log file
                await trio.sleep(0.05)
            async with EtcdClient.from_url(f"etcd://127.0.0.1:{port}") as client:
                assert (await client.get(b"x")).revision >= 1
            os.kill(process.pid, signal.SIGINT)
            assert await trio.to_thread.run_sync(process.wait) == 0
        # etcd went with it.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
