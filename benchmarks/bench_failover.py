"""Failover time of the replicated cluster's metadata path, as JSON lines.

Run: ``.venv/bin/python -m benchmarks.bench_failover [--cycles N] [--vbuckets V]``.

Each cycle starts a fresh cluster (its own name in one local etcd, tuned as
broky.cluster.local_etcd says) of three ``broky serve --cluster`` processes
(one worker each), waits for placement, then:

1. SIGKILLs the node leading the most vbuckets and measures the time from
   the signal to etcd holding a new leader (epoch + 1) for every vbucket it
   led: lease expiry + the controller's watch + its CAS txns;
2. SIGTERMs another node (a clean stop revokes its lease) and measures the
   same;
3. on a second fresh cluster, SIGSTOPs the node leading the most vbuckets
   (a paused leader: its sockets stay open, its lease is not renewed) and
   measures the same.

Times are read by polling etcd every 10 ms, so they carry up to 10 ms of
polling error. Clients re-finding leaders is not measured (there is no
data path yet). One JSON object per cycle, then a summary with
p50 / p90 / max per kind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

from benchmarks.interrupt import stop_children_on_signals
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.local_etcd import local_etcd
from broky.cluster.status import ClusterStatus, read_status

#: Bound on any one wait in a cycle: a failover that takes longer is a bug.
WAIT_TIMEOUT = 30.0
POLL_INTERVAL = 0.01


@trio.lowlevel.enable_ki_protection
def start_node(etcd_url: str, cluster: str, node_id: str, vbuckets: int, log: Path) -> int:
    """Start one node; its pid. Shielded from KeyboardInterrupt (trio
    delivers it at the next checkpoint instead): raised inside ``Popen``
    after the fork, it lost the pid and left the node running after the
    benchmark was stopped."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broky",
                "serve",
                "--port",
                "0",
                "--workers",
                "1",
                "--cluster",
                etcd_url,
                "--node-id",
                node_id,
                "--cluster-name",
                cluster,
                "--vbuckets",
                str(vbuckets),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    return process.pid


async def wait_until(
    client: EtcdClient, keys: ClusterKeys, done: Callable[[ClusterStatus], bool]
) -> float:
    started = time.monotonic()
    with trio.fail_after(WAIT_TIMEOUT):
        while not done(await read_status(client, keys)):  # noqa: ASYNC110 - polling etcd
            await trio.sleep(POLL_INTERVAL)
    return time.monotonic() - started


async def fail_over(
    client: EtcdClient, keys: ClusterKeys, pids: dict[str, int], victim: str, signum: int
) -> tuple[float, int]:
    """Signal ``victim``; returns (seconds until its vbuckets have new leaders,
    how many). A SIGSTOPped victim stays in ``pids`` (``stop_nodes`` resumes it)."""
    before = await read_status(client, keys)
    led = {v: s.state.epoch for v, s in before.vbuckets.items() if s.state.leader == victim}
    sent = time.monotonic()
    pid = pids[victim] if signum == signal.SIGSTOP else pids.pop(victim)
    os.kill(pid, signum)
    await wait_until(
        client,
        keys,
        lambda s: all(
            s.vbuckets[v].state.leader not in (None, victim) and s.vbuckets[v].state.epoch > epoch
            for v, epoch in led.items()
        ),
    )
    elapsed = time.monotonic() - sent
    if signum != signal.SIGSTOP:
        await trio.to_thread.run_sync(os.waitpid, pid, 0)
    return elapsed, len(led)


async def busiest_leader(client: EtcdClient, keys: ClusterKeys, nodes: list[str]) -> str:
    """The node leading the most vbuckets now."""
    status = await read_status(client, keys)
    leads = dict.fromkeys(nodes, 0)
    for stored in status.vbuckets.values():
        if stored.state.leader in leads:
            leads[stored.state.leader] += 1
    return max(sorted(leads), key=lambda node: leads[node])


async def start_nodes(
    client: EtcdClient, etcd_url: str, cluster: str, vbuckets: int, logs: Path, pids: dict[str, int]
) -> ClusterKeys:
    """Three nodes of ``cluster`` (their PIDs into ``pids``), placed."""
    keys = ClusterKeys.for_cluster(cluster)
    for node in ("n1", "n2", "n3"):
        pids[node] = start_node(etcd_url, cluster, node, vbuckets, logs / f"{cluster}-{node}.log")
    await wait_until(client, keys, lambda s: len(s.members) == 3 and len(s.vbuckets) == vbuckets)
    return keys


async def stop_nodes(pids: dict[str, int]) -> None:
    for pid in pids.values():
        os.kill(pid, signal.SIGCONT)  # a paused one takes its SIGTERM
        os.kill(pid, signal.SIGTERM)
    for pid in pids.values():
        await trio.to_thread.run_sync(os.waitpid, pid, 0)


async def cycle(etcd_url: str, number: int, vbuckets: int, logs: Path) -> dict[str, object]:
    """One cluster for the SIGKILL then SIGTERM, another for the SIGSTOP (a
    resumed node finds its lease gone, and the two would interfere)."""
    async with EtcdClient.from_url(etcd_url) as client:
        pids: dict[str, int] = {}
        try:
            keys = await start_nodes(client, etcd_url, f"bench{number}", vbuckets, logs, pids)
            victim = await busiest_leader(client, keys, sorted(pids))
            killed, killed_count = await fail_over(client, keys, pids, victim, signal.SIGKILL)
            stopped_node = sorted(pids)[0]
            stopped, stopped_count = await fail_over(
                client, keys, pids, stopped_node, signal.SIGTERM
            )
        finally:
            await stop_nodes(pids)
        pids = {}
        try:
            keys = await start_nodes(client, etcd_url, f"bench{number}p", vbuckets, logs, pids)
            paused_node = await busiest_leader(client, keys, sorted(pids))
            paused, paused_count = await fail_over(client, keys, pids, paused_node, signal.SIGSTOP)
        finally:
            await stop_nodes(pids)
    return {
        "cycle": number,
        "sigkill_failover_s": round(killed, 4),
        "sigkill_vbuckets": killed_count,
        "sigterm_failover_s": round(stopped, 4),
        "sigterm_vbuckets": stopped_count,
        "sigstop_failover_s": round(paused, 4),
        "sigstop_vbuckets": paused_count,
    }


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def run(cycles: int, vbuckets: int) -> None:
    with tempfile.TemporaryDirectory(prefix="broky-failover-") as tmp:
        logs = Path(tmp)
        with local_etcd(logs / "etcd") as etcd_url:
            results = []
            for number in range(cycles):
                result = await cycle(etcd_url, number, vbuckets, logs)
                print(json.dumps(result), flush=True)
                results.append(result)
    summary: dict[str, object] = {"summary": True, "cycles": cycles, "vbuckets": vbuckets}
    for kind in ("sigstop_failover_s", "sigkill_failover_s", "sigterm_failover_s"):
        values = [float(str(result[kind])) for result in results]
        summary[kind] = {
            "p50": round(percentile(values, 0.5), 4),
            "p90": round(percentile(values, 0.9), 4),
            "max": round(max(values), 4),
        }
    print(json.dumps(summary), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--vbuckets", type=int, default=256)
    args = parser.parse_args()
    stop_children_on_signals()
    trio.run(run, args.cycles, args.vbuckets)


if __name__ == "__main__":
    main()
