"""Replicated Broky nodes as processes on loopback, for tests, benchmarks, scripts.

Each node is ``broky serve --workers 1 --cluster etcd://... --node-id N
--replication-listen 127.0.0.1:R`` with its own data dir and ports kept
across restarts, so a nemesis can SIGKILL, SIGSTOP/SIGCONT and restart it
as the same node (a new life: a new node epoch), and cut its replication
links with SIGUSR1 / heal them with SIGUSR2 (broky.replication.faults).
Stopped by PID. One
durable topic; ``replica_lag_max`` and the lease TTL are set for quick
failovers (1 s each).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from broky.cluster.placement import vbucket_of
from broky.cluster.status import ClusterStatus
from broky.replication.faults import ENVIRONMENT
from broky.storage.reader import iter_records

#: Vbuckets of a test cluster: few, so placement is quick to read.
VBUCKETS = 16


#: Ports this process has handed out. A port is free when chosen but only
#: bound when its node starts, and a cluster's nodes are all given their
#: ports before the first one starts: without this, the kernel could hand
#: one node's client port out again as another's (or its own) replication
#: port + i, and followers would then dial a client listener (seen: a
#: paused node's redirected clients refused for 30 s).
_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback port free now and not handed out before by this process."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def _free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free now and not handed out
    before (worker i uses +i)."""
    while True:
        first = free_port()
        try:
            for offset in range(1, count):
                if first + offset in _GIVEN:
                    raise OSError(f"port {first + offset} was handed out already")
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", first + offset))
        except OSError:
            continue
        _GIVEN.update(range(first, first + count))
        return first


@attrs.frozen
class TopicSpec:
    name: str = "orders"
    pattern: str = "orders.>"
    partitions: int = 4


class LocalNode:
    """One node process (see the module docstring)."""

    def __init__(
        self,
        etcd_url: str,
        cluster: str,
        node_id: str,
        directory: Path,
        topic: TopicSpec,
        replica_lag_max: float = 1.0,
        *,
        standalone: bool = False,
        replication_factor: int = 3,
        host: str = "127.0.0.1",
        wrapper: Sequence[str] = (),
        workers: int = 1,
        extra_config: str = "",
    ) -> None:
        """``standalone``: a plain single broker with the same topic (no
        cluster, no replication), the baseline benchmarks compare with.
        ``replication_factor`` counts if this node creates the cluster.
        ``host`` and ``wrapper`` (a command prefix that execs the node,
        keeping its PID: ``ip netns exec NS``) put it in a network
        namespace of its own for link-partition tests. With ``workers`` > 1
        each worker replicates the partitions it owns on the replication
        port + its index (ports chosen free for each). ``extra_config`` is
        TOML put before the ``[[durable]]`` table: top-level keys first,
        then tables (``cluster_token`` and ``[[users]]`` for auth tests)."""
        self.node_id = node_id
        self.directory = directory
        self.data_dir = directory / "data"
        self.port = free_port()
        self.replication_port = _free_ports(workers)
        self.address = f"{host}:{self.port}"
        self.paused = False
        self.starts = 0
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / "broky.toml"
        config.write_text(
            f'data_dir = "{self.data_dir}"\n'
            f"replica_lag_max = {replica_lag_max}\n"
            f"{extra_config}\n"
            "[[durable]]\n"
            f'name = "{topic.name}"\n'
            f'pattern = "{topic.pattern}"\n'
            f"partitions = {topic.partitions}\n"
            'fsync = "always"\n'
        )
        self.command = [
            *wrapper,
            sys.executable,
            "-m",
            "broky",
            "serve",
            "--config",
            str(config),
            "--port",
            str(self.port),
            "--workers",
            str(workers),
            "--log-level",
            "info",
            "--host",
            host,
        ]
        if host != "127.0.0.1":
            # Beyond loopback Broky wants users or this explicit choice.
            self.command.append("--allow-anonymous")
        cluster_flags = [
            "--cluster",
            etcd_url,
            "--node-id",
            node_id,
            "--cluster-name",
            cluster,
            "--vbuckets",
            str(VBUCKETS),
            "--replication-factor",
            str(replication_factor),
            "--replication-listen",
            f"{host}:{self.replication_port}",
        ]
        if not standalone:
            self.command += cluster_flags
        self.process: subprocess.Popen[bytes] | None = None

    @trio.lowlevel.enable_ki_protection
    def start(self) -> None:
        """Start the process. Shielded from KeyboardInterrupt inside
        ``trio.run`` (delivered at the next checkpoint instead): raised
        inside ``Popen`` after the fork, it would lose the process."""
        self.starts += 1
        with (self.directory / f"node.{self.starts}.log").open("wb") as output:
            self.process = subprocess.Popen(
                self.command,
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, ENVIRONMENT: "1"},
            )
        self.paused = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def send(self, signum: int) -> None:
        if self.running:
            assert self.process is not None
            os.kill(self.process.pid, signum)
            self.paused = signum == signal.SIGSTOP or (self.paused and signum != signal.SIGCONT)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 10) -> None:
        """Stop the process and wait for it (a paused one is resumed first,
        so that SIGTERM can act)."""
        if self.process is None:
            return
        if self.running:
            if self.paused and signum != signal.SIGKILL:
                os.kill(self.process.pid, signal.SIGCONT)
            os.kill(self.process.pid, signum)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout)
        self.paused = False

    def records(self, topic: str) -> dict[int, list[tuple[int, bytes, bytes]]]:
        """``(offset, key, message bytes)`` per partition as this node's
        files hold them (read with the node stopped)."""
        held: dict[int, list[tuple[int, bytes, bytes]]] = {}
        for record in iter_records(str(self.data_dir), topic):
            held.setdefault(record.partition, []).append(
                (record.offset, record.key, bytes(record.message))
            )
        return held


