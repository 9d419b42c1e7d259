"""Rebalancing under acked load: how long a join and a removal take, and
what publishers get meanwhile, as JSON lines.

Run: ``.venv/bin/python -m benchmarks.bench_rebalance [--preload S]
[--seconds S] [--clients C] [--batch B] [--size N]``.

A local etcd and three ``broky serve --cluster ...`` nodes with replication
factor 2 and one durable topic (8 partitions, ``fsync = "always"``). The
clients (``ClusterPublisher``, one acked batch in flight each) publish for
``--preload`` seconds, so the partitions have logs to copy, then keep
publishing through three phases, each a JSON line with its acked rate:

- ``steady``: ``--seconds`` with nothing moving (the baseline of this run);
- ``join``: a fourth node starts; ends when the map is balanced over four
  nodes with every replica in sync (``seconds``: from its start);
- ``remove``: ``broky cluster remove-node n1``; ends when n1 holds nothing
  and the map is balanced over the other three.

The last line counts every acked message missing at its acked offset from
an in-sync replica of its partition (``lost``) and the records stored
beyond those acked (``extra_records``: a batch whose leader was deposed
after storing it fails with NotLeader, and its retry is stored again, as
``ClusterPublisher`` retries have no cross-node producer id). Nodes and
client share this machine's cores, so rates compare phases of one run.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

from benchmarks.interrupt import stop_children_on_signals
from broky.client.cluster import ClusterPublisher
from broky.client.errors import BrokyError
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.local_etcd import local_etcd
from broky.cluster.status import ClusterStatus, read_status
from broky.replication.local_cluster import LocalNode, TopicSpec, balanced, partition_vbuckets

TOPIC = TopicSpec(partitions=8)
CLUSTER = "bench"
#: Bound for a phase to end on a loaded machine.
PHASE_BOUND = 120.0


class Load:
    """Acked publishes of all clients: (partition, first offset, last
    offset) per run, and the count of messages acked so far."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, int, int]] = []
        self.messages = 0
        self.gave_up = 0

    async def client(
        self, seeds: list[str], index: int, args: argparse.Namespace, stop: trio.Event
    ) -> None:
        payload = b"x" * args.size
        async with ClusterPublisher.open(seeds, retry_for=10) as publisher:
            round_ = 0
            while not stop.is_set():
                key = f"orders.c{index}.k{round_ % 32}"
                round_ += 1
                try:
                    runs = await publisher.publish(key, [payload] * args.batch)
                except BrokyError:
                    self.gave_up += 1
                    continue
                for run in runs:
                    self.runs.append((run.partition, run.first_offset, run.last_offset))
                    self.messages += run.last_offset - run.first_offset + 1


async def _until(etcd: EtcdClient, check: Callable[[ClusterStatus], bool]) -> ClusterStatus:
    keys = ClusterKeys.for_cluster(CLUSTER)
    with trio.fail_after(PHASE_BOUND):
        while True:
            status = await read_status(etcd, keys)
            if check(status):
                return status
            await trio.sleep(0.05)


def _phase(name: str, load: Load, before: int, started: float, **extra: object) -> None:
    elapsed = trio.current_time() - started
    acked = load.messages - before
    line = {"phase": name, "seconds": round(elapsed, 2), "acked_messages": acked}
    line["msgs_per_s"] = round(acked / elapsed) if elapsed else 0
    print(json.dumps({**line, **extra}), flush=True)


async def run(etcd_url: str, directory: Path, args: argparse.Namespace) -> None:
    nodes = [
        LocalNode(etcd_url, CLUSTER, f"n{i}", directory / f"n{i}", TOPIC, replication_factor=2)
        for i in range(1, 5)
    ]
    load = Load()
    try:
        async with EtcdClient.from_url(etcd_url) as etcd:
            for node in nodes[:3]:
                node.start()
            await _until(etcd, lambda s: balanced(s, {"n1", "n2", "n3"}))
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                seeds = [n.address for n in nodes[:3]]
                for index in range(args.clients):
                    nursery.start_soon(load.client, seeds, index, args, stop)
                await trio.sleep(args.preload)
                before, started = load.messages, trio.current_time()
                await trio.sleep(args.seconds)
                _phase("steady", load, before, started)
                before, started = load.messages, trio.current_time()
                nodes[3].start()
                await _until(etcd, lambda s: balanced(s, {"n1", "n2", "n3", "n4"}))
                _phase("join", load, before, started, preloaded_messages=before)
                before, started = load.messages, trio.current_time()
                remove = ["cluster", "remove-node", "n1", "--cluster-name", CLUSTER]
                await trio.run_process(
                    [sys.executable, "-m", "broky", *remove, "--etcd", etcd_url],
                    capture_stdout=True,
                )
                final = await _until(etcd, lambda s: balanced(s, {"n2", "n3", "n4"}))
                _phase("remove", load, before, started)
                stop.set()
            await trio.sleep(0.5)
        for node in nodes:
            node.stop(signal.SIGTERM)
        lost, extra = _check(nodes, load, final)
        print(
            json.dumps(
                {
                    "acked_messages": load.messages,
                    "lost": lost,
                    "extra_records": extra,
                    "batches_given_up": load.gave_up,
                    "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            )
        )
    finally:
        for node in nodes:
            node.stop(signal.SIGKILL)


def _check(nodes: list[LocalNode], load: Load, final: ClusterStatus) -> tuple[int, int]:
    held = {node.node_id: node.records(TOPIC.name) for node in nodes}
    offsets = {
        (node, p): {offset for offset, _key, _msg in records}
        for node, parts in held.items()
        for p, records in parts.items()
    }
    lost = 0
    for partition, vbucket in partition_vbuckets(TOPIC).items():
        in_sync = [node for node, _ in final.vbuckets[vbucket].state.isr]
        runs = [(first, last) for p, first, last in load.runs if p == partition]
        for node in in_sync:
            have = offsets.get((node, partition), set())
            lost += sum(1 for first, last in runs for o in range(first, last + 1) if o not in have)
    extra = 0
    for partition in range(TOPIC.partitions):
        # The payloads are all alike: what is stored beyond the acks is extra.
        stored = max(len(parts.get(partition, [])) for parts in held.values())
        acked = sum(last - first + 1 for p, first, last in load.runs if p == partition)
        extra += max(0, stored - acked)
    return lost, extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preload", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    stop_children_on_signals()
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as temporary:
        directory = Path(temporary)
        with local_etcd(directory / "etcd") as url:
            trio.run(run, url, directory, args)


if __name__ == "__main__":
    main()
