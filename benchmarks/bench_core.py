"""Core benchmark: the rows of issue 12, each against Broky and its baselines in one run.

Run: ``.venv/bin/python -m benchmarks.bench_core [--scenario NAME]... [--duration S]``.
Prints one JSON object per line (one per row and target, then a summary),
so results can be compared across runs; the ratios to the pump and to
nats-server, measured in the same run, are the numbers that survive a
noisy shared machine. Every line carries what was published, delivered and
lost (the subscribers drain after the publishers stop), so no rate hides
loss: a flat-out row whose subscriber lost messages says ``"lossless": false``.

Targets: Broky with 1 and 2 workers (``--workers``), the trio byte pump, and
nats-server and redis-server when installed (started on 127.0.0.1, stopped
by PID, and driven through their own protocols with the same load). A
target a row has no fair equivalent on prints ``"available": false`` and why.

Rows (100-byte payloads; ``--scenario`` picks some, default all):
- ``fanin``: 4 publishers flat out -> 1 subscriber, one key, 100 messages per
  Publish frame; then the sustained-rate sweep.
- ``fanin_keys``: the same over 1,000 keys (``bench.k0`` .. ``bench.k999``,
  runs of one message, 100 per frame), one ``bench.>`` subscriber (Redis:
  PSUBSCRIBE ``bench.*``).
- ``fanin_keys_100k``: the same over 100,000 keys, the working set of
  per-device or per-order keys (past the route cache of 16,384 keys that
  Broky had until it grew to 131,072).
- ``fanin_unbatched``: one message per Publish frame (NATS: one PUB each),
  100 frames per ``sendall``.
- ``fanout``: 1 publisher -> 8 subscribers, one key; then the sweep.
- ``latency_5k_raw``, ``latency_50k_raw``: one message per frame at a fixed
  rate, pre-encoded; p50/p99/p99.9 and broker CPU per message.
- ``latency_5k_client``, ``latency_50k_client``: the same through the
  client library on both ends; the NATS column is nats-py on both ends of
  nats-server (reported as not available without nats-py).
- ``receive``, ``receive_batches``: one ``broky.Client`` subscriber iterating
  per message, or through ``Subscription.batches()`` (not available until
  the client has it).
- ``fanin_client``: 4 client-library publishers -> 1 subscriber.
- ``durable``: acked publishes, ``fsync = "always"``, 8 partitions, one
  worker, per key mix (see ``benchmarks.bench_durable``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

import attrs

from benchmarks import bench_durable
from benchmarks.interrupt import stop_children_on_signals
from broky.loadtest import peers
from broky.loadtest.bench import BenchOptions, Unsupported, run_scenario
from broky.loadtest.servers import Server, broky_server, peer_server, server_process

#: Peer brokers run in the same run when their server is installed.
PEER_TARGETS = ("nats", "redis")
#: Targets whose figure every Broky result is divided by.
BASELINES = ("pump", "nats", "redis")
#: A sweep step is sustained when at most this share of deliveries is lost.
SUSTAINED_LOSS_PCT = 3.0


@attrs.frozen
class Row:
    """One scenario row: what to run and on which kinds of target."""

    options: BenchOptions
    baselines: tuple[str, ...] = BASELINES
    sweep: bool = False


def rows(duration: float, warmup: float) -> dict[str, Row]:
    """Every row of the benchmark, short enough for the whole run to take minutes."""
    base = partial(BenchOptions, duration=duration, warmup=warmup, run=100)
    fan_in = partial(base, scenario="fan-in", number=4)
    latency = partial(base, scenario="latency")
    return {
        "fanin": Row(fan_in(), sweep=True),
        "fanin_keys": Row(fan_in(keys=1000, run=1, frame=100)),
        "fanin_keys_100k": Row(fan_in(keys=100_000, run=1, frame=100)),
        "fanin_unbatched": Row(fan_in(run=1, frame=1)),
        "fanout": Row(base(scenario="fan-out", number=8), sweep=True),
        "latency_5k_raw": Row(latency(interval=1 / 5000)),
        "latency_50k_raw": Row(latency(interval=1 / 50000)),
        "latency_5k_client": Row(latency(interval=1 / 5000, mode="client"), ("nats",)),
        "latency_50k_client": Row(latency(interval=1 / 50000, mode="client"), ("nats",)),
        "receive": Row(base(scenario="receive"), ()),
        "receive_batches": Row(base(scenario="receive", batches=True), ()),
        "fanin_client": Row(fan_in(mode="client"), ()),
    }


Starter = Callable[[], AbstractContextManager[Server]]


def measure(row: str, target: str, start: Starter, options: BenchOptions) -> dict[str, Any]:
    """One row on one target: the result without its plotting data, or why not."""
    try:
        with start() as server:
            result = run_scenario(options, target, server)
    except (Unsupported, RuntimeError) as exc:  # no equivalent, or the server did not start
        return {"row": row, "target": target, "available": False, "reason": str(exc)}
    public = {key: value for key, value in result.items() if not key.startswith("_")}
    return {"row": row, **public}


def sweep(
    row: str, target: str, start: Starter, options: BenchOptions, flat_out: dict[str, Any],
    step: float, max_steps: int,
) -> dict[str, Any] | None:  # fmt: skip
    """Raise the offered rate from 60% of what the flat-out run delivered per
    subscriber until a step loses more than SUSTAINED_LOSS_PCT or publishes
    less than 90% of the offer; the best step kept up with (or None)."""
    rate = 0.6 * flat_out["delivered_per_subscriber_per_s"]
    best = None
    for _ in range(max_steps):
        paced = attrs.evolve(options, interval=options.publishers / rate)
        result = measure(row, target, start, paced) | {"kind": "sweep_step"}
        print(json.dumps(result), file=sys.stderr, flush=True)
        if (
            not result.get("available", True)
            or result["loss_pct"] > SUSTAINED_LOSS_PCT
            or result["published_per_s"] < 0.9 * rate
        ):
            break
        best = result | {"kind": "sustained"}
        rate *= step
    return best


def add_ratios(result: dict[str, Any], results: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    """Broky's figures over each baseline's in the same row and kind."""
    if not result["target"].startswith("broky") or not result.get("available", True):
        return
    for baseline in BASELINES:
        other = results.get((baseline, result["row"], result["kind"]))
        if not other or not other.get("available", True):
            continue
        if "latency" in result and other.get("latency"):
            for percentile in ("p50_us", "p99_us", "p99.9_us"):
                ours, theirs = result["latency"].get(percentile), other["latency"].get(percentile)
                if ours and theirs:
                    result[f"{percentile[:-3]}_ratio_to_{baseline}"] = round(ours / theirs, 3)
            ours, theirs = result["server_cpu_us_per_message"], other["server_cpu_us_per_message"]
            if ours and theirs:
                result[f"cpu_per_message_ratio_to_{baseline}"] = round(ours / theirs, 3)
        elif other["delivered_per_s"]:
            result[f"ratio_to_{baseline}"] = round(
                result["delivered_per_s"] / other["delivered_per_s"], 3
            )


def durable_results(duration: float) -> Iterator[dict[str, Any]]:
    """The durable row: acked publishes per key mix through ``bench_durable``."""
    with tempfile.TemporaryDirectory(prefix="broky-bench-durable-") as root:
        for mix in bench_durable.KEY_MIXES:
            figures = bench_durable.broker_rate(Path(root), "always", duration, mix, replay=False)
            yield {
                "row": f"durable_{mix}",
                "target": "broky",
                "kind": "flat_out",
                "fsync": "always",
                "partitions": bench_durable.PUBLISHERS,
                **figures,
            }


def summary(results: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, Any]:
    """Per row: Broky's headline figure, its loss and its same-run ratios."""
    rows: dict[str, Any] = {}
    for (target, row, kind), result in results.items():
        if target != "broky" or not result.get("available", True):
            continue
        line = {
            key: value
            for key, value in result.items()
            if "ratio" in key or key in ("delivered_per_s", "loss_pct", "lost", "msgs_per_s")
        }
        if "latency" in result:
            line["latency"] = result["latency"]
            line["server_cpu_us_per_message"] = result["server_cpu_us_per_message"]
        rows[row if kind == "flat_out" else f"{row}_{kind}"] = line
    return {"summary": "core", "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0, help="measured seconds per step")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before measuring")
    parser.add_argument("--step", type=float, default=1.25, help="sweep: rate multiplier per step")
    parser.add_argument("--max-steps", type=int, default=4, help="sweep: most steps (0: no sweep)")
    parser.add_argument(
        "--scenario", action="append", metavar="NAME",
        help="run only this row (repeatable): " + ", ".join([*rows(1, 0), "durable"]),
    )  # fmt: skip
    parser.add_argument(
        "--targets", help="comma-separated targets to keep (e.g. broky,nats); default all"
    )
    parser.add_argument(
        "--workers", default="1,2", help="comma-separated worker counts to run Broky with"
    )
    parser.add_argument("--accept", default="handoff", help="how connections reach workers")
    args = parser.parse_args()
    stop_children_on_signals()
    table = rows(args.duration, args.warmup)
    chosen = args.scenario or [*table, "durable"]
    unknown = set(chosen) - {*table, "durable"}
    if unknown:
        parser.error(f"unknown scenario {', '.join(sorted(unknown))}")
    starters: dict[str, Starter] = {"pump": partial(server_process, pump_command())}
    for peer in PEER_TARGETS:
        if peer in peers.installed_peers():
            starters[peer] = partial(peer_server, peer)
    for count in (int(count) for count in args.workers.split(",")):
        name = "broky" if count == 1 else f"broky-{count}w"
        starters[name] = partial(broky_server, count, "--accept", args.accept)
    if args.targets:
        keep = args.targets.split(",")
        starters = {name: start for name, start in starters.items() if name in keep}
    results: dict[tuple[str, str, str], dict[str, Any]] = {}

    def emit(result: dict[str, Any]) -> None:
        add_ratios(result, results)
        results[(result["target"], result["row"], result["kind"])] = result
        print(json.dumps(result), flush=True)

    for row_name in chosen:
        if row_name == "durable":
            if "broky" in starters:
                for result in durable_results(args.duration):
                    emit(result)
            continue
        row = table[row_name]
        for target, start in starters.items():
            if not target.startswith("broky") and target not in row.baselines:
                continue
            flat_out = measure(row_name, target, start, row.options) | {"kind": "flat_out"}
            emit(flat_out)
            if row.sweep and args.max_steps and flat_out.get("available", True):
                best = sweep(
                    row_name, target, start, row.options, flat_out, args.step, args.max_steps
                )
                if best:
                    emit(best)
    print(json.dumps(summary(results)), flush=True)


def pump_command() -> list[str]:
    """The byte pump (``benchmarks.pump``) as a server process."""
    return [sys.executable, "-m", "benchmarks.pump"]


if __name__ == "__main__":
    main()