def partition_vbuckets(topic: TopicSpec) -> dict[int, int]:
    """The vbucket of each partition of ``topic``."""
    return {p: vbucket_of(topic.name, p, VBUCKETS) for p in range(topic.partitions)}


def leaders(status: ClusterStatus, topic: TopicSpec) -> dict[int, str | None]:
    """The leader etcd names for each partition of ``topic``."""
    found: dict[int, str | None] = {}
    for partition, vbucket in partition_vbuckets(topic).items():
        stored = status.vbuckets.get(vbucket)
        found[partition] = None if stored is None else stored.state.leader
    return found


def fully_in_sync(status: ClusterStatus, topic: TopicSpec, nodes: int) -> bool:
    """Every partition has a leader and all ``nodes`` replicas in its ISR,
    each in the life etcd registers for it now."""
    for vbucket in partition_vbuckets(topic).values():
        stored = status.vbuckets.get(vbucket)
        if stored is None or stored.state.leader is None:
            return False
        lives = {node: member.epoch for node, member in status.members.items()}
        isr = stored.state.isr
        if len(isr) != nodes or any(lives.get(node) != epoch for node, epoch in isr):
            return False
    return True


def balanced(status: ClusterStatus, nodes: set[str], vbuckets: int = VBUCKETS) -> bool:
    """Every vbucket placed on ``nodes`` only, replica counts within one of
    each other, led, fully in sync (each replica in the life etcd
    registers for it now) and not moving: a rebalance has ended."""
    if len(status.vbuckets) != vbuckets or status.moving():
        return False
    lives = {node: member.epoch for node, member in status.members.items()}
    copies: Counter[str] = Counter()
    for stored in status.vbuckets.values():
        state = stored.state
        copies.update(state.replicas)
        if state.leader is None or set(state.replicas) - nodes:
            return False
        if {n for n, _ in state.isr} != set(state.replicas):
            return False
        if any(lives.get(node) != life for node, life in state.isr):
            return False
    counts = [copies[node] for node in nodes]
    return min(counts) > 0 and max(counts) - min(counts) <= 1
