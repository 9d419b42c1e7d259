"""Unit tests for the subscription index: patterns, keys, bookkeeping, cache."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from broky.protocol.constants import MAX_KEY_BYTES, ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.router import matcher
from broky.router.matcher import (
    MATCH_CACHE_SIZE,
    SubscriptionIndex,
    validate_key,
    validate_pattern,
)

#: Keys and patterns whose tokens are fine but whose bytes are not key text:
#: not UTF-8 (a stray byte, a truncated or overlong sequence, an encoded
#: surrogate), or holding a control character or whitespace.
BAD_TEXT = [
    b"bad.\xff\xfe",
    b"k.\xff",
    b"k.\xc3",
    b"k.\xc0\xae",
    b"k.\xed\xa0\x80",
    b"with\x00nul",
    b"\x00",
    b"a.tab\there",
    b"a.line\n",
    b"a.\x1f",
    b"a.\x7f",
    b"a.\xc2\x85",  # U+0085 (NEL), a C1 control
    b"a b",
    b"a.\xc2\xa0",  # U+00A0, a no-break space
    b"a.\xe2\x80\xa8",  # U+2028, the line separator
    b"a.\xe3\x80\x80",  # U+3000, the ideographic space
]


def index_with(*registrations: tuple[bytes, str]) -> SubscriptionIndex[str]:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    for pattern, subscriber in registrations:
        index.add(pattern, subscriber)
    return index


def matches(pattern: bytes, key: bytes) -> bool:
    return index_with((pattern, "s")).match(key) == ("s",)


def index_is_empty(index: SubscriptionIndex[str]) -> bool:
    """No registration left anywhere, trie nodes included (white-box on purpose:
    pruning is invisible through ``match``, but leaked nodes are a memory leak)."""
    return not index._exact and index._root.empty() and len(index) == 0


# --- matching rules ------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        # exact
        (b"orders.eu.created", b"orders.eu.created", True),
        (b"orders.eu.created", b"orders.eu", False),
        (b"orders.eu", b"orders.eu.created", False),
        (b"orders", b"orders", True),
        (b"orders", b"order", False),
        (b"a.b", b"a.c", False),
        # `*`: exactly one token
        (b"orders.*.created", b"orders.eu.created", True),
        (b"orders.*.created", b"orders.eu.x.created", False),
        (b"orders.*.created", b"orders.created", False),
        (b"*", b"a", True),
        (b"*", b"a.b", False),
        (b"a.*", b"a", False),
        (b"a.*", b"a.b", True),
        (b"*.*", b"a.b", True),
        (b"*.*", b"a.b.c", False),
        # `>`: one or more trailing tokens
        (b"orders.>", b"orders.eu", True),
        (b"orders.>", b"orders.eu.created", True),
        (b"orders.>", b"orders", False),
        (b"a.>", b"a", False),
        (b"a.>", b"b.c", False),
        (b">", b"a", True),
        (b">", b"a.b.c.d", True),
        # mixes
        (b"*.b.>", b"a.b.c", True),
        (b"*.b.>", b"a.b", False),
        (b"*.b.>", b"a.c.d", False),
        (b"a.*.>", b"a.x.y.z", True),
        (b"a.*.>", b"a.x", False),
        (b"*.>", b"a.b", True),
        (b"*.>", b"a", False),
        (b"a.*.c", b"a.b.c", True),
        (b"a.*.c", b"a.b.d", False),
    ],
)
def test_pattern_matches_key(pattern: bytes, key: bytes, expected: bool) -> None:
    assert matches(pattern, key) is expected


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (b">", False),
        (b"*", False),
        (b"*.metrics", False),
        (b"*.>", False),
        (b"$SYS.>", True),
        (b"$SYS.*", True),
        (b"$SYS.metrics", True),
        (b"$SYS.*.>", False),  # needs at least three tokens
    ],
)
def test_system_keys_are_matched_only_by_system_patterns(pattern: bytes, expected: bool) -> None:
    assert matches(pattern, b"$SYS.metrics") is expected


def test_system_rule_only_guards_the_first_token() -> None:
    # Wildcards after a literal first token match system keys and ordinary
    # keys alike; ordinary keys that merely contain $SYS later are ordinary.
    assert matches(b"$SYS.*.load", b"$SYS.broker.load")
    assert matches(b">", b"a.$SYS")
    assert matches(b"*.$SYS", b"a.$SYS")
    assert not matches(b"$SYS.>", b"a.$SYS.b")


def test_match_returns_every_subscriber_of_every_matching_pattern() -> None:
    index = index_with(
        (b"a.b", "exact"),
        (b"a.b", "exact-twin"),
        (b"a.*", "star"),
        (b"a.>", "tail"),
        (b">", "all"),
        (b"*.c", "other"),
        (b"a.b.c", "longer"),
    )
    assert Counter(index.match(b"a.b")) == Counter(["exact", "exact-twin", "star", "tail", "all"])
    assert Counter(index.match(b"a.b.c")) == Counter(["tail", "all", "longer"])
    assert Counter(index.match(b"x.c")) == Counter(["all", "other"])
    assert index.match(b"$SYS.b") == ()


def test_one_subscriber_under_two_matching_patterns_is_returned_twice() -> None:
    # The router relies on this: each subscription gets its own copy.
    index = index_with((b"a.*", "s"), (b"a.>", "s"))
    assert index.match(b"a.b") == ("s", "s")


# --- validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    [
        b"",
        b".",
        b"a.",
        b".a",
        b"a..b",
        b">.a",
        b"a.>.b",
        b">.>",
        b"a*b",
        b"a*",
        b"*a",
        b"a.b>",
        b">a",
        b"a.**",
        b"a" * (MAX_KEY_BYTES + 1),
        b"a." * (MAX_KEY_BYTES // 2) + b">",
        *BAD_TEXT,
        b"bad.\xff\xfe.>",
        b"*.with\x00nul",
    ],
)
def test_invalid_patterns_are_rejected_with_invalid_pattern(pattern: bytes) -> None:
    with pytest.raises(RemoteProtocolError) as excinfo:
        validate_pattern(pattern)
    assert excinfo.value.code is ErrorCode.INVALID_PATTERN
    index: SubscriptionIndex[str] = SubscriptionIndex()
    with pytest.raises(RemoteProtocolError) as excinfo:
        index.add(pattern, "s")
    assert excinfo.value.code is ErrorCode.INVALID_PATTERN
    assert index_is_empty(index)
    assert index.pattern_count == 0
    assert index.generation == 0


@pytest.mark.parametrize(
    ("pattern", "tokens"),
    [
        (b"a", [b"a"]),
        (b"a.*.>", [b"a", b"*", b">"]),
        (b">", [b">"]),
        (b"$SYS.>", [b"$SYS", b">"]),
        (b"a" * MAX_KEY_BYTES, [b"a" * MAX_KEY_BYTES]),
        ("caf\u00e9.*".encode(), ["caf\u00e9".encode(), b"*"]),
    ],
)
def test_valid_patterns_split_into_tokens(pattern: bytes, tokens: list[bytes]) -> None:
    assert validate_pattern(pattern) == tokens


@pytest.mark.parametrize(
    "key",
    [
        b"",
        b".",
        b"a.",
        b".a",
        b"orders..x",
        b"*",
        b">",
        b"orders.*",
        b"orders.>",
        b"*.a",
        b"a" * (MAX_KEY_BYTES + 1),
        *BAD_TEXT,
    ],
)
def test_invalid_keys_are_rejected_with_invalid_key(key: bytes) -> None:
    with pytest.raises(RemoteProtocolError) as excinfo:
        validate_key(key)
    assert excinfo.value.code is ErrorCode.INVALID_KEY
    index = index_with((b">", "all"), (b"*", "one"))
    with pytest.raises(RemoteProtocolError) as excinfo:
        index.match(key)
    assert excinfo.value.code is ErrorCode.INVALID_KEY
    assert index.cache_size == 0


@pytest.mark.parametrize(
    ("key", "tokens"),
    [
        (b"a", [b"a"]),
        (b"orders.eu.created", [b"orders", b"eu", b"created"]),
        (b"a*b.c>", [b"a*b", b"c>"]),  # wildcard characters inside a token are plain text
        (b"a" * MAX_KEY_BYTES, [b"a" * MAX_KEY_BYTES]),
        # UTF-8 text is fine, including U+FFFD and format characters (ZWJ in an emoji)
        ("caf\u00e9.\ufffd".encode(), ["caf\u00e9".encode(), "\ufffd".encode()]),
        ("\U0001f469\u200d\U0001f4bb".encode(), ["\U0001f469\u200d\U0001f4bb".encode()]),
    ],
)
def test_valid_keys_split_into_tokens(key: bytes, tokens: list[bytes]) -> None:
    assert validate_key(key) == tokens


# --- add / remove bookkeeping --------------------------------------------------


def test_len_and_pattern_count_track_registrations() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    assert (len(index), index.pattern_count) == (0, 0)
    index.add(b"a.b", "s1")
    index.add(b"a.b", "s2")
    index.add(b"a.>", "s1")
    assert (len(index), index.pattern_count) == (3, 2)
    index.remove(b"a.b", "s1")
    assert (len(index), index.pattern_count) == (2, 2)
    assert index.match(b"a.b") == ("s2", "s1")
    index.remove(b"a.b", "s2")
    assert (len(index), index.pattern_count) == (1, 1)
    assert index.match(b"a.b") == ("s1",)


@pytest.mark.parametrize("pattern", [b"a.b", b"a.*", b"a.>", b"*", b">"])
def test_removing_unknown_registrations_is_a_no_op(pattern: bytes) -> None:
    index = index_with((pattern, "known"))
    generation = index.generation
    index.remove(pattern, "stranger")  # known pattern, unknown subscriber
    index.remove(b"z.z", "known")  # unknown pattern
    index.remove(b"a..b", "known")  # not even a valid pattern
    assert (len(index), index.pattern_count) == (1, 1)
    assert index.generation == generation
    index.remove(pattern, "known")
    index.remove(pattern, "known")  # twice: the second is unknown
    assert index_is_empty(index)
    assert index.pattern_count == 0


def test_removing_wildcard_under_a_different_pattern_shape_is_a_no_op() -> None:
    # Same subscriber, registered under a.*.c: removal via similar patterns
    # that share a trie prefix must not touch it.
    index = index_with((b"a.*.c", "s"))
    for other in (b"a.*", b"a.*.>", b"a.*.c.d", b"a.b.c", b"*.*.c"):
        index.remove(other, "s")
    assert index.match(b"a.b.c") == ("s",)
    assert len(index) == 1


def test_removing_everything_prunes_the_trie() -> None:
    patterns = [
        b"a",
        b"a.b",
        b"a.*",
        b"a.>",
        b"*",
        b">",
        b"*.b.*",
        b"a.*.c.>",
        b"*.*.*.*",
        b"$SYS.>",
    ]
    index: SubscriptionIndex[str] = SubscriptionIndex()
    for number, pattern in enumerate(patterns):
        index.add(pattern, f"s{number}")
        index.add(pattern, "shared")
    assert len(index) == 2 * len(patterns)
    assert index.pattern_count == len(patterns)
    for number, pattern in enumerate(reversed(patterns)):
        index.remove(pattern, f"s{len(patterns) - 1 - number}")
        index.remove(pattern, "shared")
    assert index_is_empty(index)
    assert index.pattern_count == 0
    assert index.match(b"a.b") == ()


def test_removing_a_deep_pattern_keeps_its_siblings() -> None:
    index = index_with((b"a.b.c", "deep"), (b"a.*.c", "star"), (b"a.b.>", "tail"))
    index.remove(b"a.*.c", "star")
    assert Counter(index.match(b"a.b.c")) == Counter(["deep", "tail"])
    index.remove(b"a.b.>", "tail")
    assert index.match(b"a.b.c") == ("deep",)
    index.remove(b"a.b.c", "deep")
    assert index_is_empty(index)


# --- match cache ---------------------------------------------------------------


def test_match_results_are_cached() -> None:
    index = index_with((b"a.*", "s"))
    first = index.match(b"a.b")
    assert index.cache_size == 1
    assert index.match(b"a.b") is first
    index.match(b"a.c")
    index.match(b"x")  # an empty answer is cached too
    assert index.cache_size == 3


@pytest.mark.parametrize(
    "change",
    [
        lambda index: index.add(b"a.>", "new"),
        lambda index: index.add(b"a.b", "new"),
        lambda index: index.remove(b"a.*", "old"),
    ],
)
def test_changes_invalidate_the_cache(change: Callable[[SubscriptionIndex[str]], None]) -> None:
    index = index_with((b"a.*", "old"))
    assert index.match(b"a.b") == ("old",)
    generation = index.generation
    change(index)
    assert index.generation == generation + 1
    assert index.cache_size == 0
    expected = Counter(["old", "new"]) if len(index) == 2 else Counter()
    assert Counter(index.match(b"a.b")) == expected


def test_cache_is_bounded() -> None:
    index = index_with((b">", "all"))
    for number in range(MATCH_CACHE_SIZE + 10):
        assert index.match(b"k.%d" % number) == ("all",)
        assert index.cache_size <= MATCH_CACHE_SIZE
    # The newest key is cached after the reset; stale entries never answer.
    assert index.match(b"k.%d" % (MATCH_CACHE_SIZE + 9)) == ("all",)
    assert 0 < index.cache_size <= MATCH_CACHE_SIZE


def test_cache_bound_is_read_at_match_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matcher, "MATCH_CACHE_SIZE", 4)
    index = index_with((b"a.*", "s"))
    sizes = []
    for number in range(10):
        index.match(b"a.%d" % number)
        sizes.append(index.cache_size)
    assert max(sizes) == 4
    assert index.match(b"a.9") == ("s",)
