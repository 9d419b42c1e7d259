"""``broky bench`` end to end: tiny bounded runs against a broker it starts on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_core import pump_command
from broky.client.subscription import Subscription
from broky.loadtest.bench import BenchOptions, run_scenario
from broky.loadtest.peers import PEERS
from broky.loadtest.servers import server_process


def bench(*args: str, timeout: float = 60) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "broky", "bench", *args, "--json"],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_fan_in_json_counts_every_message() -> None:
    (result,) = bench("fan-in", "--number", "2", "--count", "2000", "--run", "100")
    assert result["target"] == "broky"
    assert result["published"] == 4000
    assert result["delivered"] == 4000
    assert result["published_per_s"] > 0
    assert result["delivered_per_s"] > 0
    assert result["expected"] == 4000
    assert result["lost"] == 0
    assert result["lossless"] is True
    assert result["broker_dropped"] == 0


def test_fan_out_factor_follows_subscribe(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "fanout.png"
    (result,) = bench(
        "fan-out", "--subscribe", "bench.data", "--subscribe", "bench.*", "--subscribe", "x.y",
        "--count", "1000", "--run", "100", "--plot", str(plot),
    )  # fmt: skip
    assert result["subscribers"] == 3
    assert result["delivered"] == 2000  # x.y matches nothing
    assert result["expected"] == 2000
    assert result["lost"] == 0
    assert plot.stat().st_size > 1000


def test_latency_reports_percentiles() -> None:
    (result,) = bench("latency", "--count", "2000", "--interval", "0.0005")
    latency = result["latency"]
    assert result["latency_samples"] == 2000
    assert 0 < latency["p50_us"] <= latency["p90_us"] <= latency["p99_us"]
    assert latency["p99_us"] <= latency["p99.9_us"] <= latency["max_us"]


def test_compare_runs_every_installed_peer() -> None:
    installed = sorted(name for name, binary in PEERS.items() if shutil.which(binary))
    if not installed:
        pytest.skip(f"none of {', '.join(PEERS.values())} is installed")
    results = bench("fan-in", "--number", "1", "--count", "2000", "--run", "100", "--compare")
    assert sorted(result["target"] for result in results) == sorted(["broky", *installed])
    for result in results:
        assert result["published"] == 2000, result["target"]
        assert result["delivered"] == 2000, result["target"]


def test_many_keys_and_one_message_per_frame_count_every_message() -> None:
    (keys,) = bench("fan-in", "--number", "2", "--count", "2000", "--keys", "1000", "--run", "1",
                    "--frame", "100")  # fmt: skip
    (unbatched,) = bench("fan-in", "--number", "1", "--count", "500", "--run", "1", "--frame", "1")
    assert (keys["keys"], keys["messages_per_run"], keys["messages_per_frame"]) == (1000, 1, 100)
    assert keys["delivered"] == keys["expected"] == 4000
    assert unbatched["messages_per_frame"] == 1
    assert unbatched["delivered"] == unbatched["expected"] == 500


# --- benchmarks.bench_core: every row once, tiny, against Broky (and installed peers) ---

ROWS = (
    "fanin", "fanin_keys", "fanin_keys_100k", "fanin_unbatched", "fanout", "latency_5k_raw",
    "latency_50k_raw",
    "latency_5k_client", "latency_50k_client", "receive", "receive_batches", "fanin_client",
    "durable",
)  # fmt: skip
LOSS_FIELDS = ("published", "delivered", "expected", "lost", "loss_pct", "lossless")


def run_core(
    targets: list[str], rows: Sequence[str], steps: int = 0, sweep_steps: list[Any] | None = None
) -> list[dict[str, Any]]:
    """bench_core's results; ``sweep_steps`` collects the sweep's steps (stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_core", "--duration", "0.3", "--warmup", "0.1",
         "--max-steps", str(steps), "--workers", "1", "--targets", ",".join(targets),
         *(arg for row in rows for arg in ("--scenario", row))],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    if sweep_steps is not None:
        sweep_steps += [json.loads(line) for line in done.stderr.splitlines() if '"kind"' in line]
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def core_rows() -> list[dict[str, Any]]:
    # Without the pump and without the sweep: each doubles the run, and one
    # row shows both (test_core_rows_divide_by_the_pump_of_the_same_run).
    return run_core(["broky", *(n for n, binary in PEERS.items() if shutil.which(binary))], ROWS)


