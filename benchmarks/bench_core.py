"""Core benchmark: fan-in and fan-out through Broky and through a byte pump.

Run: ``.venv/bin/python -m benchmarks.bench_core [--duration S] [--size B]``.
Prints one JSON object per line (one per scenario, then a summary), so
results can be compared across runs; the ratio to the pump, measured in the
same run, is the number that survives a noisy shared machine.

Targets: Broky with 1 and 2 workers (``--workers``), the pump, and
nats-server when it is installed (started on 127.0.0.1, stopped by PID, and
driven through its own protocol with the same raw-socket load).

Scenarios (100-byte payloads by default):
- ``fanin_raw``: 4 publishers writing pre-encoded frames -> 1 subscriber.
- ``fanout_raw``: 1 pre-encoded publisher -> 8 subscribers.
- ``fanin_client``: 4 publishers using the client library -> 1 subscriber.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

from broky.loadtest import loadgen, peers
from broky.loadtest.bench import cpu_seconds
from broky.loadtest.bench import server_process as server

CONTEXT = multiprocessing.get_context("fork")
#: Peer brokers swept in the same run when their server is installed.
PEER_TARGETS = ("nats",)


Server = Callable[[], AbstractContextManager[tuple[int, tuple[str, int]]]]


def measure(
    target: str,
    scenario: str,
    start_server: Server,
    publishers: int,
    patterns: list[str],
    publisher: Callable[..., None],
    publisher_args: tuple[Any, ...],
    duration: float,
    rate: float,
) -> dict[str, Any]:
    """Run one scenario against a fresh server at ``rate`` messages/s in total
    (0: publishers go flat out) and return its figures."""
    peer = target if target in PEER_TARGETS else None
    if peer is not None:
        # The same load through the peer's own wire protocol.
        publisher = partial(peers.peer_publisher, peer)
        subscribe: Callable[..., None] = partial(peers.peer_subscribers, peer)
    else:
        subscribe = loadgen.raw_subscribers
    with start_server() as (pid, address):
        stop = CONTEXT.Event()
        ready = CONTEXT.Event()
        received = CONTEXT.Value("q", 0, lock=False)
        dropped = CONTEXT.Value("q", 0, lock=False)
        sent = [CONTEXT.Value("q", 0, lock=False) for _ in range(publishers)]
        subscriber = CONTEXT.Process(
            target=subscribe,
            args=(address, patterns, received, dropped, ready, stop),
        )
        subscriber.start()
        if not ready.wait(10):
            raise RuntimeError("subscribers were not confirmed")
        workers = [
            CONTEXT.Process(
                target=publisher,
                args=(address, *publisher_args, rate / publishers, counter, stop),
            )
            for counter in sent
        ]
        for worker in workers:
            worker.start()
        time.sleep(min(1.0, duration / 3))  # warm-up
        start_received, start_sent = received.value, sum(c.value for c in sent)
        start_cpu, start_time = cpu_seconds(pid), time.perf_counter()
        time.sleep(duration)
        elapsed = time.perf_counter() - start_time
        server_cpu = cpu_seconds(pid) - start_cpu
        delivered = received.value - start_received
        published = sum(c.value for c in sent) - start_sent
        stop.set()
        for process in (*workers, subscriber):
            process.join(5)
            if process.is_alive():
                process.kill()
    fanout = len(patterns)
    return {
        "target": target,
        "scenario": scenario,
        "offered_per_s": round(rate) if rate else "max",
        "publishers": publishers,
        "subscribers": fanout,
        "published_per_s": round(published / elapsed),
        "delivered_per_s": round(delivered / elapsed),
        "messages_per_s": round(delivered / fanout / elapsed),
        "dropped": dropped.value,
        "server_cpu_us_per_delivery": round(server_cpu * 1e6 / delivered, 3) if delivered else None,
        "server_cpu_utilisation": round(server_cpu / elapsed, 2),
    }


def sustained(result: dict[str, Any], rate: float) -> bool:
    """Did the target keep up: (almost) everything offered published and delivered?"""
    fanout = result["subscribers"]
    return bool(
        result["published_per_s"] >= 0.9 * rate
        and result["delivered_per_s"] >= 0.97 * result["published_per_s"] * fanout
    )


def sweep(run: Callable[[float], dict[str, Any]], start_rate: float, step: float) -> dict[str, Any]:
    """Raise the offered rate until the target stops keeping up; return the
    best sustained result (the highest delivery rate with < 3% loss)."""
    best: dict[str, Any] | None = None
    rate = start_rate
    while True:
        result = run(rate)
        print(json.dumps({"step": True, **result}), file=sys.stderr, flush=True)
        if not sustained(result, rate):
            break
        if best is None or result["delivered_per_s"] > best["delivered_per_s"]:
            best = result
        rate *= step
    return best or result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per step")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--run", type=int, default=500, help="messages per pre-encoded run")
    parser.add_argument("--step", type=float, default=1.25, help="rate multiplier per step")
    parser.add_argument(
        "--only", action="append", help="run only this scenario (repeatable); no summary"
    )
    parser.add_argument(
        "--workers", default="1,2", help="comma-separated worker counts to run Broky with"
    )
    parser.add_argument("--accept", default="handoff", help="how connections reach workers")
    args = parser.parse_args()
    worker_counts = [int(count) for count in args.workers.split(",")]

    def broky_cmd(workers: int) -> list[str]:
        return [
            *(sys.executable, "-m", "broky", "serve", "--port", "0", "--log-level", "error"),
            *("--workers", str(workers), "--accept", args.accept),
        ]

    def name_of(workers: int) -> str:
        return "broky" if workers == 1 else f"broky-{workers}w"

    pump_cmd = [sys.executable, "-m", "benchmarks.pump"]
    raw: tuple[Callable[..., None], tuple[Any, ...]] = (
        loadgen.raw_publisher,
        ("bench.data", args.size, args.run),
    )
    client: tuple[Callable[..., None], tuple[Any, ...]] = (
        loadgen.client_publisher,
        ("bench.data", args.size),
    )
    installed = [peer for peer in PEER_TARGETS if peer in peers.installed_peers()]
    # (name, publishers, subscriber patterns, publisher, its args, first rate, targets)
    scenarios: list[
        tuple[str, int, list[str], Callable[..., None], tuple[Any, ...], int, tuple[str, ...]]
    ] = [
        (
            "fanin_raw",
            4,
            ["bench.data"],
            *raw,
            400_000,
            ("pump", *installed, *map(name_of, worker_counts)),
        ),
        (
            "fanout_raw",
            1,
            ["bench.data"] * 8,
            *raw,
            200_000,
            ("pump", *installed, *map(name_of, worker_counts)),
        ),
        ("fanin_client", 4, ["bench.data"], *client, 200_000, tuple(map(name_of, worker_counts))),
    ]
    servers: dict[str, Server] = {
        name_of(count): partial(server, broky_cmd(count)) for count in worker_counts
    }
    servers["pump"] = partial(server, pump_cmd)
    for peer in installed:
        servers[peer] = partial(peers.peer_server, peer)
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for name, publishers, patterns, publisher, publisher_args, first_rate, targets in scenarios:
        if args.only and name not in args.only:
            continue
        for target in targets:
            run = partial(
                measure,
                target,
                name,
                servers[target],
                publishers,
                patterns,
                publisher,
                publisher_args,
                args.duration,
            )

            result = sweep(run, first_rate, args.step)
            flat_out = run(0)
            result["flat_out_published_per_s"] = flat_out["published_per_s"]
            result["flat_out_delivered_per_s"] = flat_out["delivered_per_s"]
            pump = results.get(("pump", name))
            if target.startswith("broky") and pump and pump["delivered_per_s"]:
                result["ratio_to_pump"] = round(
                    result["delivered_per_s"] / pump["delivered_per_s"], 3
                )
            nats = results.get(("nats", name))
            if target.startswith("broky") and nats:
                result["ratio_to_nats"] = round(
                    result["delivered_per_s"] / nats["delivered_per_s"], 3
                )
            single = results.get(("broky", name))
            if target != "broky" and target.startswith("broky") and single:
                result["ratio_to_1_worker"] = round(
                    result["delivered_per_s"] / single["delivered_per_s"], 3
                )
            results[(target, name)] = result
            print(json.dumps(result), flush=True)
    if args.only or "broky" not in servers:
        return
    two = results.get(("broky-2w", "fanin_raw"))
    print(
        json.dumps(
            {
                "summary": "core",
                "payload_bytes": args.size,
                "fanin_msgs_per_s": results[("broky", "fanin_raw")]["messages_per_s"],
                "fanout_deliveries_per_s": results[("broky", "fanout_raw")]["delivered_per_s"],
                "client_publish_msgs_per_s": results[("broky", "fanin_client")][
                    "flat_out_published_per_s"
                ],
                "client_sustained_msgs_per_s": results[("broky", "fanin_client")]["messages_per_s"],
                "fanin_ratio_to_pump": results[("broky", "fanin_raw")].get("ratio_to_pump"),
                "fanout_ratio_to_pump": results[("broky", "fanout_raw")].get("ratio_to_pump"),
                "fanin_ratio_to_nats": results[("broky", "fanin_raw")].get("ratio_to_nats"),
                "fanout_ratio_to_nats": results[("broky", "fanout_raw")].get("ratio_to_nats"),
                "fanin_2_workers_msgs_per_s": two["messages_per_s"] if two else None,
                "fanin_2_workers_vs_1": two.get("ratio_to_1_worker") if two else None,
                "fanout_2_workers_deliveries_per_s": (
                    results[("broky-2w", "fanout_raw")]["delivered_per_s"]
                    if ("broky-2w", "fanout_raw") in results
                    else None
                ),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
