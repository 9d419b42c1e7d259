"""``broky subs``: list a broker's durable subscriptions with their backlog
(lag), in-flight messages and consumers.

The figures come from ``$SYS.metrics`` (its ``durable_subscriptions``
field, README "System topics"), over the same client connection ``broky
top`` uses, so the command needs no metrics port. Each worker publishes
its own snapshot every ``system_metrics_interval`` seconds and lists the
subscriptions of the partitions it owns; the command collects snapshots
until it has seen a worker twice (one whole round of the node's workers, or
of every node's in a cluster), ``--workers`` distinct ones, or ``--wait``
passes, then adds up each
subscription's figures over the workers and prints one row per
subscription. ``merge`` and ``render`` are pure, for tests.

``broky subs delete NAME`` deletes a subscription on every worker
(``Client.delete_subscription``): refused while consumers are attached
unless ``--force``, which ends them.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Final

import trio

from broky.client.credentials import ANONYMOUS, Credentials
from broky.config import DEFAULT_PORT
from broky.observability.keys import METRICS_KEY
from broky.security.flags import (
    add_client_auth_flags,
    add_client_tls_flags,
    client_credentials,
    client_tls_context,
)

#: Figures added up over the workers that serve parts of one subscription.
SUMMED: Final = (
    "partitions",
    "consumers",
    "backlog",
    "in_flight",
    "delivered",
    "redelivered",
    "acked",
    "stale_acks",
    "dead_lettered",
    "evicted",
    "lost_to_retention",
)
#: The printed columns: (field, heading).
COLUMNS: Final = (
    ("name", "SUBSCRIPTION"),
    ("type", "TYPE"),
    ("pattern", "PATTERN"),
    ("consumers", "CONSUMERS"),
    ("backlog", "BACKLOG"),
    ("in_flight", "IN_FLIGHT"),
    ("acked", "ACKED"),
    ("redelivered", "REDELIVERED"),
    ("dead_lettered", "DEAD_LETTERED"),
    ("stalled", "STALLED"),
)


def merge(snapshots: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each subscription once, its figures summed over the snapshots'
    workers, sorted by name; ``stalled`` lists the distinct reasons."""
    merged: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for status in snapshot.get("durable_subscriptions", ()):
            entry = merged.get(status["name"])
            if entry is None:
                merged[status["name"]] = {
                    **status,
                    "stalled": [status["stalled"]] if status["stalled"] else [],
                }
                continue
            for field in SUMMED:
                entry[field] += status[field]
            if status["stalled"] and status["stalled"] not in entry["stalled"]:
                entry["stalled"].append(status["stalled"])
    return [merged[name] for name in sorted(merged)]


def render(rows: list[dict[str, Any]]) -> str:
    """``rows`` as aligned text columns under a heading line."""
    cells = [[heading for _, heading in COLUMNS]] + [
        [
            ",".join(row[field]) or "-" if field == "stalled" else str(row[field])
            for field, _ in COLUMNS
        ]
        for row in rows
    ]
    widths = [max(len(line[column]) for line in cells) for column in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )


async def collect(
    address: str,
    wait: float,
    tls: ssl.SSLContext | None,
    credentials: Credentials,
    workers: int = 0,
) -> list[Mapping[str, Any]]:
    """The latest ``$SYS.metrics`` snapshot of each worker seen before one
    of them comes round again, ``workers`` (if not 0) have been seen, or
    ``wait`` seconds pass."""
    latest: dict[tuple[str, int], Mapping[str, Any]] = {}
    async with (
        credentials.connect(address, "broky-subs", tls) as client,
        client.subscribe(METRICS_KEY) as snapshots,
    ):
        with trio.move_on_after(wait):
            async for message in snapshots:
                snapshot = json.loads(message.payload)
                worker = (str(snapshot.get("node", "")), int(snapshot["worker"]))
                if worker in latest:
                    break
                latest[worker] = snapshot
                if len(latest) == workers:
                    break
    return list(latest.values())


async def list_subscriptions(
    args: argparse.Namespace,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> int:
    """Print the subscriptions (a table, or ``--json`` lines); 1 if no snapshot came."""
    print(
        f"waiting for {METRICS_KEY} from {args.address} (every system_metrics_interval)...",
        file=sys.stderr,
        flush=True,
    )
    snapshots = await collect(args.address, args.wait, tls, credentials, args.workers)
    if not snapshots:
        print(
            f"broky: no {METRICS_KEY} snapshot within {args.wait} s (is "
            "system_metrics_interval 0 on the broker, or $SYS not granted to this user?)",
            file=sys.stderr,
        )
        return 1
    rows = merge(snapshots)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    elif rows:
        print(render(rows))
    else:
        print("no durable subscriptions", file=sys.stderr)
    return 0


async def delete_subscription(
    args: argparse.Namespace,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> int:
    """Delete ``args.name``; print what was deleted (errors raise BrokyError)."""
    async with credentials.connect(args.address, "broky-subs", tls) as client:
        deleted = await client.delete_subscription(
            args.name, args.pattern or None, force=args.force
        )
    print(
        f"deleted subscription {args.name}: {deleted.partitions} partition(s), "
        f"{deleted.consumers} consumer(s) ended"
    )
    return 0


def _add_delete_parser(subs: argparse.ArgumentParser) -> None:
    actions = subs.add_subparsers(dest="subs_command", metavar="{delete}")
    delete = actions.add_parser(
        "delete", help="delete a durable subscription (its acks and counts) on every worker"
    )
    delete.add_argument("name", help="the subscription")
    delete.add_argument(
        "--pattern", default="", help="delete only if the subscription reads this pattern"
    )
    delete.add_argument(
        "--force",
        action="store_true",
        help="delete even with consumers attached (they end with SubscriptionDeleted)",
    )
    delete.add_argument("--address", default=f"127.0.0.1:{DEFAULT_PORT}", help="broker HOST:PORT")
    add_client_tls_flags(delete)
    add_client_auth_flags(delete)
    delete.set_defaults(
        handler=lambda args: trio.run(
            delete_subscription, args, client_tls_context(args), client_credentials(args)
        )
    )


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``broky subs`` and ``broky subs delete``."""
    subs = commands.add_parser(
        "subs", help="list durable subscriptions: backlog (lag), in flight, consumers"
    )
    subs.add_argument("--address", default=f"127.0.0.1:{DEFAULT_PORT}", help="broker HOST:PORT")
    subs.add_argument(
        "--wait",
        type=float,
        default=12.0,
        help="seconds to wait for the workers' snapshots (default 12: two default intervals)",
    )
    subs.add_argument(
        "--workers",
        type=int,
        default=0,
        help="the broker's worker count, if known: print once that many have reported "
        "(default: wait for one whole round of snapshots)",
    )
    subs.add_argument("--json", action="store_true", help="one JSON object per subscription")
    add_client_tls_flags(subs)
    add_client_auth_flags(subs)
    subs.set_defaults(
        handler=lambda args: trio.run(
            list_subscriptions, args, client_tls_context(args), client_credentials(args)
        )
    )
    _add_delete_parser(subs)
