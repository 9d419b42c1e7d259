"""``broky top``: a live terminal view of a broker, from ``$SYS.metrics``.

Each worker of a node publishes its own snapshot (and in a cluster, every
node's reach a subscriber). ``node_snapshot`` sums the latest of each worker
of each node into one: counters and rates added up, less what crossed
between workers or nodes over their links (a message forwarded from worker 1
to worker 0 is published once, not twice); per-topic figures added up (each
worker counts only what its own clients published). ``render`` is a pure
function of one snapshot (the JSON payload documented in the README), so a
frame can be rendered, and tested, from recorded snapshots; ``watch`` only
subscribes, keeps the latest snapshot per worker and redraws.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, Final

from rich.console import Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from broky.client.credentials import ANONYMOUS, Credentials
from broky.observability.keys import METRICS_KEY


def _count(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{suffix}"
    return f"{value:.0f}"


def _bytes(value: float) -> str:
    for scale, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {suffix}"
    return f"{value:.0f} B"


#: A worker's snapshot older than this many of its intervals is left out
#: of the node's figures: that worker stopped (or restarted under a new start).
STALE_INTERVALS: Final = 3


def node_snapshot(snapshots: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One snapshot for a node, from the latest snapshot of each of its workers."""
    if len(snapshots) == 1:
        return dict(snapshots[0])

    def total(path: tuple[str, ...]) -> float:
        return sum(_field(snapshot, path) for snapshot in snapshots)

    messages = {key: total(("messages", key)) for key in snapshots[0]["messages"]}
    rates = {key: total(("rates", key)) for key in snapshots[0]["rates"]}
    # A run forwarded between workers is counted as published by both and as
    # delivered by the one that handed it over: count it once.
    messages["published"] -= messages.get("from_links", 0)
    messages["delivered"] -= messages.get("to_links", 0)
    rates["published_per_s"] -= rates.get("from_links_per_s", 0)
    rates["delivered_per_s"] -= rates.get("to_links_per_s", 0)
    topics: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for topic in snapshot["top_topics"]:
            merged = topics.setdefault(
                topic["topic"],
                {"topic": topic["topic"], "messages": 0, "bytes": 0, "messages_per_s": 0.0},
            )
            for key in ("messages", "bytes", "messages_per_s"):
                merged[key] += topic[key]
    closed: dict[str, int] = {}
    for snapshot in snapshots:
        for reason, count in snapshot["connections"]["closed"].items():
            closed[reason] = closed.get(reason, 0) + count
    workers = sorted(str(snapshot["worker"]) for snapshot in snapshots)
    nodes = {snapshot.get("node", "") for snapshot in snapshots}
    scope = (
        f"cluster ({len(nodes)} nodes, {len(workers)} workers)"
        if len(nodes) > 1
        else f"node ({len(workers)} workers: {', '.join(workers)})"
    )
    return {
        "worker": scope,
        "uptime_seconds": max(snapshot["uptime_seconds"] for snapshot in snapshots),
        "interval_seconds": max(snapshot["interval_seconds"] for snapshot in snapshots),
        "connections": {
            "current": total(("connections", "current")),
            "opened": total(("connections", "opened")),
            "closed": closed,
        },
        "subscriptions": total(("subscriptions",)),
        "topics": total(("topics",)),
        "messages": messages,
        "rates": rates,
        "queues": {key: total(("queues", key)) for key in snapshots[0]["queues"]},
        "slow_consumer_disconnects": total(("slow_consumer_disconnects",)),
        "loop_lag": {
            "recent_max_seconds": max(s["loop_lag"]["recent_max_seconds"] for s in snapshots),
            "mean_seconds": max(s["loop_lag"]["mean_seconds"] for s in snapshots),
        },
        "top_topics": sorted(topics.values(), key=_busiest, reverse=True)[
            : max(len(snapshot["top_topics"]) for snapshot in snapshots)
        ],
    }


def _worker_name(snapshot: Mapping[str, Any]) -> str:
    return f"{snapshot.get('node', '')}/{snapshot['worker']}"


def _busiest(topic: Mapping[str, Any]) -> tuple[float, float]:
    return topic["messages_per_s"], topic["messages"]


def _field(snapshot: Mapping[str, Any], path: tuple[str, ...]) -> float:
    value: Any = snapshot
    for key in path:
        value = value.get(key, 0) if isinstance(value, Mapping) else 0
    return float(value)


def per_worker_table(snapshots: Sequence[Mapping[str, Any]]) -> Table:
    """One row per worker: its own traffic, connections and loop lag."""
    table = Table(title="workers", expand=True)
    for column in ("worker", "published/s", "delivered/s", "connections", "loop lag max"):
        table.add_column(column, justify="left" if column == "worker" else "right")
    several_nodes = len({snapshot.get("node", "") for snapshot in snapshots}) > 1
    for snapshot in sorted(snapshots, key=_worker_name):
        rates = snapshot["rates"]
        table.add_row(
            _worker_name(snapshot) if several_nodes else str(snapshot["worker"]),
            _count(rates["published_per_s"] - rates.get("from_links_per_s", 0)),
            _count(rates["delivered_per_s"] - rates.get("to_links_per_s", 0)),
            str(snapshot["connections"]["current"]),
            f"{snapshot['loop_lag']['recent_max_seconds'] * 1000:.1f} ms",
        )
    return table


