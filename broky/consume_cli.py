"""``broky sub --subscription NAME``: consume a durable subscription from the
command line, acking what it printed.

Kept out of ``cli.py`` (which parses and dispatches) so the command's one
rule sits with its code: a message is acked only after its line was
written and flushed to stdout, so a ``broky sub`` killed mid-way loses
nothing it did not print (the broker redelivers the rest), and what it
printed may be printed again by the next consumer only if the process died
before the acks were sent (at most ``ack_interval``, 5 ms, of them).
"""

from __future__ import annotations

import argparse
import ssl
import sys
from typing import Final, cast

from broky.client.consumer_options import SubscriptionType
from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.durable import Start

TYPES: Final = ("shared", "exclusive", "failover", "key-shared")
STARTS: Final = {"latest": Start.latest, "earliest": Start.earliest}


def add_consumer_flags(parser: argparse.ArgumentParser) -> None:
    """The ``sub`` flags that make it a durable-subscription consumer."""
    parser.add_argument(
        "--subscription",
        help="consume durable subscription NAME (created on first use) and ack what is printed",
    )
    parser.add_argument(
        "--type", choices=TYPES, default="shared", help="with --subscription (default shared)"
    )
    parser.add_argument(
        "--start",
        choices=tuple(STARTS),
        default="latest",
        help="where a new subscription starts (default latest)",
    )
    parser.add_argument(
        "--dead-letter-topic",
        default="",
        help="with --subscription: the durable topic (its [[durable]] name) that receives "
        "the new subscription's dead letters (default: the _dlq topic)",
    )
    parser.add_argument(
        "--show-offsets",
        action="store_true",
        help="prefix each line with topic/partition@offset and the delivery count",
    )


async def consume(
    args: argparse.Namespace,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """Print each delivery of ``args.subscription`` and ack it once printed."""
    received = 0
    async with (
        credentials.connect(args.address, "broky-sub", tls) as client,
        client.consumer(
            args.pattern,
            subscription=args.subscription,
            type=cast(SubscriptionType, args.type),
            start=STARTS[args.start](),
            dead_letter_topic=args.dead_letter_topic,
        ) as consumer,
    ):
        print(
            f"consuming {args.pattern} as subscription {args.subscription} ({args.type})",
            file=sys.stderr,
            flush=True,
        )
        async for delivery in consumer:
            payload = delivery.payload.decode(errors="backslashreplace")
            where = (
                f"{delivery.topic}/{delivery.partition}@{delivery.offset} "
                f"#{delivery.delivery_count} "
                if args.show_offsets
                else ""
            )
            print(f"{where}[{delivery.key}] {payload}", flush=True)
            await delivery.ack()
            received += 1
            if args.count and received >= args.count:
                break
