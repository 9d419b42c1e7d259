"""The key-shared slot of every message of a stored batch, from its columns
(``message_slots``): each message's sticky key (its ``key_partition``, else
its run's key) hashed to a slot; the compiled twin
(``broky.storage._partitions``) answers exactly as the pure version, on
well-formed batches and on corrupted messages (same slots, or the same error).
And the dispatcher side (``feed_slots``): consecutive offsets fed to one
consumer leave as one delivery event."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.protocol.message import encode_message, pack_sizes
from broky.storage.batch_reading import RecordBatch
from broky.subscriptions import slots
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.model import Deliver, Options, SubscriptionType
from broky.subscriptions.slots import message_slots_pure, slot_of
from broky.subscriptions.tracker import SubscriptionImage

#: A run: its key and its messages' ``key_partition`` (b"": none). Keys of
#: every length class XXH3 treats apart (0, 1-3, 4-8, 9-16, 17-128, 129-240,
#: longer): the compiled twin hashes them with xxHash's own header, the pure
#: version through the ``xxhash`` package.
_RUN = st.tuples(
    st.one_of(
        st.sampled_from([b"", b"orders.k1", b"orders.k2", b"x" * 40]), st.binary(max_size=300)
    ),
    st.lists(
        st.one_of(st.just(b""), st.binary(min_size=1, max_size=8), st.binary(max_size=300)),
        min_size=1,
        max_size=4,
    ),
)

Columns = tuple[list[int], list[int], bytes, bytearray, bytearray]


def _columns(runs: list[tuple[bytes, list[bytes]]]) -> Columns:
    """A batch's ``counts, key_lengths, keys, sizes, messages`` columns
    (changed in place by the tests that corrupt them)."""
    encoded = [
        encode_message(b"p", key_partition=sticky) for _, stickies in runs for sticky in stickies
    ]
    return (
        [len(stickies) for _, stickies in runs],
        [len(key) for key, _ in runs],
        b"".join(key for key, _ in runs),
        bytearray(pack_sizes([len(message) for message in encoded])),
        bytearray(b"".join(encoded)),
    )


def _answer(function: object, columns: Columns, base: int, start: int, stop: int) -> object:
    """The slots, or the type of the exception raised (both twins must agree)."""
    assert callable(function)
    counts, key_lengths, keys, sizes, messages = columns
    batch = RecordBatch(
        base,
        sum(counts),
        0,
        0,
        2,
        [0] * len(counts),
        counts,
        key_lengths,
        memoryview(keys),
        memoryview(bytes(sizes)),
        memoryview(bytes(messages)),
    )
    try:
        return function(batch, start, stop)
    except Exception as exc:  # any error: the pair must raise the same
        return type(exc).__name__


def test_the_compiled_twin_is_built() -> None:
    """``make`` builds it; a silent fallback would leave the slow path on."""
    if os.environ.get("BROKY_PURE") == "1":
        assert slots.message_slots_compiled is None
        assert slots.message_slots is message_slots_pure
        return
    assert slots.message_slots_compiled is not None, "broky.storage._partitions not built"


@given(
    runs=st.lists(_RUN, min_size=1, max_size=6),
    base=st.integers(0, 2**40),
    window=st.tuples(st.integers(-2, 26), st.integers(-2, 26)),
)
def test_each_message_gets_its_sticky_keys_slot(
    runs: list[tuple[bytes, list[bytes]]], base: int, window: tuple[int, int]
) -> None:
    columns = _columns(runs)
    start, stop = base + min(window), base + max(window)
    expected = [
        slot_of(sticky or key)
        for offset, (key, sticky) in enumerate(
            ((key, sticky) for key, stickies in runs for sticky in stickies), base
        )
        if start <= offset < stop
    ]
    assert _answer(message_slots_pure, columns, base, start, stop) == expected
    assert _answer(slots.message_slots, columns, base, start, stop) == expected


@given(
    runs=st.lists(_RUN, min_size=1, max_size=4),
    edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=6),
    size_edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=2),
    start=st.integers(0, 6),
)
def test_compiled_and_pure_agree_on_corrupted_messages(
    runs: list[tuple[bytes, list[bytes]]],
    edits: list[tuple[int, int]],
    size_edits: list[tuple[int, int]],
    start: int,
) -> None:
    compiled = slots.message_slots_compiled
    if compiled is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    columns = _columns(runs)
    _, _, _, sizes, messages = columns
    for position, value in edits:
        messages[position % len(messages)] = value
    for position, value in size_edits:
        sizes[position % len(sizes)] = value
    assert _answer(compiled, columns, 0, start, 30) == _answer(
        message_slots_pure, columns, 0, start, 30
    )


def test_consecutive_offsets_of_one_consumer_leave_as_one_delivery() -> None:
    dispatcher = Dispatcher(Options(type=SubscriptionType.KEY_SHARED), SubscriptionImage(0), 10)
    for consumer in (1, 2):
        dispatcher.attach(consumer, 0.0, credit=100, max_in_flight=100)
    dispatcher.committed(dispatcher.tracker.image(), 0.0)
    owners = dispatcher.table.owners
    first, second = owners.index(1), owners.index(2)
    dispatcher.feed_slots(0, [first, first, second, first, first, first], 0.0)
    assert dispatcher.events == [Deliver(1, 0, 1, 2), Deliver(2, 2, 1, 3), Deliver(1, 3, 1, 6)]
    assert sorted(dispatcher.tracker.pending) == list(range(6))
    assert dispatcher.consumers[1].in_flight == 5


def test_parked_offsets_released_by_a_grant_leave_as_one_delivery() -> None:
    """``pump``: messages parked while their consumer had no credit go out
    on its grant as one pending delivery, consecutive ones as one event,
    every slot's in offset order."""
    dispatcher = Dispatcher(Options(type=SubscriptionType.KEY_SHARED), SubscriptionImage(0), 10)
    dispatcher.attach(1, 0.0, credit=0, max_in_flight=100)
    dispatcher.committed(dispatcher.tracker.image(), 0.0)
    dispatcher.feed_slots(0, [7, 7, 9, 7, 9], 0.0)
    assert (dispatcher.events, dispatcher.parked) == ([], 5)
    dispatcher.grant(1, 100, 0.0)
    delivered = [e for e in dispatcher.events if isinstance(e, Deliver)]
    assert len(delivered) == len(dispatcher.events)
    assert sorted((e.offset, e.stop) for e in delivered) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert len(set(map(id, dispatcher.tracker.pending.values()))) == 1
    assert (dispatcher.parked, dispatcher.consumers[1].in_flight) == (0, 5)
