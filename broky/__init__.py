"""Broky: a low-latency publish/subscribe message broker on trio.

The public API is re-exported here; ``tests/test_exports.py`` keeps the list
honest.
"""

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
