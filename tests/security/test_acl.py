"""Pattern relations and permissions, checked against the router's own matcher.

The oracle is exhaustive: every key of 1..4 tokens over ``a``, ``b``, ``c``
and ``$SYS`` (340 keys) is offered to the router's SubscriptionIndex, and the
set of keys a pattern matches there is the truth. Patterns use only ``a``,
``b``, ``$SYS``, ``*`` and ``>`` (1..3 tokens), so ``c`` stands for every
token a pattern does not name: a wildcard is never a finite union of the
literals, and ``covers`` cannot pass by enumerating them. Keys are one token
longer than patterns, so a trailing ``>`` always has a key that tells it
from ``*``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.router.matcher import SubscriptionIndex, validate_pattern
from broky.security.acl import (
    PUBLISH_CACHE_SIZE,
    Permissions,
    PublishGate,
    covers,
    intersects,
    matches,
)

PATTERN_TOKENS: Final = (b"a", b"b", b"$SYS", b"*", b">")
KEY_TOKENS: Final = (b"a", b"b", b"c", b"$SYS")
ALL_KEYS: Final = tuple(
    b".".join(tokens)
    for length in range(1, 5)
    for tokens in itertools.product(KEY_TOKENS, repeat=length)
)
ALL_PATTERNS: Final = tuple(
    b".".join(tokens)
    for length in range(1, 4)
    for tokens in itertools.product(PATTERN_TOKENS, repeat=length)
    if b">" not in tokens[:-1]
)


@functools.cache
def matched_keys(pattern: bytes) -> frozenset[bytes]:
    """The enumerated keys the router delivers to a subscription on ``pattern``."""
    index: SubscriptionIndex[bytes] = SubscriptionIndex()
    index.add(pattern, pattern)
    return frozenset(key for key in ALL_KEYS if index.match(key))


patterns = (
    st.lists(st.sampled_from(PATTERN_TOKENS), min_size=1, max_size=3)
    .filter(lambda tokens: b">" not in tokens[:-1])
    .map(b".".join)
)


def test_the_enumeration_is_what_the_module_docstring_says() -> None:
    assert len(ALL_KEYS) == 4 + 16 + 64 + 256
    assert len(ALL_PATTERNS) == 5 + 4 * 5 + 4 * 4 * 5
    for pattern in ALL_PATTERNS:
        validate_pattern(pattern)
        # Every pattern matches some enumerated key, so "no key" never
        # makes covers or intersects true for free.
        assert matched_keys(pattern), pattern


def check_matches(pattern: bytes) -> None:
    expected = matched_keys(pattern)
    for key in ALL_KEYS:
        assert matches(pattern, key) == (key in expected), (pattern, key)


def check_covers(outer: bytes, inner: bytes) -> None:
    expected = matched_keys(inner) <= matched_keys(outer)
    assert covers(outer, inner) == expected, (outer, inner)


def check_intersects(first: bytes, second: bytes) -> None:
    expected = not matched_keys(first).isdisjoint(matched_keys(second))
    assert intersects(first, second) == expected, (first, second)
    assert intersects(second, first) == expected, (second, first)


@given(patterns)
def test_matches_agrees_with_the_router(pattern: bytes) -> None:
    check_matches(pattern)


@given(patterns, patterns)
def test_covers_means_every_key_of_inner_is_matched_by_outer(outer: bytes, inner: bytes) -> None:
    check_covers(outer, inner)


@given(patterns, patterns)
def test_intersects_means_some_key_matches_both(first: bytes, second: bytes) -> None:
    check_intersects(first, second)


@given(patterns, patterns, patterns)
def test_covers_is_reflexive_and_transitive(first: bytes, second: bytes, third: bytes) -> None:
    assert covers(first, first)
    if covers(first, second) and covers(second, third):
        assert covers(first, third), (first, second, third)
    if covers(first, second):
        # Every pattern matches some key, so a covered pattern overlaps its cover.
        assert intersects(first, second), (first, second)


def test_matches_agrees_on_every_small_pattern() -> None:
    for pattern in ALL_PATTERNS:
        check_matches(pattern)


@pytest.mark.parametrize("check", [check_covers, check_intersects])
def test_relations_hold_on_every_small_pair(check: Callable[[bytes, bytes], None]) -> None:
    """The whole space (11025 pairs), for what sampling might miss."""
    for first, second in itertools.product(ALL_PATTERNS, repeat=2):
        check(first, second)


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        (b">", b"$SYS.metrics", False),
        (b"*.metrics", b"$SYS.metrics", False),
        (b"$SYS.>", b"$SYS.metrics", True),
        (b"$SYS.*", b"$SYS.metrics", True),
        (b"a.>", b"a.$SYS", True),  # only a leading wildcard skips $SYS
        (b">", b"$SYSTEM.x", False),  # the router's rule is a byte prefix
    ],
)
def test_system_keys_need_a_literal_first_token(pattern: bytes, key: bytes, expected: bool) -> None:
    index: SubscriptionIndex[bytes] = SubscriptionIndex()
    index.add(pattern, pattern)
    assert bool(index.match(key)) == expected
    assert matches(pattern, key) == expected


def test_publish_deny_wins_over_allow() -> None:
    permissions = Permissions(publish=(b"orders.>",), publish_deny=(b"orders.secret.*",))
    assert permissions.may_publish(b"orders.new")
    assert permissions.may_publish(b"orders.secret.a.b")  # deny is one token deep
    assert not permissions.may_publish(b"orders.secret.a")
    assert not permissions.may_publish(b"payments.new")  # allowed by nothing
    same = Permissions(publish=(b"a",), publish_deny=(b"a",))
    assert not same.may_publish(b"a")


def test_subscribing_across_a_deny_is_refused_naming_it() -> None:
    permissions = Permissions(subscribe=(b">",), subscribe_deny=(b"secret.>",))
    for apart in (b"public.>", b"*", b"secret"):  # no key both match
        assert permissions.subscribe_refusal(apart) is None
    for overlapping in (b">", b"*.x", b"*.*.y", b"secret.x"):
        refusal = permissions.subscribe_refusal(overlapping)
        assert refusal is not None
        assert "denied" in refusal
        assert "'secret.>'" in refusal
        assert repr(overlapping.decode()) in refusal


def test_subscribing_beyond_the_allow_list_is_refused() -> None:
    permissions = Permissions(subscribe=(b"orders.>", b"payments.*.done"))
    assert permissions.subscribe_refusal(b"orders.*") is None
    assert permissions.subscribe_refusal(b"payments.eu.done") is None
    for wider in (b"orders", b"payments.*.*", b">", b"*.eu.done"):
        refusal = permissions.subscribe_refusal(wider)
        assert refusal is not None
        assert "not allowed" in refusal
    assert Permissions(subscribe=()).subscribe_refusal(b"a") is not None


def test_catch_all_grants_nothing_under_system() -> None:
    default = Permissions()
    assert default.may_publish(b"orders.new")
    assert not default.may_publish(b"$SYS.metrics")
    assert default.subscribe_refusal(b"orders.>") is None
    assert default.subscribe_refusal(b"$SYS.>") is not None
    assert default.subscribe_refusal(b"$SYS.metrics") is not None

    system = Permissions(publish=(b">", b"$SYS.>"), subscribe=(b">", b"$SYS.>"))
    assert system.may_publish(b"$SYS.metrics")
    assert system.subscribe_refusal(b"$SYS.>") is None
    assert system.subscribe_refusal(b"$SYS.events.*") is None
    assert system.subscribe_refusal(b">") is None


def test_publish_gate_remembers_and_stays_right_after_clearing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks: list[bytes] = []
    may_publish = Permissions.may_publish

    def counting(self: Permissions, key: bytes) -> bool:
        checks.append(key)
        return may_publish(self, key)

    monkeypatch.setattr(Permissions, "may_publish", counting)
    gate = PublishGate(Permissions(publish=(b"orders.>",), publish_deny=(b"orders.secret",)))
    for _ in range(3):
        assert gate.allows(b"orders.new")
        assert not gate.allows(b"orders.secret")
    assert checks == [b"orders.new", b"orders.secret"]

    # Enough other keys to fill the cache: it is cleared, not grown.
    flood = [f"orders.n{number}".encode() for number in range(PUBLISH_CACHE_SIZE)]
    assert all(gate.allows(key) for key in flood)
    checks.clear()
    assert gate.allows(b"orders.new")
    assert not gate.allows(b"orders.secret")
    assert not gate.allows(b"payments.new")
    assert checks == [b"orders.new", b"orders.secret", b"payments.new"]
