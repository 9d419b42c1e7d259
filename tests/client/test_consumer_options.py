"""Every option of ``client.consumer`` reaches the wire or is the client's own.

Issue 13 asked that no consumer option be silently dropped between the
client and the broker: each key of ``ConsumerSettings`` either changes the
``Consume`` frame or is one of the options the client applies itself
(batching of settles). A new option that does neither fails this test.
"""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest

from broky.client.consumer_options import ConsumerSettings, consumer_options
from broky.client.durable import Start
from broky.protocol.constants import AdoptSetting

#: Options the client applies itself: they shape when settles are sent.
CLIENT_ONLY = {"ack_interval", "ack_batch"}

#: A value other than the default for every option.
NON_DEFAULT: dict[str, Any] = {
    "start": Start.earliest(),
    "credit": 7,
    "max_in_flight": 9,
    "ack_timeout": 1.5,
    "backoff": (0.1, 2.0),
    "max_deliveries": 3,
    "priority": 4,
    "dead_letter_topic": "poison",
    "ack_interval": 0.5,
    "ack_batch": 5,
}


def test_every_option_has_a_test_value() -> None:
    assert set(get_type_hints(ConsumerSettings)) == set(NON_DEFAULT)


@pytest.mark.parametrize("option", sorted(NON_DEFAULT))
def test_each_option_changes_the_consume_frame_or_is_the_clients(option: str) -> None:
    default = consumer_options("orders.>", "s", "shared", {}).consume(1)
    settings: ConsumerSettings = {option: NON_DEFAULT[option]}  # type: ignore[misc]
    changed = consumer_options("orders.>", "s", "shared", settings).consume(1)
    assert (changed != default) == (option not in CLIENT_ONLY)


def test_bad_values_are_refused_at_once_naming_the_option() -> None:
    for settings, name in (
        ({"priority": 2**31}, "priority"),
        ({"dead_letter_topic": "a\nb"}, "dead_letter_topic"),
    ):
        with pytest.raises(ValueError, match=name):
            consumer_options("orders.>", "s", "shared", settings)  # type: ignore[arg-type]


def test_redelivery_settings_not_passed_are_adopted_and_passed_ones_compared() -> None:
    """A default is not a choice: the client leaves an option its caller did
    not pass to an existing subscription, and has the broker compare one it
    did pass, even at the default value (broky.subscriptions.definition)."""
    every = AdoptSetting.ACK_TIMEOUT | AdoptSetting.MAX_DELIVERIES | AdoptSetting.BACKOFF
    assert consumer_options("orders.>", "s", "shared", {}).consume(1).adopt_settings == every
    chosen = consumer_options("orders.>", "s", "shared", {"ack_timeout": 30.0, "backoff": ()})
    assert chosen.consume(1).adopt_settings == AdoptSetting.MAX_DELIVERIES
