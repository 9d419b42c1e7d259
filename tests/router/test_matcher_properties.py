"""Property test: the subscription index agrees with a brute-force reference.

The reference is written from the rules in docs/protocol.md section 8, token
by token, without sharing code with the trie: ``*`` matches exactly one token,
a final ``>`` one or more, and a key starting with ``$SYS`` is matched only by
a pattern whose first token is not a wildcard.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.constants import ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.router.matcher import SubscriptionIndex, validate_key, validate_pattern

LITERALS = (b"a", b"b", b"c", b"$SYS")


def reference_tokens_match(pattern: list[bytes], key: list[bytes]) -> bool:
    if not pattern:
        return not key
    head = pattern[0]
    if head == b">":
        return len(key) >= 1
    if not key:
        return False
    if head not in (b"*", key[0]):
        return False
    return reference_tokens_match(pattern[1:], key[1:])


def reference_matches(pattern: bytes, key: bytes) -> bool:
    pattern_tokens = pattern.split(b".")
    if key.startswith(b"$SYS") and pattern_tokens[0] in (b"*", b">"):
        return False
    return reference_tokens_match(pattern_tokens, key.split(b"."))


def reference_match(registrations: Counter[tuple[bytes, int]], key: bytes) -> Counter[int]:
    found: Counter[int] = Counter()
    for (pattern, subscriber), times in registrations.items():
        if reference_matches(pattern, key):
            found[subscriber] += times
    return found


@st.composite
def patterns(draw: st.DrawFn) -> bytes:
    head = draw(st.lists(st.sampled_from((*LITERALS, b"*")), max_size=3))
    if draw(st.booleans()) or not head:
        head.append(b">")
    return b".".join(head)


keys = st.lists(st.sampled_from(LITERALS), min_size=1, max_size=4).map(b".".join)
operations = st.lists(
    st.tuples(st.sampled_from(("add", "remove")), patterns(), st.integers(0, 3)),
    min_size=1,
    max_size=25,
)


def test_reference_model_follows_the_documented_table() -> None:
    # Guard the guard: the reference itself must agree with docs/protocol.md.
    assert reference_matches(b"orders.*.created", b"orders.eu.created")
    assert not reference_matches(b"orders.*.created", b"orders.eu.x.created")
    assert reference_matches(b"orders.>", b"orders.eu.created")
    assert not reference_matches(b"orders.>", b"orders")
    assert reference_matches(b">", b"a.b")
    assert not reference_matches(b">", b"$SYS.broker.load")
    assert not reference_matches(b"*.broker.load", b"$SYS.broker.load")
    assert reference_matches(b"$SYS.>", b"$SYS.broker.load")
    assert not reference_matches(b"a.b", b"a.b.c")


@settings(max_examples=300, deadline=None)
@given(operations, st.lists(keys, min_size=1, max_size=10, unique=True))
def test_index_matches_reference_after_every_change(
    steps: list[tuple[str, bytes, int]], probe_keys: list[bytes]
) -> None:
    index: SubscriptionIndex[int] = SubscriptionIndex()
    model: Counter[tuple[bytes, int]] = Counter()
    for action, pattern, subscriber in steps:
        if action == "add":
            index.add(pattern, subscriber)
            model[pattern, subscriber] += 1
        else:
            index.remove(pattern, subscriber)
            if model[pattern, subscriber]:
                model[pattern, subscriber] -= 1
        model = +model  # drop zero counts

        assert len(index) == model.total()
        assert index.pattern_count == len({pattern for pattern, _ in model})

        fresh: SubscriptionIndex[int] = SubscriptionIndex()
        for (registered, who), times in model.items():
            for _ in range(times):
                fresh.add(registered, who)
        for key in probe_keys:
            expected = reference_match(model, key)
            first = index.match(key)  # may be served by a cache filled before the change
            assert Counter(first) == expected, (key, model)
            assert index.match(key) == first  # cached answer
            assert Counter(fresh.match(key)) == expected  # uncached answer

    for (pattern, subscriber), times in model.items():
        for _ in range(times):
            index.remove(pattern, subscriber)
    assert len(index) == 0
    assert index.pattern_count == 0
    assert not index._exact
    assert index._root.empty()  # every trie node pruned


# --- validation of arbitrary bytes ---------------------------------------------

#: Tokens of valid key text: any UTF-8 text without controls, whitespace, the
#: separator or a wildcard character (wildcards inside tokens are tested apart).
text_tokens = st.text(
    st.characters(exclude_categories=("Cc", "Cs"), exclude_characters=".*>"),
    min_size=1,
    max_size=8,
).filter(lambda token: not any(c.isspace() for c in token))


def validated(
    validate: Callable[[bytes], list[bytes]], value: bytes
) -> list[bytes] | RemoteProtocolError:
    """The tokens, or the error: any other exception escapes and fails the test."""
    try:
        return validate(value)
    except RemoteProtocolError as exc:
        return exc


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.text(max_size=20).map(str.encode)))
def test_any_bytes_validate_or_raise_our_error(value: bytes) -> None:
    for validate, code in (
        (validate_key, ErrorCode.INVALID_KEY),
        (validate_pattern, ErrorCode.INVALID_PATTERN),
    ):
        outcome = validated(validate, value)
        if isinstance(outcome, RemoteProtocolError):
            assert outcome.code is code
        else:
            assert b".".join(outcome) == value
            value.decode()  # whatever is accepted is UTF-8 text


@settings(max_examples=500, deadline=None)
@given(st.lists(text_tokens, min_size=1, max_size=6))
def test_valid_text_without_controls_is_always_accepted(tokens: list[str]) -> None:
    encoded = [token.encode() for token in tokens]
    key = b".".join(encoded)
    assert validate_key(key) == encoded
    assert validate_pattern(key) == encoded
    assert validate_pattern(key + b".>") == [*encoded, b">"]
    index: SubscriptionIndex[str] = SubscriptionIndex()
    index.add(b"*." + key, "s")
    assert index.match(b"x." + key) == ("s",)
