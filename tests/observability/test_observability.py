"""Metrics endpoint, $SYS topics and advisories against a real broker on 127.0.0.1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import trio
from rich.console import Console

import broky
from broky import Broker, Config
from broky.observability.keys import METRICS_KEY
from broky.observability.metrics import FAMILIES
from broky.observability.top import render
from broky.observability.topics import TopicCounter
from tests.conftest import StartBroker, address_of, eventually

README = Path(__file__).resolve().parents[2] / "README.md"
SNAPSHOT = Path(__file__).with_name("snapshot.json")


async def http_get(address: tuple[str, int], path: str) -> tuple[int, str]:
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def sample_value(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else r"(\{[^}]*\})?")
    match = re.search(rf"^{pattern} (\S+)$", text, re.M)
    assert match, f"{name}{{{labels}}} not in the exposition"
    return float(match.group(match.lastindex or 1))


async def test_metrics_endpoint_serves_the_families_and_they_move(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(Config(port=0, metrics_listen=True, metrics_port=0))
    metrics = broker.observability.metrics_address
    assert metrics is not None
    assert metrics[0] == "127.0.0.1"
    with trio.fail_after(10):
        status, before = await http_get(metrics, "/metrics")
        assert status == 200
        for family, kind in FAMILIES.items():
            name = f"{family}_total" if kind == "counter" else family
            assert f"# TYPE {name} {kind}" in before, family
        async with (
            broky.connect(address_of(broker)) as client,
            client.subscription("orders.>") as orders,
        ):
            for _ in range(300):
                await client.publish("orders.eu", b"x" * 50)
            await client.publish("nobody.listens", b"y")
            await client.flush()
            received = 0
            async for _ in orders:
                received += 1
                if received == 300:
                    break
            _, after = await http_get(metrics, "/metrics")
        worker = 'worker="0"'
        assert sample_value(after, "broky_published_messages_total", worker) == 301
        assert sample_value(after, "broky_delivered_messages_total", worker) == 300
        assert sample_value(after, "broky_connections", worker) == 1
        assert sample_value(after, "broky_subscriptions", worker) == 1
        dropped = 'reason="no_subscriber",worker="0"'
        assert sample_value(after, "broky_dropped_messages_total", dropped) == 1
        topic = 'topic="orders.eu",worker="0"'
        assert sample_value(after, "broky_topic_published_messages_total", topic) == 300
        assert sample_value(after, "broky_received_bytes_total", worker) > sample_value(
            before, "broky_received_bytes_total", worker
        )
        status, health = await http_get(metrics, "/healthz")
        assert status == 200
        assert json.loads(health)["status"] == "ok"
        assert (await http_get(metrics, "/nope"))[0] == 404


def test_readme_documents_every_family() -> None:
    documented = set(re.findall(r"^\| `(broky_\w+)` \|", README.read_text(), re.M))
    exported = {f"{name}_total" if kind == "counter" else name for name, kind in FAMILIES.items()}
    assert documented == exported


async def test_sys_metrics_arrive_on_schedule_and_catch_all_does_not_see_them(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(Config(port=0, system_metrics_interval=0.2))
    with trio.fail_after(10):
        async with (
            broky.connect(address_of(broker)) as client,
            client.subscription(METRICS_KEY) as snapshots,
            client.subscription(">") as everything,
        ):
            await client.publish("work.item", b"1")
            start = trio.current_time()
            received = []
            async for message in snapshots:
                received.append(json.loads(message.payload))
                if len(received) == 3:
                    break
            elapsed = trio.current_time() - start
            await client.flush()
            assert (await anext(everything)).key == "work.item"
            # Three snapshots were routed, and none reached the catch-all.
            assert everything.statistics().buffered_messages == 0
    assert 0.3 <= elapsed < 2.0
    snapshot = received[-1]
    assert snapshot["version"] == 1
    assert snapshot["worker"] == "0"
    assert snapshot["messages"]["published"] >= 1
    assert 0.15 < snapshot["interval_seconds"] < 0.5
    assert any(topic["topic"] == "work.item" for topic in snapshot["top_topics"])


async def test_forced_slow_consumer_advises_and_counts_drops(start_broker: StartBroker) -> None:
    broker = await start_broker(Config(port=0, outbox_messages=100, metrics_listen=True,
                                       metrics_port=0))  # fmt: skip
    with trio.fail_after(15):
        async with (
            broky.connect(address_of(broker), name="watcher") as watcher,
            watcher.subscription("$SYS.events.>") as events,
            broky.connect(address_of(broker), name="stalled") as stalled,
            # Credit 10, never consumed: the outbox fills and then drops.
            stalled.subscription("feed.>", credit=10),
            broky.connect(address_of(broker), name="publisher") as publisher,
        ):
            for _ in range(1000):
                await publisher.publish("feed.prices", b"p" * 20)
            await publisher.flush()
            await eventually(lambda: broker.statistics().router.dropped_slow_consumer > 0)
            advisory = None
            async for message in events:
                if message.key == "$SYS.events.slow_consumer":
                    advisory = json.loads(message.payload)
                    break
            assert broker.observability.metrics_address is not None
            _, text = await http_get(broker.observability.metrics_address, "/metrics")
    assert advisory is not None
    assert advisory["client"] == "stalled"
    assert advisory["pattern"] == "feed.>"
    assert advisory["policy"] == "drop"
    assert advisory["dropped"] > 0
    dropped = 'reason="slow_consumer",worker="0"'
    assert sample_value(text, "broky_dropped_messages_total", dropped) >= advisory["dropped"]
    assert sample_value(text, "broky_advisories_total", 'kind="slow_consumer",worker="0"') >= 1


async def test_connection_closed_advisory_names_the_reason(start_broker: StartBroker) -> None:
    broker: Broker = await start_broker(Config(port=0))
    with trio.fail_after(10):
        async with (
            broky.connect(address_of(broker)) as watcher,
            watcher.subscription("$SYS.events.connection.closed") as closed,
        ):
            async with broky.connect(address_of(broker), name="short-lived"):
                pass
            message = await anext(closed)
    advisory = json.loads(message.payload)
    assert advisory["client"] == "short-lived"
    assert advisory["reason"] == "client_closed"


def test_top_renders_a_frame_from_a_recorded_snapshot() -> None:
    snapshot = json.loads(SNAPSHOT.read_text())
    console = Console(record=True, width=120, color_system=None)
    console.print(render(snapshot, "127.0.0.1:7722"))
    frame = console.export_text()
    assert "orders.eu.created" in frame
    assert "busiest topics" in frame
    assert "connections" in frame
    assert "1.20M" in frame  # published per second


def test_topic_counter_keeps_hot_keys_under_a_flood_of_cold_ones() -> None:
    counter = TopicCounter(top_k=2)
    for index in range(20 * counter.capacity):
        counter.count(b"hot.a", 5, 50)
        counter.count(b"hot.b", 3, 30)
        counter.count(f"cold.{index}".encode(), 1, 10)
        assert len(counter) <= counter.capacity
    top = counter.top()
    assert [t.key for t in top] == ["hot.a", "hot.b"]
    assert top[0].messages == 5 * 20 * counter.capacity  # never cut: exact
    assert counter.cuts > 0


def test_grafana_dashboard_uses_only_exported_families() -> None:
    dashboard = json.loads((README.parent / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\b(broky_\w+)", expr)}
    exported = {
        f"{name}{suffix}"
        for name, kind in FAMILIES.items()
        for suffix in {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket",)}[kind]
    }
    assert used
    assert used <= exported