def render(snapshot: Mapping[str, Any], address: str = "") -> RenderableType:
    """One frame of ``broky top`` for one ``$SYS.metrics`` snapshot (a
    worker's, or a node's from ``node_snapshot``)."""
    rates, messages = snapshot["rates"], snapshot["messages"]
    connections, queues = snapshot["connections"], snapshot["queues"]
    lag = snapshot["loop_lag"]
    title = f"broky {address} · worker {snapshot['worker']}".replace("  ", " ")
    header = Text.assemble(
        ("uptime ", "dim"), f"{snapshot['uptime_seconds']:.0f} s   ",
        ("interval ", "dim"), f"{snapshot['interval_seconds']:.1f} s   ",
        ("loop lag max ", "dim"), f"{lag['recent_max_seconds'] * 1000:.1f} ms",
    )  # fmt: skip
    traffic = Table(box=None, expand=True)
    for column in ("", "per second", "total"):
        traffic.add_column(column, justify="right" if column else "left")
    traffic.add_row("published", _count(rates["published_per_s"]), _count(messages["published"]))
    traffic.add_row("delivered", _count(rates["delivered_per_s"]), _count(messages["delivered"]))
    dropped_style = "bold red" if rates["dropped_per_s"] else ""
    traffic.add_row(
        Text("dropped", style=dropped_style),
        Text(_count(rates["dropped_per_s"]), style=dropped_style),
        f"{_count(messages['dropped_slow_consumer'])} slow / "
        f"{_count(messages['dropped_no_subscriber'])} unmatched",
    )
    traffic.add_row(
        "bytes in / out",
        f"{_bytes(rates['received_bytes_per_s'])} / {_bytes(rates['sent_bytes_per_s'])}",
        "",
    )
    state = Table(box=None, expand=True)
    state.add_column("")
    state.add_column("", justify="right")
    state.add_row("connections", _count(connections["current"]))
    state.add_row("subscriptions", _count(snapshot["subscriptions"]))
    state.add_row("topics (patterns)", _count(snapshot["topics"]))
    state.add_row("queued in outboxes", f"{_count(queues['outbox_messages'])} msgs")
    state.add_row("", _bytes(queues["outbox_bytes"]))
    state.add_row("slow-consumer disconnects", _count(snapshot["slow_consumer_disconnects"]))
    closed = ", ".join(f"{reason} {n}" for reason, n in connections["closed"].items() if n)
    topics = Table(title="busiest topics", expand=True)
    topics.add_column("topic")
    topics.add_column("msgs/s", justify="right")
    topics.add_column("messages", justify="right")
    topics.add_column("bytes", justify="right")
    for topic in snapshot["top_topics"]:
        topics.add_row(
            topic["topic"],
            _count(topic["messages_per_s"]),
            _count(topic["messages"]),
            _bytes(topic["bytes"]),
        )
    grid = Table.grid(expand=True)
    grid.add_column(ratio=1)
    grid.add_column(ratio=1)
    grid.add_row(Panel(traffic, title="traffic"), Panel(state, title="state"))
    return Panel(
        Group(header, grid, topics, Text(f"closed: {closed or 'none'}", style="dim")),
        title=title,
    )


async def watch(
    address: str,
    ssl_context: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
    *,
    per_worker: bool = False,
) -> None:
    """Subscribe to ``$SYS.metrics`` at ``address`` (over TLS with
    ``ssl_context``, as a principal granted ``$SYS``) and redraw the node's
    figures on each snapshot, with a row per worker if ``per_worker``."""
    latest: dict[str, Mapping[str, Any]] = {}
    async with (
        credentials.connect(address, "broky-top", ssl_context) as client,
        client.subscription(METRICS_KEY) as snapshots,
    ):
        waiting = Text(f"waiting for {METRICS_KEY} from {address} (every system_metrics_interval)")
        with Live(waiting, auto_refresh=False, screen=False) as live:
            async for message in snapshots:
                snapshot = json.loads(message.payload)
                latest[f"{snapshot.get('node', '')}/{snapshot['worker']}"] = snapshot
                current = _current(latest, snapshot["ts"])
                frame = render(node_snapshot(current), address)
                if per_worker:
                    frame = Group(frame, per_worker_table(current))
                live.update(frame, refresh=True)


def _current(latest: dict[str, Mapping[str, Any]], now_ns: int) -> list[Mapping[str, Any]]:
    """The workers' latest snapshots, less those too old to be current."""
    for worker, snapshot in list(latest.items()):
        age = (now_ns - snapshot["ts"]) / 1e9
        if age > STALE_INTERVALS * max(snapshot["interval_seconds"], 1.0):
            del latest[worker]
    return list(latest.values())
