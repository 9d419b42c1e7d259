"""Acked publish throughput: RF 3 with ``acks = "all"`` vs one node, as JSON lines.

Run: ``.venv/bin/python -m benchmarks.bench_replication [--seconds S]
[--clients C[,C...]] [--in-flight N] [--batch B] [--size N]``.

``--clients 8,32,64`` repeats both setups at each count, a ratio line
after each pair: RF 3 is latency-bound at few clients (every ack waits for
a follower's round), while one node is soon bound by this one client
process's CPU, so the ratio depends on the count and one count alone
misreads it either way. Each client keeps ``--in-flight`` acked batches in
flight (default ``ClusterPublisher``'s, 5: as many publishing tasks sharing
one publisher), so a follower's round carries several batches per client.

Both setups run in this one session on this machine, with the same
client (``broky.client.cluster.ClusterPublisher``), the same durable topic
(4 partitions, ``fsync = "always"``) and the same load:

- ``single``: one ``broky serve --workers 1``, no cluster: acked when the
  leader's group-committed fsync returns;
- ``rf3_acks_all``: a local etcd and three ``broky serve --cluster ...
  --replication-listen ...`` nodes on this machine: acked when every
  in-sync replica (all three when healthy) has fsynced (the high watermark).

Then the same load against NATS JetStream in the same run (unless
``--no-jetstream``, or nats-server is missing): ``jetstream_single``, one
``nats-server -js`` and a one-replica file stream; ``jetstream_r3``, three
clustered servers (``broky.loadtest.jetstream_cluster``) and a stream with
three replicas, the publishers spread over the servers. Each publisher
waits for windows of ``--in-flight`` x ``--batch`` acked publishes, the
messages of Broky's batches one PUB each, keyed as Broky's. JetStream 2.9
does not fsync per ack while these Broky rows do (``fsync = "always"``), so
compare the ratios (``ratio_rf3_to_single`` against
``jetstream_ratio_r3_to_single``), not Broky's rates against JetStream's.

Each setup is stopped afterwards and every acked message is looked up at
its acked offset in every replica's files: ``lost`` counts those missing.
``node_cpu_s`` (each node's CPU seconds during the load) and
``server_cpu_us_per_msg`` compare runs on a shared machine, where the rate
mostly measures the share of the cores a run got.
Three nodes on one machine share its cores and disk with the client, so
this is the replication protocol's overhead under contention, not a
cluster's capacity.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import trio

from benchmarks.interrupt import stop_children_on_signals
from broky.client.cluster import MAX_IN_FLIGHT, ClusterPublisher
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.local_etcd import local_etcd
from broky.cluster.status import read_status
from broky.loadtest import jetstream, peers
from broky.loadtest.jetstream_cluster import jetstream_cluster
from broky.loadtest.servers import cpu_seconds
from broky.replication.local_cluster import LocalNode, TopicSpec, fully_in_sync

TOPIC = TopicSpec()


async def _load(
    nodes: list[LocalNode], args: argparse.Namespace
) -> tuple[int, float, list[tuple[int, int, int]]]:
    """Publish for ``args.seconds``; returns (messages acked, elapsed, acked runs)."""
    acked: list[tuple[int, int, int]] = []
    deadline = trio.current_time() + args.seconds
    payload = b"x" * args.size

    async def client(index: int) -> None:
        rounds = itertools.count()
        async with ClusterPublisher.open(
            [n.address for n in nodes], retry_for=5, max_in_flight=args.in_flight
        ) as publisher:

            async def batches() -> None:
                while trio.current_time() < deadline:
                    key = f"orders.c{index}.k{next(rounds) % 16}"
                    runs = await publisher.publish(key, [payload] * args.batch)
                    acked.extend((r.partition, r.first_offset, r.last_offset) for r in runs)

            async with trio.open_nursery() as nursery:
                for _ in range(args.in_flight):
                    nursery.start_soon(batches)

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for index in range(args.clients):
            nursery.start_soon(client, index)
    elapsed = trio.current_time() - started
    return sum(last - first + 1 for _, first, last in acked), elapsed, acked


def _lost(nodes: list[LocalNode], acked: list[tuple[int, int, int]]) -> int:
    lost = 0
    for node in nodes:
        held = {
            p: {offset for offset, _key, _msg in records}
            for p, records in node.records(TOPIC.name).items()
        }
        for partition, first, last in acked:
            lost += sum(1 for o in range(first, last + 1) if o not in held.get(partition, set()))
    return lost


def _cpu_seconds(node: LocalNode) -> float:
    """User + system CPU the node's process has used so far (Linux /proc):
    on a shared machine a rate mostly measures the share of the cores the
    run got, while CPU per message compares runs fairly."""
    assert node.process is not None
    fields = Path(f"/proc/{node.process.pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(
    nodes: list[LocalNode], mode: str, args: argparse.Namespace
) -> dict[str, object]:
    before = [_cpu_seconds(node) for node in nodes]
    client_before = time.process_time()
    count, elapsed, acked = await _load(nodes, args)
    client_cpu = time.process_time() - client_before
    cpu = [_cpu_seconds(node) - start for node, start in zip(nodes, before, strict=True)]
    await trio.sleep(0.5)
    for node in nodes:
        node.stop(signal.SIGTERM)
    load = {"in_flight": args.in_flight, "batch": args.batch}
    return _row(mode, args, load, elapsed, count, cpu, client_cpu, _lost(nodes, acked))


def _row(
    mode: str,
    args: argparse.Namespace,
    load: dict[str, object],
    elapsed: float,
    acked: int,
    cpu: list[float],
    client_cpu: float,
    lost: int,
) -> dict[str, object]:
    """One mode's JSON row, Broky's and JetStream's alike (``load``: how
    each drove its publishes)."""
    return {
        "mode": mode,
        "clients": args.clients,
        **load,
        "message_bytes": args.size,
        "seconds": round(elapsed, 2),
        "acked_messages": acked,
        "msgs_per_s": round(acked / elapsed),
        # CPU seconds per node during the load, and per acked message over
        # all nodes (the client's apart: it is the same load in every mode).
        "node_cpu_s": [round(seconds, 2) for seconds in cpu],
        "server_cpu_us_per_msg": round(sum(cpu) / max(acked, 1) * 1e6, 2),
        "client_cpu_s": round(client_cpu, 2),
        "lost": lost,
    }


async def _single(directory: Path, args: argparse.Namespace) -> dict[str, object]:
    node = LocalNode("", "", "solo", directory / "solo", TOPIC, standalone=True)
    node.start()
    try:
        with trio.fail_after(30):
            while True:
                try:
                    await (await trio.open_tcp_stream("127.0.0.1", node.port)).aclose()
                    break
                except OSError:
                    await trio.sleep(0.05)
        return await _measure([node], "single", args)
    finally:
        node.stop(signal.SIGKILL)


async def _replicated(
    etcd_url: str, directory: Path, args: argparse.Namespace
) -> dict[str, object]:
    keys = ClusterKeys.for_cluster("bench")
    nodes = [LocalNode(etcd_url, "bench", f"n{i}", directory / f"n{i}", TOPIC) for i in (1, 2, 3)]
    try:
        for node in nodes:
            node.start()
        async with EtcdClient.from_url(etcd_url) as etcd:
            with trio.fail_after(30):
                while not fully_in_sync(await read_status(etcd, keys), TOPIC, 3):  # noqa: ASYNC110 - polling etcd
                    await trio.sleep(0.05)
        return await _measure(nodes, "rf3_acks_all", args)
    finally:
        for node in nodes:
            node.stop(signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--clients",
        type=lambda text: [int(count) for count in text.split(",")],
        default=[8],
        help="publishing clients, or a comma-separated list of counts to run in turn",
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=MAX_IN_FLIGHT,
        help="acked batches each client keeps in flight (publishing tasks per publisher)",
    )
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument(
        "--no-jetstream", action="store_true", help="skip the same-run NATS JetStream rows"
    )
    args = parser.parse_args()
    stop_children_on_signals()
    for clients in args.clients:
        _pair(argparse.Namespace(**{**vars(args), "clients": clients}))


def _pair(args: argparse.Namespace) -> None:
    """One node, then RF 3, at ``args.clients``; then JetStream the same
    way (unless ``--no-jetstream``); then the ratios."""
    with tempfile.TemporaryDirectory(prefix="bench-replication-") as temporary:
        directory = Path(temporary)
        single = trio.run(_single, directory, args)
        print(json.dumps(single), flush=True)
        with local_etcd(directory / "etcd") as url:
            replicated = trio.run(_replicated, url, directory, args)
        print(json.dumps(replicated), flush=True)
    summary: dict[str, object] = {
        "ratio_rf3_to_single": _ratio(replicated, single),
        "clients": args.clients,
    }
    if not args.no_jetstream and shutil.which("nats-server"):
        with peers.peer_server("nats", jetstream=True) as (pid, address):
            js_single = _jetstream_rate([(pid, address)], "jetstream_single", args)
        print(json.dumps(js_single), flush=True)
        with jetstream_cluster(3) as servers:
            js_r3 = _jetstream_rate(servers, "jetstream_r3", args)
        print(json.dumps(js_r3), flush=True)
        summary["jetstream_ratio_r3_to_single"] = _ratio(js_r3, js_single)
        summary["rf3_to_jetstream_r3"] = _ratio(replicated, js_r3)
    summary["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(summary), flush=True)


def _ratio(row: dict[str, object], base: dict[str, object]) -> float:
    rate, base_rate = row["msgs_per_s"], base["msgs_per_s"]
    assert isinstance(rate, int)
    assert isinstance(base_rate, int)
    return round(rate / max(base_rate, 1), 3)


def _jetstream_rate(
    servers: list[tuple[int, tuple[str, int]]], mode: str, args: argparse.Namespace
) -> dict[str, object]:
    """JetStream under this run's load: ``args.clients`` publishers, each
    waiting for windows of ``in_flight x batch`` acks, keyed as ``_load``."""
    window = args.in_flight * args.batch

    def subjects(index: int) -> list[bytes]:
        return [b"orders.c%d.k%d" % (index, n // args.batch % 16) for n in range(window)]

    async def run() -> dict[str, object]:
        addresses = [address for _, address in servers]
        await jetstream.recreate_stream(addresses[0], replicas=len(servers), subjects="orders.>")
        before = [cpu_seconds(pid) for pid, _ in servers]
        client_before = time.process_time()
        published, acked, elapsed = await jetstream.publish(
            addresses[0],
            args.clients,
            subjects,
            b"x" * args.size,
            duration=args.seconds,
            spread=addresses,
        )
        client_cpu = time.process_time() - client_before
        cpu = [cpu_seconds(pid) - start for (pid, _), start in zip(servers, before, strict=True)]
        return _row(
            mode, args, {"window": window}, elapsed, acked, cpu, client_cpu, published - acked
        )

    return trio.run(run)


if __name__ == "__main__":
    main()
