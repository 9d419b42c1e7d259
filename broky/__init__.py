"""Broky: a low-latency publish/subscribe message broker on trio.

The public API is re-exported here; ``tests/test_exports.py`` keeps the list
honest.
"""

import importlib
import typing

if typing.TYPE_CHECKING:
    from broky.client.acked_runs import AckedRuns
    from broky.client.client import Client
    from broky.client.consumer import Consumer, ConsumerStatistics
    from broky.client.delivery import Delivery
    from broky.client.durable import AckedRun, PartitionInfo, Start, SubscriptionDeletion
    from broky.client.errors import (
        AckTimeout,
        AuthenticationError,
        BrokyError,
        ConnectionClosed,
        ConsumerRefused,
        PublishRefused,
        SubscriptionError,
    )
    from broky.client.subscription import Subscription, SubscriptionStatistics
    from broky.client.tcp import connect
    from broky.config import Config, ConfigError
    from broky.ksuid import new_ksuid
    from broky.protocol.constants import ErrorCode, SlowConsumerPolicy
    from broky.protocol.errors import LocalProtocolError, ProtocolError
    from broky.protocol.message import Message
    from broky.security.passwords import hash_secret
    from broky.server import Broker, BrokerStatistics

__version__ = "0.1.0"

__all__ = [
    "AckTimeout",
    "AckedRun",
    "AckedRuns",
    "AuthenticationError",
    "Broker",
    "BrokerStatistics",
    "BrokyError",
    "Client",
    "Config",
    "ConfigError",
    "ConnectionClosed",
    "Consumer",
    "ConsumerRefused",
    "ConsumerStatistics",
    "Delivery",
    "ErrorCode",
    "LocalProtocolError",
    "Message",
    "PartitionInfo",
    "ProtocolError",
    "PublishRefused",
    "SlowConsumerPolicy",
    "Start",
    "Subscription",
    "SubscriptionDeletion",
    "SubscriptionError",
    "SubscriptionStatistics",
    "connect",
    "hash_secret",
    "new_ksuid",
]


#: Where each public name lives. ``import broky.protocol.codec`` (a load
#: generator's spawned process, a spark executor) should not pay for the
#: server and the client it does not use, so names load on first use (PEP 562).
_HOMES = {
    "AckTimeout": "broky.client.errors",
    "AckedRun": "broky.client.durable",
    "AckedRuns": "broky.client.acked_runs",
    "AuthenticationError": "broky.client.errors",
    "Broker": "broky.server",
    "BrokerStatistics": "broky.server",
    "BrokyError": "broky.client.errors",
    "Client": "broky.client.client",
    "Config": "broky.config",
    "ConfigError": "broky.config",
    "ConnectionClosed": "broky.client.errors",
    "Consumer": "broky.client.consumer",
    "ConsumerRefused": "broky.client.errors",
    "ConsumerStatistics": "broky.client.consumer",
    "Delivery": "broky.client.delivery",
    "ErrorCode": "broky.protocol.constants",
    "LocalProtocolError": "broky.protocol.errors",
    "Message": "broky.protocol.message",
    "PartitionInfo": "broky.client.durable",
    "ProtocolError": "broky.protocol.errors",
    "PublishRefused": "broky.client.errors",
    "SlowConsumerPolicy": "broky.protocol.constants",
    "Start": "broky.client.durable",
    "Subscription": "broky.client.subscription",
    "SubscriptionDeletion": "broky.client.durable",
    "SubscriptionError": "broky.client.errors",
    "SubscriptionStatistics": "broky.client.subscription",
    "connect": "broky.client.tcp",
    "hash_secret": "broky.security.passwords",
    "new_ksuid": "broky.ksuid",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'broky' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
