"""The ``broky`` command: ``serve`` for operators, ``pub`` and ``sub`` for humans."""

from __future__ import annotations

import argparse
import logging
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

from broky import subs_cli
from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.errors import BrokyError
from broky.cluster import status as cluster_status
from broky.cluster.service import ClusterStartError
from broky.config import ACCEPT_MODES, DEFAULT_PORT, LOG_LEVELS, Config, ConfigError
from broky.consume_cli import add_consumer_flags, consume
from broky.loadtest import flags as bench
from broky.protocol.constants import ErrorCode
from broky.protocol.errors import LocalProtocolError
from broky.protocol.keys import encode_key
from broky.security import passwd
from broky.security.flags import (
    add_client_auth_flags,
    add_client_tls_flags,
    client_credentials,
    client_tls_context,
)

if TYPE_CHECKING:
    from broky.cluster.node import ClusterNode

# The broker's own modules (the server, the workers, replication, the
# ``top`` view) are imported by the commands that run them: ``broky pub``
# and ``broky sub`` need only the client's.

log = logging.getLogger("broky")


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


#: Settings ``broky serve`` takes as flags too (``--tls-cert`` for ``tls_cert``).
TLS_SETTINGS = (
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "cluster_tls_cert",
    "cluster_tls_key",
    "cluster_tls_ca",
)


def load_config(args: argparse.Namespace) -> Config:
    """The config file's settings, overridden by command-line flags."""
    base = Config.from_toml(Path(args.config)) if args.config else Config()
    values: dict[str, object] = {
        field.name: getattr(base, field.name) for field in attrs.fields(Config)
    }
    overridable = (
        "host",
        "port",
        "log_level",
        "workers",
        "accept",
        "cluster_listen",
        "allow_anonymous",
        "cluster_etcd",
        "node_id",
        "cluster_name",
        "replication_factor",
        "vbuckets",
        "cluster_lease_ttl",
        "replication_listen",
        "min_insync_replicas",
    )
    for name in (*overridable, *TLS_SETTINGS):
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    if getattr(args, "peers", None) is not None:
        values["peers"] = [peer for peer in args.peers.split(",") if peer]
    return Config.from_mapping(values)


