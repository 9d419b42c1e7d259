"""A longer Jepsen-style run of the replicated cluster than CI's 20 cycles.

Run: ``.venv/bin/python scripts/jepsen_replication.py --cycles 200 [--seed N]
[--clients C] [--netns]``. Starts its own etcd (Debian's ``etcd-server``) and three
``broky serve`` nodes in a temp dir, runs ``tests.cluster.jepsen.run`` (the
same nemesis, publishers and checker as the CI test) and prints one JSON
summary: fault counts, acked messages, lost / divergent / out-of-order
(all must be 0), duplicates, acks an isolated leader gave after its lease
was gone (must be 0), and the failover-time distribution. Exits 1 if the
checker found a violation. ``--netns`` runs etcd and the nodes in network
namespaces with real link partitions as the faults (as root; the CI test
``tests/cluster/test_partitions.py`` runs 12), with ``--workers N`` worker
processes per node. Keep --keep to look at the
nodes' logs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broky.cluster.etcd import EtcdClient
from broky.cluster.local_etcd import local_etcd
from tests.cluster import jepsen


async def _run_partitioned(directory: Path, args: argparse.Namespace) -> jepsen.Report:
    return await jepsen.run_partitioned(
        directory, args.cycles, args.seed, args.clients, args.workers
    )


async def _run(url: str, directory: Path, args: argparse.Namespace) -> jepsen.Report:
    async with EtcdClient.from_url(url) as etcd:
        return await jepsen.run(
            url, etcd, "jepsen", directory, args.cycles, seed=args.seed, clients=args.clients
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument(
        "--netns", action="store_true", help="real link partitions in network namespaces"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes per node (with --netns)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir and print it")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="jepsen-replication-"))
    try:
        if args.netns:
            report = trio.run(_run_partitioned, directory, args)
        else:
            with local_etcd(directory / "etcd") as url:
                report = trio.run(_run, url, directory, args)
    finally:
        if args.keep:
            print(f"kept {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(report.summary()))
    for reason in report.gave_up:  # why batches ended indeterminate (the first few)
        print(f"gave up: {reason}", file=sys.stderr)
    verdict = report.verdict
    if verdict is not None:  # each violation named (the first 20 of a kind)
        for kind in ("lost", "divergent", "out_of_order"):
            for violation in list(getattr(verdict, kind))[:20]:
                print(f"{kind}: {violation}", file=sys.stderr)
    for late in report.late_acks[:20]:
        print(f"ack after lease lost: {late}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
