"""``broky subs``: durable subscriptions summed over workers, and the
command against a real broker's ``$SYS.metrics``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from broky import BrokyError, Config, Start
from broky.cli import build_parser
from broky.subs_cli import delete_subscription, list_subscriptions, merge, render
from tests.conftest import StartBroker, address_of


def _status(name: str, **figures: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name, "type": "shared", "pattern": "orders.>", "partitions": 1,
        "consumers": 0, "backlog": 0, "in_flight": 0, "stalled": "", "delivered": 0,
        "redelivered": 0, "acked": 0, "stale_acks": 0, "dead_lettered": 0, "evicted": 0,
        "lost_to_retention": 0,
    }  # fmt: skip
    return {**base, **figures}


def test_a_subscription_served_by_two_workers_is_one_row_with_their_sums() -> None:
    worker0 = {"worker": 0, "durable_subscriptions": [
        _status("billing", backlog=5, in_flight=2, consumers=1, stalled="max_in_flight"),
        _status("audit", type="key-shared", acked=7),
    ]}  # fmt: skip
    worker1 = {"worker": 1, "durable_subscriptions": [
        _status("billing", backlog=3, in_flight=1, consumers=1, stalled="no_credit"),
    ]}  # fmt: skip
    rows = merge([worker0, worker1, {"worker": 2}])
    figures = [
        (r["name"], r["backlog"], r["in_flight"], r["consumers"], r["partitions"]) for r in rows
    ]
    assert figures == [("audit", 0, 0, 0, 1), ("billing", 8, 3, 2, 2)]
    assert rows[1]["stalled"] == ["max_in_flight", "no_credit"]
    lines = render(rows).splitlines()
    assert lines[0].split() == [
        "SUBSCRIPTION", "TYPE", "PATTERN", "CONSUMERS", "BACKLOG", "IN_FLIGHT", "ACKED",
        "REDELIVERED", "DEAD_LETTERED", "STALLED",
    ]  # fmt: skip
    assert lines[1].split() == [
        "audit",
        "key-shared",
        "orders.>",
        "0",
        "0",
        "0",
        "7",
        "0",
        "0",
        "-",
    ]
    assert lines[2].split()[-1] == "max_in_flight,no_credit"
    # Columns line up: every row starts its columns where the heading does.
    assert lines[2].index("shared") == lines[0].index("TYPE")


@pytest.mark.parametrize("as_json", [False, True])
async def test_broky_subs_shows_backlog_in_flight_and_consumers_of_a_real_broker(
    tmp_path: Path,
    start_broker: StartBroker,
    capsys: pytest.CaptureFixture[str],
    as_json: bool,
) -> None:
    table = {"name": "orders", "pattern": "orders.>", "partitions": 2}
    config = Config.from_mapping(
        {"port": 0, "data_dir": str(tmp_path), "durable": [table], "system_metrics_interval": 0.1}
    )
    broker = await start_broker(config)
    address = address_of(broker)
    args = build_parser().parse_args(
        ["subs", "--address", address, "--workers", "1", "--wait", "10"]
        + (["--json"] if as_json else [])
    )
    with trio.fail_after(15):
        async with (
            broker.connect() as client,
            client.consumer(
                "orders.>", subscription="billing", start=Start.earliest(), credit=3
            ) as consumer,
        ):
            for number in range(10):
                await client.publish(f"orders.k{number}", b"x", ack=True)
            await client.flush_acks()
            first = await anext(consumer)
            await first.ack()
            await consumer.flush()
            # Every snapshot the command sees is taken after this receipt.
            assert await list_subscriptions(args) == 0
    out = capsys.readouterr().out
    if as_json:
        [row] = [json.loads(line) for line in out.splitlines()]
        assert (row["name"], row["consumers"], row["acked"]) == ("billing", 1, 1)
        # The backlog counts every unacked message; in flight, those delivered.
        assert row["backlog"] == 9
        assert 0 < row["in_flight"] <= 9
    else:
        heading, row = out.splitlines()
        assert heading.split()[0] == "SUBSCRIPTION"
        name, kind, pattern, consumers, backlog, in_flight, acked, *_ = row.split()
        assert (name, kind, pattern, consumers, acked) == (
            "billing",
            "shared",
            "orders.>",
            "1",
            "1",
        )
        assert int(backlog) == 9
        assert 0 < int(in_flight) <= 9


async def test_broky_subs_delete_deletes_and_says_why_it_refuses(
    tmp_path: Path, start_broker: StartBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    table = {"name": "orders", "pattern": "orders.>", "partitions": 2}
    config = Config.from_mapping({"port": 0, "data_dir": str(tmp_path), "durable": [table]})
    broker = await start_broker(config)
    address = address_of(broker)
    parser = build_parser()
    plain = parser.parse_args(["subs", "delete", "billing", "--address", address])
    forced = parser.parse_args(["subs", "delete", "billing", "--force", "--address", address])
    with trio.fail_after(15):
        async with (
            broker.connect() as client,
            client.consumer("orders.>", subscription="billing"),
        ):
            with pytest.raises(BrokyError, match="force"):
                await delete_subscription(plain)
            assert await delete_subscription(forced) == 0
    assert "deleted subscription billing: 2 partition(s), 1 consumer(s) ended" in (
        capsys.readouterr().out
    )