async def serve(
    config: Config, load: Callable[[], Config] | None = None, member: ClusterNode | None = None
) -> None:
    """Run a broker until SIGINT or SIGTERM, then shut it down gracefully.
    SIGHUP reloads users, allow_anonymous and certificates with ``load``
    (broky.reload). A cluster ``member`` with ``replication_listen`` set
    replicates the durable topics (broky.replication)."""
    from broky.reload import reread  # noqa: PLC0415 - see the imports
    from broky.replication.attach import replicates, service_for  # noqa: PLC0415
    from broky.server import Broker  # noqa: PLC0415

    broker = Broker(config)
    if member is not None and replicates(broker, config):
        replication = service_for(broker, config, member, config.replication_listen)
        broker.beside_store.append(replication.run)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(broker.serve)
            # One parseable line on stdout for scripts and benchmarks.
            print(f"broky listening on {address[0]}:{address[1]}", flush=True)
            async for signum in signals:
                if signum == signal.SIGHUP:
                    reloaded = reread(load, broker.config) if load is not None else None
                    if reloaded is not None:
                        broker.reload(reloaded)
                    continue
                log.info("received %s, shutting down", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


def _key_text(code: ErrorCode) -> Callable[[str], str]:
    """An argparse type refusing what the client would refuse (a control or
    whitespace character): a usage error, not a traceback from the client."""

    def check(text: str) -> str:
        try:
            encode_key(text, code)
        except LocalProtocolError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return check


async def publish(
    args: argparse.Namespace,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """``broky pub``: publish a payload (or each stdin line) to a key."""
    async with credentials.connect(args.address, "broky-pub", tls) as client:
        if args.payload is None:
            count = 0
            for count, line in enumerate(sys.stdin.buffer, start=1):  # noqa: B007
                await client.publish(args.key, line.rstrip(b"\n"))
        else:
            payload = args.payload.encode()
            for _ in range(args.count):
                await client.publish(args.key, payload)
            count = args.count
        await client.flush()
    print(f"published {count} message(s) to {args.key}", file=sys.stderr)


async def subscribe(
    args: argparse.Namespace,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """``broky sub``: print messages matching a pattern."""
    received = 0
    async with (
        credentials.connect(args.address, "broky-sub", tls) as client,
        client.subscription(args.pattern, queue=args.queue) as subscription,
    ):
        group = f" in queue group {args.queue}" if args.queue else ""
        print(f"subscribed to {args.pattern}{group}", file=sys.stderr, flush=True)
        async for message in subscription:
            payload = message.payload.decode(errors="backslashreplace")
            print(f"[{message.key}] {payload}", flush=True)
            received += 1
            if args.count and received >= args.count:
                break


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="broky",
        description="Broky, a publish/subscribe message broker: serve runs one; pub, sub, "
        "subs and top talk to one; bench load-tests one; passwd makes credentials for its config; "
        "cluster runs a local etcd or shows a replicated cluster.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve_cmd = commands.add_parser("serve", help="run a broker")
    serve_cmd.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve_cmd.add_argument("--port", type=int, help=f"port (default {DEFAULT_PORT}; 0 = any)")
    serve_cmd.add_argument("--config", help="TOML file of settings (see README)")
    serve_cmd.add_argument("--log-level", choices=LOG_LEVELS, help="default info")
    serve_cmd.add_argument(
        "--workers", type=int, help="worker processes, one router each (default: one per core)"
    )
    serve_cmd.add_argument(
        "--accept", choices=ACCEPT_MODES, help="how connections reach workers (default reuseport)"
    )
    serve_cmd.add_argument(
        "--cluster-listen", help="HOST:PORT for other nodes' links (worker i uses PORT+i)"
    )
    serve_cmd.add_argument(
        "--peers", help="comma-separated cluster_listen addresses of the other nodes"
    )
    serve_cmd.add_argument(
        "--cluster",
        dest="cluster_etcd",
        help="join the replicated cluster whose metadata is in this etcd, "
        "etcd://HOST:PORT[,HOST:PORT...] (needs --node-id)",
    )
    serve_cmd.add_argument("--node-id", help="this node's id in the replicated cluster")
    serve_cmd.add_argument(
        "--cluster-name", help="the cluster's name (its keys in etcd: /broky/NAME/)"
    )
    serve_cmd.add_argument(
        "--replication-factor", type=int, help="copies of each partition (new cluster: 3)"
    )
    serve_cmd.add_argument("--vbuckets", type=int, help="vbuckets of a new cluster (256)")
    serve_cmd.add_argument(
        "--cluster-lease-ttl", type=int, help="seconds before a silent node is dead (1)"
    )
    serve_cmd.add_argument(
        "--replication-listen",
        help="HOST:PORT where this member serves replication of its durable topics",
    )
    serve_cmd.add_argument(
        "--min-insync-replicas", type=int, help="in-sync replicas an acks=all publish needs (2)"
    )
    for setting in TLS_SETTINGS:
        serve_cmd.add_argument(
            f"--{setting.replace('_', '-')}", help=f"PEM file; overrides {setting} (see README)"
        )
    serve_cmd.add_argument(
        "--allow-anonymous",
        action="store_true",
        default=None,
        help="accept clients without credentials, even on a non-loopback --host "
        "(allow_anonymous = true; see docs/security.md)",
    )

    default_address = f"127.0.0.1:{DEFAULT_PORT}"
    pub_cmd = commands.add_parser("pub", help="publish messages")
    pub_cmd.add_argument("key", type=_key_text(ErrorCode.INVALID_KEY))
    pub_cmd.add_argument("payload", nargs="?", help="payload; omitted: one message per stdin line")
    pub_cmd.add_argument("--count", type=int, default=1, help="publish the payload N times")
    pub_cmd.add_argument("--address", default=default_address, help="broker HOST:PORT")
    add_client_tls_flags(pub_cmd)
    add_client_auth_flags(pub_cmd)

    sub_cmd = commands.add_parser("sub", help="print messages matching a pattern")
    sub_cmd.add_argument("pattern", type=_key_text(ErrorCode.INVALID_PATTERN))
    sub_cmd.add_argument("--count", type=int, default=0, help="exit after N messages")
    sub_cmd.add_argument(
        "--queue",
        type=_key_text(ErrorCode.INVALID_PATTERN),
        default=None,
        help="join this queue group: each message goes to one of its members",
    )
    sub_cmd.add_argument("--address", default=default_address, help="broker HOST:PORT")
    add_consumer_flags(sub_cmd)
    add_client_tls_flags(sub_cmd)
    add_client_auth_flags(sub_cmd)
    top_cmd = commands.add_parser("top", help="live view of a broker (from $SYS.metrics)")
    top_cmd.add_argument("--address", default=default_address, help="broker HOST:PORT")
    top_cmd.add_argument(
        "--per-worker", action="store_true", help="also show one row per worker of the node"
    )
    add_client_tls_flags(top_cmd)
    add_client_auth_flags(top_cmd)
    bench.add_parser(commands)
    passwd.add_parser(commands)
    cluster_status.add_parser(commands)
    subs_cli.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``broky`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            from broky.cluster.service import serve_member  # noqa: PLC0415 - see the imports
            from broky.gcpolicy import tune_for_broker  # noqa: PLC0415
            from broky.mesh.workers import serve_node, worker_count  # noqa: PLC0415

            config = load_config(args)
            _configure_logging(config.log_level)
            tune_for_broker()
            workers = worker_count(config)
            if config.replication_listen and not config.cluster_etcd:
                raise ConfigError("replication_listen needs cluster_etcd")
            server: Callable[..., Awaitable[None]]
            if workers == 1 and not config.cluster_listen:
                server = serve
            elif config.durable and config.cluster_listen:
                raise ConfigError(
                    "durable topics are not replicated between nodes yet: remove "
                    "cluster_listen (a node's workers share its durable topics)"
                )
            else:
                server = serve_node
            load = partial(load_config, args)
            if config.cluster_etcd:
                trio.run(serve_member, server, config, load, workers)
            else:
                trio.run(server, config, load)
        elif args.command in ("bench", "passwd", "cluster", "subs"):
            return int(args.handler(args))
        elif args.command == "top":
            from broky.observability.top import watch  # noqa: PLC0415 - see the imports

            trio.run(
                partial(
                    watch,
                    args.address,
                    client_tls_context(args),
                    client_credentials(args),
                    per_worker=args.per_worker,
                )
            )
        elif args.command == "pub":
            _configure_logging("warning")
            trio.run(publish, args, client_tls_context(args), client_credentials(args))
        else:
            _configure_logging("warning")
            command = consume if args.subscription else subscribe
            trio.run(command, args, client_tls_context(args), client_credentials(args))
    except ConfigError as exc:
        print(f"broky: configuration error: {exc}", file=sys.stderr)
        return 2
    except (BrokyError, OSError, ClusterStartError) as exc:
        print(f"broky: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
