"""The ``broky bench`` flags, apart from the run.

``broky serve`` builds the same parser as ``broky bench``; the run (rich,
the peer protocols, the client library) loads only when a bench starts, so
a broker process does not pay for it at every start.
"""

from __future__ import annotations

import argparse
from typing import Any

from broky.loadtest.peers import PEERS
from broky.loadtest.scenarios import SCENARIOS
from broky.security.flags import add_client_auth_flags, add_client_tls_flags


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
    bench.set_defaults(handler=_main)


def _main(args: argparse.Namespace) -> int:
    from broky.loadtest.cli import main  # noqa: PLC0415 - see the module docstring

    return main(args)
