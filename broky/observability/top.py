"""``broky top``: a live terminal view of a broker, from ``$SYS.metrics``.

``render(snapshot)`` is a pure function of one snapshot (the JSON payload
documented in the README), so a frame can be rendered, and tested, from a
recorded snapshot; ``watch`` only subscribes and redraws.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from broky.client.credentials import ANONYMOUS, Credentials
from broky.observability.system import METRICS_KEY


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


def render(snapshot: Mapping[str, Any], address: str = "") -> RenderableType:
    """One frame of ``broky top`` for one ``$SYS.metrics`` snapshot."""
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
    state.add_row("connections", str(connections["current"]))
    state.add_row("subscriptions", str(snapshot["subscriptions"]))
    state.add_row("topics (patterns)", str(snapshot["topics"]))
    state.add_row("queued in outboxes", f"{_count(queues['outbox_messages'])} msgs")
    state.add_row("", _bytes(queues["outbox_bytes"]))
    state.add_row("slow-consumer disconnects", str(snapshot["slow_consumer_disconnects"]))
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
) -> None:
    """Subscribe to ``$SYS.metrics`` at ``address`` (over TLS with
    ``ssl_context``, as a principal granted ``$SYS``) and redraw on each snapshot."""
    async with (
        credentials.connect(address, "broky-top", ssl_context) as client,
        client.subscription(METRICS_KEY) as snapshots,
    ):
        waiting = Text(f"waiting for {METRICS_KEY} from {address} (every system_metrics_interval)")
        with Live(waiting, auto_refresh=False, screen=False) as live:
            async for message in snapshots:
                live.update(render(json.loads(message.payload), address), refresh=True)
