"""A durable topic's ``acks`` setting: parsed, checked, handed to workers."""

from __future__ import annotations

import pytest

from broky.durable.config import DurableConfigError, parse_policy, policy_table


def test_acks_defaults_to_all_and_round_trips() -> None:
    assert parse_policy({"pattern": "a.>"}, 0).acks == "all"
    policy = parse_policy({"pattern": "a.>", "acks": "leader"}, 0)
    assert policy.acks == "leader"
    assert parse_policy(policy_table(policy), 0) == policy


@pytest.mark.parametrize("value", ["one", "ALL", 1])
def test_a_wrong_acks_names_the_table_and_the_choices(value: object) -> None:
    with pytest.raises(DurableConfigError, match=r"durable\[3\]"):
        parse_policy({"pattern": "a.>", "acks": value}, 3)
