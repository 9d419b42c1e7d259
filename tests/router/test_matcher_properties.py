"""Property test: the subscription index agrees with a brute-force reference.

The reference is written from the rules in docs/protocol.md section 8, token
by token, without sharing code with the trie: ``*`` matches exactly one token,
a final ``>`` one or more, and a key starting with ``$SYS`` is matched only by
a pattern whose first token is not a wildcard.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from broky.router.matcher import SubscriptionIndex

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
