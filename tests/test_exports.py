"""The public API: ``broky.__all__`` is complete, accurate and private-free."""

from __future__ import annotations

import enum
import inspect
import subprocess
import sys
import types
from importlib.metadata import version

import pytest

import broky
import broky.client.acked_runs
import broky.client.client
import broky.client.consumer
import broky.client.delivery
import broky.client.durable
import broky.client.errors
import broky.client.subscription
import broky.client.tcp
import broky.config
import broky.ksuid
import broky.protocol.constants
import broky.protocol.errors
import broky.protocol.message
import broky.security.passwords
import broky.server

#: Where each public name is defined (its one home).
HOMES = {
    "AckedRun": broky.client.durable,
    "AckedRuns": broky.client.acked_runs,
    "AuthenticationError": broky.client.errors,
    "PublishRefused": broky.client.errors,
    "hash_secret": broky.security.passwords,
    "PartitionInfo": broky.client.durable,
    "Start": broky.client.durable,
    "Broker": broky.server,
    "BrokerStatistics": broky.server,
    "BrokyError": broky.client.errors,
    "AckTimeout": broky.client.errors,
    "Client": broky.client.client,
    "Config": broky.config,
    "ConfigError": broky.config,
    "ConnectionClosed": broky.client.errors,
    "Consumer": broky.client.consumer,
    "ConsumerRefused": broky.client.errors,
    "ConsumerStatistics": broky.client.consumer,
    "Delivery": broky.client.delivery,
    "ErrorCode": broky.protocol.constants,
    "LocalProtocolError": broky.protocol.errors,
    "Message": broky.protocol.message,
    "ProtocolError": broky.protocol.errors,
    "SlowConsumerPolicy": broky.protocol.constants,
    "Subscription": broky.client.subscription,
    "SubscriptionDeletion": broky.client.durable,
    "SubscriptionError": broky.client.errors,
    "SubscriptionStatistics": broky.client.subscription,
    "connect": broky.client.tcp,
    "new_ksuid": broky.ksuid,
}


def test_all_lists_exactly_the_documented_names() -> None:
    assert sorted(broky.__all__) == sorted(HOMES)
    assert len(set(broky.__all__)) == len(broky.__all__)


@pytest.mark.parametrize("name", sorted(HOMES))
def test_name_is_the_object_from_its_home(name: str) -> None:
    exported = getattr(broky, name)
    assert exported is getattr(HOMES[name], name)
    assert exported.__module__ == HOMES[name].__name__
    assert exported.__name__ == name


def test_star_import_gives_all() -> None:
    namespace: dict[str, object] = {}
    exec("from broky import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(broky.__all__)


def test_nothing_private_leaks() -> None:
    assert not [name for name in broky.__all__ if name.startswith("_")]
    # Every public attribute of the package is either exported or a subpackage
    # (exports load on first use, so some may not be attributes yet).
    public = {
        name
        for name, value in vars(broky).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(broky.__all__)
    assert set(broky.__all__) <= set(dir(broky))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Brocker'"):
        _ = broky.Brocker


def test_a_protocol_import_loads_neither_server_nor_client() -> None:
    """A load generator's spawned process, or a Spark executor, imports the
    codec alone: the exports load on first use, not with the package."""
    probe = (
        "import sys, broky.protocol.codec, broky.loadtest.loadgen; "
        "print(sorted(m for m in ('broky.server', 'broky.client.client') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
    assert broky.Broker is broky.server.Broker


def test_errors_form_one_hierarchy_with_wire_codes() -> None:
    assert issubclass(broky.BrokyError, Exception)
    assert issubclass(broky.ConnectionClosed, broky.BrokyError)
    assert issubclass(broky.SubscriptionError, broky.BrokyError)
    assert issubclass(broky.ConsumerRefused, broky.SubscriptionError)
    assert issubclass(broky.ConfigError, ValueError)
    error = broky.SubscriptionError(broky.ErrorCode.INVALID_PATTERN, "bad pattern")
    assert error.code is broky.ErrorCode.INVALID_PATTERN
    assert "bad pattern" in str(error)
    assert "INVALID_PATTERN" in str(error)
    closed = broky.ConnectionClosed("gone")
    assert closed.code is broky.ErrorCode.INTERNAL


def test_kinds_of_the_exports() -> None:
    for name in ("Broker", "Client", "Config", "Subscription"):
        assert inspect.isclass(getattr(broky, name)), name
    for name in ("ErrorCode", "SlowConsumerPolicy"):
        assert issubclass(getattr(broky, name), enum.IntEnum), name
    # connect is an async context manager factory: calling it starts nothing.
    assert callable(broky.connect)
    manager = broky.connect("127.0.0.1:1")
    assert hasattr(manager, "__aenter__")
    assert hasattr(manager, "__aexit__")
    assert broky.Message("k", b"p").ts_broker == 0


def test_version_matches_the_package_metadata() -> None:
    assert broky.__version__ == version("broky")
