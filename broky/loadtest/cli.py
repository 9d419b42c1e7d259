"""The ``broky bench`` command line: flags, progress bar, table, JSON and plots."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from broky.config import ConfigError
from broky.loadtest.bench import SCENARIOS, BenchOptions, Unsupported, run_bench
from broky.loadtest.peers import PEERS, installed_peers
from broky.security.flags import (
    add_client_auth_flags,
    add_client_tls_flags,
    client_credentials,
    client_tls_context,
    wants_tls,
)


def add_parser(commands: Any) -> None:
    """Add ``bench`` to the ``broky`` subcommands."""
    bench = commands.add_parser(
        "bench",
        help="load-test a broker (fan-in, fan-out, latency, slow subscriber, client receive)",
        description="Load-test Broky; prints publish and delivery rates separately.",
    )
    bench.add_argument("scenario", choices=SCENARIOS)
    bench.add_argument(
        "--number", type=int, default=0,
        help="publishers (fan-in, default 4) or subscribers (fan-out, default 8)",
    )  # fmt: skip
    bench.add_argument(
        "--subscribe", action="append", default=[], metavar="PATTERN",
        help="one subscriber per use (repeatable): sets the fan-out factor; default bench.data",
    )  # fmt: skip
    bench.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    bench.add_argument(
        "--interval", type=float,
        help="seconds between messages per publisher (default: as fast as possible; "
        "latency: 0.0001)",
    )  # fmt: skip
    amount = bench.add_mutually_exclusive_group()
    amount.add_argument("--count", type=int, default=0, help="messages per publisher")
    amount.add_argument("--duration", type=float, default=5.0, help="seconds (default 5)")
    bench.add_argument(
        "--mode", choices=("raw", "client"), default="raw",
        help="raw: pre-encoded frames, so the broker is the bottleneck (default); "
        "client: publish through the client library",
    )  # fmt: skip
    bench.add_argument("--run", type=int, default=500, help="messages per run of one key")
    bench.add_argument(
        "--frame", type=int, default=0,
        help="messages per Publish frame (default: --run; 1: one message per frame)",
    )  # fmt: skip
    bench.add_argument(
        "--keys", type=int, default=1,
        help="keys cycled: bench.k0 .. bench.k<N-1> (default 1: bench.data); "
        "subscribers then default to bench.>",
    )  # fmt: skip
    bench.add_argument(
        "--batches", action="store_true",
        help="receive: consume through Subscription.batches() instead of per message",
    )  # fmt: skip
    target = bench.add_mutually_exclusive_group()
    target.add_argument("--workers", type=int, default=1, help="workers of the started broker")
    target.add_argument("--address", help="HOST:PORT of a running broker (none is started)")
    bench.add_argument(
        "--compare", action="store_true",
        help=f"also run against {', '.join(PEERS.values())} where installed and the "
        "scenario has an equivalent there (not client mode, slow-subscriber or receive)",
    )  # fmt: skip
    add_client_tls_flags(bench)  # with --address: the started broker has no TLS
    add_client_auth_flags(bench)  # with --address: the started broker has no users
    bench.add_argument("--json", action="store_true", help="one JSON object per target")
    bench.add_argument("--plot", metavar="FILE.png", help="latency and throughput plots")
    bench.set_defaults(handler=main)


@contextmanager
def _progress(console: Console, target: str) -> Iterator[Callable[[float, str], None]]:
    with Progress(
        TextColumn(f"{target:>10}"), BarColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), console=console, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("", total=1.0)

        def update(fraction: float, text: str) -> None:
            progress.update(task, completed=fraction, description=text)

        yield update


def _table(results: list[dict[str, Any]]) -> Table:
    table = Table(title=f"broky bench {results[0]['scenario']}")
    columns = ("target", "pub/s", "deliveries/s", "per subscriber/s", "lost", "cpu")
    for column in columns:
        table.add_column(column, justify="left" if column == "target" else "right")
    latency = "latency" in results[0]
    if latency:
        for column in ("p50", "p90", "p99", "p99.9", "max"):
            table.add_column(f"{column} µs", justify="right")
    for result in results:
        cpu = result["server_cpu_utilisation"]
        row = [
            result["target"],
            f"{result['published_per_s']:,}",
            f"{result['delivered_per_s']:,}",
            f"{result['delivered_per_subscriber_per_s']:,}",
            f"{result['lost']:,} ({result['loss_pct']:g}%)",
            "" if cpu is None else f"{cpu:.0%}",
        ]
        if latency:
            summary = result["latency"]
            row += [f"{summary.get(k, 0):,.0f}" for k in ("p50_us", "p90_us", "p99_us")]
            row += [f"{summary.get('p99.9_us', 0):,.0f}", f"{summary.get('max_us', 0):,.0f}"]
        table.add_row(*row)
    return table


def main(args: argparse.Namespace) -> int:
    """Run ``broky bench``; returns the exit status."""
    if wants_tls(args) and not args.address:
        raise ConfigError("--tls flags need --address: the broker bench starts has no TLS")
    options = BenchOptions(
        scenario=args.scenario,
        number=args.number,
        subscribe=tuple(args.subscribe),
        size=args.size,
        interval=args.interval,
        count=args.count,
        duration=args.duration,
        run=args.run,
        frame=args.frame,
        keys=args.keys,
        batches=args.batches,
        mode=args.mode,
        workers=args.workers,
        address=args.address,
        tls=client_tls_context(args),
        credentials=client_credentials(args),
    )
    if args.plot:
        from broky.loadtest.plot import require_matplotlib  # noqa: PLC0415 - optional extra

        require_matplotlib()  # fail before the run, not after it
    compare: list[str] = []
    err = Console(stderr=True)
    if args.compare:
        compare = installed_peers()
        if not compare:
            err.print(f"--compare: none of {', '.join(PEERS.values())} is installed")
    factory = (lambda target: _progress(err, target)) if err.is_terminal else None
    try:
        results = run_bench(options, compare, factory)
    except Unsupported as exc:
        err.print(f"broky bench {args.scenario}: not available: {exc}")
        return 1
    if args.plot:
        from broky.loadtest.plot import plot  # noqa: PLC0415 - optional extra

        plot(results, args.plot)
        err.print(f"plot written to {args.plot}")
    if args.json:
        for result in results:
            public = {k: v for k, v in result.items() if not k.startswith("_")}
            print(json.dumps(public), flush=True)
    else:
        Console().print(_table(results))
    return 0 if results[0]["delivered"] else 1
