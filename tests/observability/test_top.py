"""``broky top`` shows the node: every worker's snapshot summed, forwarded
traffic counted once, per-topic rates included; and the CLI's help is plain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from rich.console import Console

import broky
from broky.observability.keys import METRICS_KEY
from broky.observability.top import node_snapshot, per_worker_table, render
from tests.mesh.test_nodes import nodes

SNAPSHOT = Path(__file__).with_name("snapshot.json")


def _worker(worker: str, published: int, from_links: int, to_links: int) -> dict[str, Any]:
    snapshot: dict[str, Any] = json.loads(SNAPSHOT.read_text())
    snapshot["worker"] = worker
    snapshot["messages"].update(
        published=published, delivered=published, from_links=from_links, to_links=to_links
    )
    snapshot["rates"].update(
        published_per_s=float(published),
        delivered_per_s=float(published),
        from_links_per_s=float(from_links),
        to_links_per_s=float(to_links),
    )
    return snapshot


def test_a_node_sums_its_workers_and_counts_forwarded_runs_once() -> None:
    # Worker 1's clients publish 1,000 messages; 400 go over the link to a
    # subscriber of worker 0, the rest to worker 1's own subscribers.
    zero, one = _worker("0", 400, 400, 0), _worker("1", 1000, 0, 400)
    node = node_snapshot([zero, one])
    assert node["messages"]["published"] == 1000
    assert node["rates"]["published_per_s"] == 1000
    assert node["messages"]["delivered"] == 1000
    assert node["connections"]["current"] == 2 * zero["connections"]["current"]
    busiest = node["top_topics"][0]
    assert busiest["topic"] == zero["top_topics"][0]["topic"]
    assert busiest["messages_per_s"] == 2 * zero["top_topics"][0]["messages_per_s"]
    console = Console(record=True, width=120, color_system=None)
    console.print(render(node, "127.0.0.1:7722"), per_worker_table([zero, one]))
    frame = console.export_text()
    assert "node (2 workers: 0, 1)" in frame
    assert "1.20M" in frame  # the busiest topic's rate, summed over both workers


def test_a_cluster_is_told_apart_by_node() -> None:
    # Every node's snapshots reach a $SYS.metrics subscriber; each has a worker "0".
    first, second = _worker("0", 500, 0, 0), _worker("0", 300, 0, 0)
    first["node"], second["node"] = "node-a", "node-b"
    merged = node_snapshot([first, second])
    assert merged["worker"] == "cluster (2 nodes, 2 workers)"
    assert merged["messages"]["published"] == 800
    console = Console(record=True, width=120, color_system=None)
    console.print(per_worker_table([first, second]))
    assert "node-a/0" in console.export_text()


@pytest.mark.slow
async def test_top_sees_every_worker_of_a_node_with_topic_rates(tmp_path: Path) -> None:
    config = tmp_path / "broky.toml"
    config.write_text("system_metrics_interval = 0.5\n")
    with nodes() as start:
        node = start(["--workers", "2", "--accept", "handoff", "--config", str(config)])
        with trio.fail_after(60):
            # Hand-off alternates workers: these clients land on both.
            async with (
                broky.connect(node.address) as watcher,
                watcher.subscription(METRICS_KEY) as snapshots,
                broky.connect(node.address) as first,
                broky.connect(node.address) as second,
                first.subscription("top.>") as subscription,
            ):
                latest: dict[str, dict[str, Any]] = {}
                async with trio.open_nursery() as nursery:

                    async def publish() -> None:
                        while True:
                            for client in (first, second):
                                for _ in range(200):
                                    await client.publish("top.hot", b"x" * 50)
                            await trio.sleep(0.01)

                    async def drain() -> None:
                        async for _ in subscription:
                            pass

                    nursery.start_soon(publish)
                    nursery.start_soon(drain)
                    async for message in snapshots:
                        snapshot = json.loads(message.payload)
                        latest[snapshot["worker"]] = snapshot
                        busy = [s for s in latest.values() if s["rates"]["published_per_s"] > 0]
                        if len(busy) == 2:
                            break
                    nursery.cancel_scope.cancel()
    merged = node_snapshot(list(latest.values()))
    (hot,) = [topic for topic in merged["top_topics"] if topic["topic"] == "top.hot"]
    assert hot["messages_per_s"] > 0
    assert merged["rates"]["published_per_s"] > 0
    assert merged["worker"] == "node (2 workers: 0, 1)"


def test_help_is_plain_text() -> None:
    output = subprocess.run(
        [sys.executable, "-m", "broky", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "``" not in output
    assert "serve runs one" in output
