"""``broky bench`` end to end: tiny bounded runs against a broker it starts on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broky.loadtest.peers import PEERS


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
    assert result["dropped_notified"] == 0


def test_fan_out_factor_follows_subscribe(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "fanout.png"
    (result,) = bench(
        "fan-out", "--subscribe", "bench.data", "--subscribe", "bench.*", "--subscribe", "x.y",
        "--count", "1000", "--run", "100", "--plot", str(plot),
    )  # fmt: skip
    assert result["subscribers"] == 3
    assert result["delivered"] == 2000  # x.y matches nothing
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
