"""Durable rows side by side with NATS JetStream, measured in one run.

Run: ``.venv/bin/python -m benchmarks.bench_jetstream [--duration S]
[--messages N] [--dir DIR]``. Prints one JSON object per line: a row per
target (``jetstream``, ``broky`` with ``fsync = "interval"`` and with
``fsync = "always"``) and scenario, the Broky rows with ``ratio_to_jetstream``.

- ``acked_publish_one`` / ``acked_publish_many``: 8 publisher connections,
  100-byte payloads, windows of 20,000 acked publishes (each waited for),
  for ``--duration`` seconds; ``one``: each publisher its own key (subject),
  ``many``: each cycles ``bench.k0`` .. ``bench.k999``. Broky: 8 partitions,
  idempotent producers (``benchmarks.bench_durable.broker_rate``);
  JetStream: one file-backed stream on ``bench.>``.
- ``consume_ack_shared_x4``: ``--messages`` messages over 8 keys loaded,
  then 4 consumers of one shared subscription (Broky) / one durable pull
  consumer with explicit acks (JetStream) consume and ack all of it; the
  clock stops once the server has taken every ack (Broky: the receipts;
  JetStream: the consumer's ack floor). Broky's side is
  ``benchmarks.bench_consumers.consume_rate``.

Every row has ``lost`` (published or loaded and never acked) beside its
rate, and ``server_us_per_msg`` (the server process's CPU per message).
JetStream 2.9 does not fsync per ack (module docstring of
``broky.loadtest.jetstream``): compare it with the ``interval`` rows.
JetStream is driven over the raw protocol by ``broky.loadtest.jetstream``,
so that a Python client library does not cap it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import trio

from benchmarks.bench_consumers import consume_rate
from benchmarks.bench_durable import (
    MANY_KEYS,
    PAYLOAD,
    PUBLISHERS,
    WINDOW,
    broker_rate,
    write_config,
)
from benchmarks.interrupt import stop_children_on_signals
from broky import Start
from broky.client.consumer_options import ConsumerSettings
from broky.loadtest import jetstream, peers
from broky.loadtest.servers import cpu_seconds

CONSUMERS = 4


def subjects(mix: str) -> Callable[[int], list[bytes]]:
    """Each publisher's window of subjects, as ``bench_durable.key_mix`` keys them."""
    if mix == "one":
        return lambda index: [b"bench.p%d" % index] * WINDOW
    return lambda index: [b"bench.k%d" % (n % MANY_KEYS) for n in range(WINDOW)]


def jetstream_publish(
    pid: int, address: tuple[str, int], mix: str, duration: float
) -> dict[str, object]:
    async def run() -> dict[str, object]:
        await jetstream.recreate_stream(address)
        before = cpu_seconds(pid)
        published, acked, elapsed = await jetstream.publish(
            address, PUBLISHERS, subjects(mix), PAYLOAD, duration=duration
        )
        server = cpu_seconds(pid) - before
        return {
            "keys": mix,
            "msgs_per_s": round(acked / elapsed),
            "published": published,
            "acked": acked,
            "lost": published - acked,
            "server_us_per_msg": round(server / max(acked, 1) * 1e6, 2),
        }

    return trio.run(run)


def jetstream_consume(pid: int, address: tuple[str, int], messages: int) -> dict[str, object]:
    async def run() -> dict[str, object]:
        await jetstream.recreate_stream(address)
        published, loaded, _ = await jetstream.publish(
            address, PUBLISHERS, lambda index: [b"bench.k%d" % (n % 8) for n in range(WINDOW)],
            PAYLOAD, messages=messages,
        )  # fmt: skip
        before = cpu_seconds(pid)
        seen, elapsed = await jetstream.consume(address, CONSUMERS, loaded)
        server = cpu_seconds(pid) - before
        unique = len(set(seen))
        return {
            "published": published,
            "acked": unique,
            "msgs_per_s": round(unique / elapsed),
            "lost": published - unique,
            "duplicates": len(seen) - unique,
            "server_us_per_msg": round(server / max(unique, 1) * 1e6, 2),
        }

    return trio.run(run)


def broky_consume(root: Path, fsync: str, messages: int) -> dict[str, object]:
    """bench_consumers' shared x4 scenario against a fresh broker."""
    config = root / f"consume-{fsync}.toml"
    write_config(config, root / f"data-consume-{fsync}", fsync)
    process = subprocess.Popen(
        [sys.executable, "-m", "broky", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    settings = ConsumerSettings(start=Start.earliest(), credit=20_000, max_in_flight=50_000)
    try:
        assert process.stdout is not None
        address = process.stdout.readline().strip().rsplit(" ", 1)[-1]
        return trio.run(consume_rate, address, process.pid, messages, 8, "shared", 120.0, settings)
    finally:
        process.terminate()
        process.wait(10)


def emit(scenario: str, target: str, **fields: object) -> None:
    print(json.dumps({"scenario": scenario, "target": target, **fields}), flush=True)


def _compared(figures: dict[str, object], baseline: dict[str, object]) -> dict[str, object]:
    rate, base = figures.get("msgs_per_s"), baseline.get("msgs_per_s")
    if isinstance(rate, int) and isinstance(base, int) and base:
        return {**figures, "ratio_to_jetstream": round(rate / base, 3)}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per publish row")
    parser.add_argument("--messages", type=int, default=200_000, help="messages consumed")
    parser.add_argument("--dir", default=None, help="where servers keep data (default: temp)")
    args = parser.parse_args()
    stop_children_on_signals()
    with tempfile.TemporaryDirectory(dir=args.dir) as name:
        root = Path(name)
        if shutil.which("nats-server") is None:
            raise SystemExit("nats-server is not installed (make installs it with apt-get)")
        with peers.peer_server("nats", jetstream=True) as (pid, address):
            baseline = {
                mix: jetstream_publish(pid, address, mix, args.duration) for mix in ("one", "many")
            }
            consumed = jetstream_consume(pid, address, args.messages)
        for mix, figures in baseline.items():
            emit(f"acked_publish_{mix}", "jetstream", **figures)
            for fsync in ("interval", "always"):
                broky = broker_rate(root, fsync, args.duration, mix, replay=False)
                emit(f"acked_publish_{mix}", f"broky-{fsync}", **_compared(broky, figures))
        emit("consume_ack_shared_x4", "jetstream", **consumed)
        emit(
            "consume_ack_shared_x4",
            "broky-interval",
            **_compared(broky_consume(root, "interval", args.messages), consumed),
        )


if __name__ == "__main__":
    main()
