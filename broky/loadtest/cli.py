"""The ``broky bench`` run: progress bar, table, JSON and plots (flags: broky.loadtest.flags)."""

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
from broky.loadtest.bench import BenchOptions, Unsupported, run_bench
from broky.loadtest.peers import PEERS, installed_peers
from broky.security.flags import client_credentials, client_tls_context, wants_tls


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