def test_core_rows_divide_by_the_pump_of_the_same_run() -> None:
    steps: list[Any] = []
    results = run_core(["broky", "pump"], ["fanin"], steps=1, sweep_steps=steps)
    # The sweep's first step paces each target at 60% of its flat-out rate.
    assert {(step["target"], step["kind"]) for step in steps} == {
        ("broky", "sweep_step"), ("pump", "sweep_step"),
    }  # fmt: skip
    assert all(step["lost"] == max(step["expected"] - step["delivered"], 0) for step in steps)
    ran = {(r["target"], r["kind"]): r for r in results if r.get("row") == "fanin"}
    assert ran[("pump", "flat_out")]["delivered"] > 0
    broky = ran[("broky", "flat_out")]
    expected = broky["delivered_per_s"] / ran[("pump", "flat_out")]["delivered_per_s"]
    assert broky["ratio_to_pump"] == round(expected, 3)


@pytest.mark.parametrize("row", ROWS)
def test_core_row_reports_loss(core_rows: list[dict[str, Any]], row: str) -> None:
    (result,) = [r for r in core_rows if r.get("row", "").startswith(row) and
                 r.get("target") == "broky" and r.get("kind") == "flat_out"
                 and (row == "durable" or r["row"] == row)][:1]  # fmt: skip
    if result.get("available") is False:
        assert row == "receive_batches"
        assert not hasattr(Subscription, "batches")
        assert "not available" in result["reason"]
        return
    if row == "durable":
        assert result["published"] > 0
        assert result["lost"] == result["published"] - result["acked"]
        return
    assert all(field in result for field in LOSS_FIELDS), result
    assert result["published"] > 0
    assert result["lost"] == max(result["expected"] - result["delivered"], 0)
    assert result["lossless"] == (result["lost"] == 0)
    assert result["broker_dropped"] is not None
    if row.startswith("latency"):
        assert result["latency_samples"] == result["delivered"]
        assert result["latency"]["p50_us"] <= result["latency"]["p99.9_us"]
        assert result["server_cpu_us_per_message"] is not None


def test_core_rows_compare_peers_in_the_same_run(core_rows: list[dict[str, Any]]) -> None:
    peers = [name for name, binary in PEERS.items() if shutil.which(binary) and name != "mosquitto"]
    if not peers:
        pytest.skip("neither nats-server nor redis-server is installed")
    ran = {(r["target"], r["row"]) for r in core_rows if r.get("kind") == "flat_out"}
    for peer in peers:
        for row in ("fanin", "fanin_keys", "fanin_unbatched", "fanout", "latency_5k_raw"):
            assert (peer, row) in ran
    fanin = next(r for r in core_rows if r.get("target") == "broky" and r.get("row") == "fanin")
    assert f"ratio_to_{peers[0]}" in fanin
    (summary,) = [r for r in core_rows if r.get("summary") == "core"]
    assert summary["rows"]["fanin"]["loss_pct"] == fanin["loss_pct"]


def test_pump_forwards_every_frame_including_the_first() -> None:
    """The pump is the ceiling every row divides by: it must not lose the
    Publish frame that arrives with the Hello."""
    options = BenchOptions(scenario="fan-in", number=2, count=300, run=100)
    with server_process(pump_command()) as server:
        result = run_scenario(options, "pump", server)
    assert result["published"] == 600
    assert result["delivered"] == result["expected"] == 600
