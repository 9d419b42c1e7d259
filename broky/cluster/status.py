"""``broky cluster status``: members, placement, leaders, epochs, ISR and
moves in progress; per partition its high watermark and each replica's log
end and lag; ``broky cluster remove-node``: remove a node for good
(broky.cluster.decommission); ``broky cluster etcd``: a local etcd to try a
cluster with.

One linearizable read of the cluster's keys in etcd (a txn of range reads,
so every part is from the same revision), then the offsets asked of the
live members themselves (broky.cluster.progress: etcd does not hold
them); printed as tables or as JSON for scripts. With ``--etcd-only`` it
needs only etcd, not a reachable node.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import attrs
import trio

from broky.cluster.decommission import decommissioned_of, remove_node, undo_remove
from broky.cluster.etcd import EtcdClient, parse_endpoints
from broky.cluster.etcd_wire import EtcdError, Get
from broky.cluster.keys import ClusterKeys, check_name
from broky.cluster.local_etcd import EtcdNotFound, local_etcd
from broky.cluster.membership import Member, members_of
from broky.cluster.placement import vbucket_of
from broky.cluster.progress import gather, partition_rows, render_rows
from broky.cluster.settings import ClusterSettings
from broky.cluster.vbuckets import StoredState, states_of


@attrs.frozen
class ClusterStatus:
    """The cluster as etcd had it at ``revision``."""

    revision: int
    settings: ClusterSettings | None
    controller: str | None
    controller_epoch: int
    members: dict[str, Member]
    vbuckets: dict[int, StoredState]
    #: Nodes removed for good (``broky cluster remove-node``).
    decommissioned: frozenset[str] = frozenset()

    def moving(self) -> dict[int, StoredState]:
        """The vbuckets a move is taking to a new replica set."""
        return {v: s for v, s in self.vbuckets.items() if s.state.target}

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "settings": None if self.settings is None else attrs.asdict(self.settings),
            "controller": self.controller,
            "controller_epoch": self.controller_epoch,
            "members": {
                node: {"address": member.info.address, "epoch": member.epoch}
                for node, member in sorted(self.members.items())
            },
            "vbuckets": {
                str(vbucket): {
                    "leader": stored.state.leader,
                    "epoch": stored.state.epoch,
                    "isr": [node for node, _ in stored.state.isr],
                    "replicas": list(stored.state.replicas),
                    "target": list(stored.state.target) or None,
                }
                for vbucket, stored in sorted(self.vbuckets.items())
            },
            "moving": sorted(self.moving()),
            "decommissioned": sorted(self.decommissioned),
        }


async def read_status(client: EtcdClient, keys: ClusterKeys) -> ClusterStatus:
    """Everything at one revision (a txn without compares always succeeds)."""
    result = await client.txn(
        [],
        [
            Get(keys.config),
            Get(keys.controller),
            Get.prefix(keys.nodes),
            Get.prefix(keys.vbuckets),
            Get.prefix(keys.decommissioned),
        ],
    )
    config, controller, nodes, vbuckets, marks = result.ranges
    settings = ClusterSettings.from_json(config[0].value) if config else None
    return ClusterStatus(
        revision=result.revision,
        settings=settings,
        controller=controller[0].value.decode(errors="replace") if controller else None,
        controller_epoch=controller[0].create_revision if controller else 0,
        members=members_of(keys, {kv.key: kv for kv in nodes}),
        vbuckets=states_of(keys, {kv.key: kv for kv in vbuckets}),
        decommissioned=frozenset(decommissioned_of(keys, marks)),
    )


def _nodes(items: tuple[str, ...] | list[str]) -> str:
    return ",".join(items) or "-"


def render(status: ClusterStatus, out: TextIO, topic: str = "", partitions: int = 0) -> None:
    """The human-readable report."""
    settings = status.settings
    if settings is None:
        print("no cluster here yet (no node has joined)", file=out)
        return
    controller = status.controller or "none"
    print(
        f"{len(status.members)} live node(s), controller {controller} "
        f"(epoch {status.controller_epoch}), {settings.vbuckets} vbuckets, "
        f"replication factor {settings.replication_factor}, etcd revision {status.revision}",
        file=out,
    )
    leads = Counter(s.state.leader for s in status.vbuckets.values() if s.state.leader)
    copies = Counter(node for s in status.vbuckets.values() for node in s.state.replicas)
    print(
        f"\n{'node':<16} {'address':<22} {'node epoch':>10} {'leads':>6} {'replicas':>8}", file=out
    )
    for node, member in sorted(status.members.items()):
        address = member.info.address
        print(
            f"{node:<16} {address:<22} {member.epoch:>10} {leads[node]:>6} {copies[node]:>8}",
            file=out,
        )
    if not status.vbuckets:
        print(
            f"\nno placement yet: the controller writes it once {settings.replication_factor} "
            "nodes are live",
            file=out,
        )
        return
    width = settings.replication_factor
    offline = [v for v, s in status.vbuckets.items() if s.state.leader is None]
    under = [v for v, s in status.vbuckets.items() if len(s.state.isr) < width]
    moving = status.moving()
    print(
        f"\n{len(status.vbuckets)} vbuckets placed, {len(under)} under-replicated, "
        f"{len(offline)} offline, {len(moving)} moving",
        file=out,
    )
    if status.decommissioned:
        print(f"removed for good: {_nodes(sorted(status.decommissioned))}", file=out)
    for vbucket, move in sorted(moving.items()):
        before, target = move.state.replicas, move.state.target
        waiting = [n for n in target if n not in {node for node, _ in move.state.isr}]
        step = f"catching up: {_nodes(waiting)}" if waiting else "handing over"
        print(
            f"moving vbucket {vbucket}: [{_nodes(before)}] -> [{_nodes(target)}] ({step})", file=out
        )
    shown = sorted(status.vbuckets)
    if topic:
        shown = sorted({vbucket_of(topic, p, settings.vbuckets) for p in range(partitions)})
        for partition in range(partitions):
            vbucket = vbucket_of(topic, partition, settings.vbuckets)
            print(f"{topic}/{partition} -> vbucket {vbucket}", file=out)
    print(f"\n{'vbucket':>7} {'leader':<16} {'epoch':>6}  {'isr':<30} replicas", file=out)
    for vbucket in shown:
        stored = status.vbuckets.get(vbucket)
        if stored is None:
            print(f"{vbucket:>7} (not placed)", file=out)
            continue
        state = stored.state
        isr = _nodes([node for node, _ in state.isr])
        leader = state.leader or "OFFLINE"
        print(
            f"{vbucket:>7} {leader:<16} {state.epoch:>6}  {isr:<30} {_nodes(state.replicas)}",
            file=out,
        )


async def status_command(args: argparse.Namespace) -> int:
    async with EtcdClient.from_url(args.etcd) as client:
        try:
            with trio.fail_after(10):
                status = await read_status(client, ClusterKeys.for_cluster(args.cluster_name))
        except (EtcdError, trio.TooSlowError) as exc:
            print(f"broky: cannot read the cluster from {args.etcd}: {exc}", file=sys.stderr)
            return 1
    answers = {} if args.etcd_only else await gather(status.members)
    vbuckets = 0 if status.settings is None else status.settings.vbuckets
    rows = partition_rows(vbuckets, status.vbuckets, answers)
    if args.topic:
        rows = [row for row in rows if row.topic == args.topic]
    if args.json:
        report = status.to_json()
        report["partitions"] = [row.to_json() for row in rows]
        report["unanswered"] = {n: a for n, a in sorted(answers.items()) if isinstance(a, str)}
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        render(status, sys.stdout, args.topic or "", args.partitions)
        render_rows(rows, answers, sys.stdout)
    return 0


def _etcd_url(text: str) -> str:
    try:
        parse_endpoints(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _cluster_name(text: str) -> str:
    try:
        return check_name("cluster name", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_local_etcd(args: argparse.Namespace) -> int:
    """``broky cluster etcd``: a local etcd until Ctrl-C (or SIGTERM)."""
    try:
        with local_etcd(Path(args.data_dir), args.port) as url:
            print(f"etcd listening: --cluster {url}", flush=True)
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except (EtcdNotFound, RuntimeError) as exc:
        print(f"broky: {exc}", file=sys.stderr)
        return 1
    return 0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``broky cluster status`` and ``broky cluster etcd``."""
    cluster = commands.add_parser("cluster", help="a replicated cluster (metadata in etcd)")
    actions = cluster.add_subparsers(dest="cluster_command", required=True)
    etcd = actions.add_parser(
        "etcd", help="run a local one-member etcd tuned for 1 s leases (needs etcd-server)"
    )
    etcd.add_argument("--data-dir", default="broky-etcd", help="its data (default ./broky-etcd)")
    etcd.add_argument("--port", type=int, default=2379, help="client port (default 2379)")
    etcd.set_defaults(handler=_blocking_signals(run_local_etcd))
    status = actions.add_parser(
        "status", help="members, placement, leaders, epochs, ISR, high watermarks and lag"
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    status.add_argument(
        "--etcd-only",
        action="store_true",
        help="do not ask the nodes for offsets (high watermark, log ends, lag)",
    )
    status.add_argument("--topic", help="only the vbuckets of this topic's partitions")
    status.add_argument("--partitions", type=int, default=1, help="partitions of --topic")
    status.set_defaults(handler=lambda args: trio.run(status_command, args))
    remove = actions.add_parser(
        "remove-node",
        help="remove a node for good: its replicas are re-created on the other nodes",
    )
    remove.add_argument("node_id", help="the node to remove")
    remove.add_argument("--undo", action="store_true", help="take a removal back")
    for command in (status, remove):
        command.add_argument(
            "--etcd",
            type=_etcd_url,
            default="etcd://127.0.0.1:2379",
            help="the cluster's etcd, etcd://HOST:PORT[,...] (default etcd://127.0.0.1:2379)",
        )
        command.add_argument("--cluster-name", type=_cluster_name, default="broky")
    remove.set_defaults(handler=lambda args: trio.run(remove_command, args))


async def remove_command(args: argparse.Namespace) -> int:
    """``broky cluster remove-node N``: write (or delete) the mark, then say
    what the controller will do with it."""
    keys = ClusterKeys.for_cluster(args.cluster_name)
    try:
        node = check_name("node id", args.node_id)
    except ValueError as exc:
        print(f"broky: {exc}", file=sys.stderr)
        return 2
    async with EtcdClient.from_url(args.etcd) as client:
        try:
            with trio.fail_after(10):
                if args.undo:
                    found = await undo_remove(client, keys, node)
                    print(f"node {node}: " + ("removal taken back" if found else "was not removed"))
                    return 0
                await remove_node(client, keys, node)
                status = await read_status(client, keys)
        except (EtcdError, trio.TooSlowError) as exc:
            print(f"broky: cannot write to the cluster at {args.etcd}: {exc}", file=sys.stderr)
            return 1
    held = sum(1 for s in status.vbuckets.values() if node in s.state.replicas)
    print(
        f"node {node} removed for good: the controller moves its {held} replica(s) to the "
        "other nodes; `broky cluster status` shows the moves"
    )
    return 0


def _blocking_signals(
    handler: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """Run ``handler`` with SIGINT/SIGTERM blocked, so ``sigwait`` receives
    them and the ``with`` blocks it is in still stop etcd on the way out."""

    def run(args: argparse.Namespace) -> int:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            return handler(args)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    return run
