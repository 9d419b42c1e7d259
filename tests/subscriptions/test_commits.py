"""The subscription image codec and group commits on a real sqlite file."""

from __future__ import annotations

import contextlib
from pathlib import Path

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from broky.storage.errors import StorageError
from broky.storage.state import StateStore
from broky.subscriptions.acked_ranges import AckedRanges, RangePairs
from broky.subscriptions.commits import GroupCommitter, all_committed
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.image import (
    decode_image,
    encode_image,
    put_pairs_compiled,
    put_pairs_pure,
)
from broky.subscriptions.model import Deliver, Options, SubscriptionType
from broky.subscriptions.tracker import SubscriptionImage


@given(
    st.integers(0, 2**40),
    st.lists(st.integers(0, 500), max_size=60),
    st.dictionaries(st.integers(0, 600), st.integers(1, 50), max_size=20),
    st.integers(0, 10_000),
)
def test_image_round_trip(
    cursor: int, acked: list[int], counts: dict[int, int], lease: int
) -> None:
    ranges = AckedRanges(cursor)
    for offset in acked:
        ranges.add(cursor + offset)
    image = SubscriptionImage(
        ranges.cursor,
        ranges.ranges(),
        ranges.cursor + lease,
        tuple(sorted((ranges.cursor + o, c) for o, c in counts.items())),
    )
    assert decode_image(encode_image(image)) == image
    # A tracker's image holds the ranges' columns: the same bytes, and
    # equal to the image with the pairs (and to what is read back).
    columns = attrs.evolve(image, acked=ranges.columns())
    assert columns == image
    assert encode_image(columns) == encode_image(image)
    assert decode_image(encode_image(columns)) == columns


@given(st.lists(st.tuples(st.integers(0, 99), st.integers(0, 99)), max_size=12), st.data())
def test_range_columns_read_as_the_tuple_of_their_pairs(
    pairs: list[tuple[int, int]], data: st.DataObject
) -> None:
    """``RangePairs`` answers length, items, slices, iteration, equality
    and hash as the tuple of the same pairs does."""
    expected = tuple(pairs)
    columns = RangePairs([first for first, _ in pairs], [last for _, last in pairs])
    assert (len(columns), tuple(columns), hash(columns)) == (
        len(expected),
        expected,
        hash(expected),
    )
    assert columns == expected
    assert expected == columns
    if pairs:
        index = data.draw(st.integers(-len(pairs), len(pairs) - 1))
        assert columns[index] == expected[index]
    cut = data.draw(st.slices(len(pairs) + 1))
    assert columns[cut] == expected[cut]
    assert (columns == expected[:-1]) == (expected == expected[:-1])


@pytest.mark.skipif(put_pairs_compiled is None, reason="the compiled image writer is not built")
@given(
    st.integers(0, 2**40),
    st.lists(st.tuples(st.integers(-2, 300), st.integers(0, 300)), max_size=40),
    st.booleans(),
)
def test_put_pairs_twins_write_the_same_bytes(
    start: int, steps: list[tuple[int, int]], ranges: bool
) -> None:
    """Ranges or counts as an image holds them, with gaps and lengths both
    sides of one varint byte (0x80), and a step back (a negative value)."""
    pairs: list[tuple[int, int]] = []
    previous = start
    for gap, size in steps:
        first = previous + gap * 97
        pairs.append((first, first + size if ranges else size + 1))
        previous = first + size + 1 if ranges else first
    written: list[bytes | type[Exception]] = []
    assert put_pairs_compiled is not None
    columns = RangePairs([first for first, _ in pairs], [second for _, second in pairs])
    for put in (put_pairs_pure, put_pairs_compiled):
        # As a tuple of pairs, and as columns (a tracker's image).
        for given_pairs in (tuple(pairs), columns):
            out = bytearray(b"head")
            try:
                put(out, start, given_pairs, ranges)
            except ValueError as exc:
                written.append(type(exc))
            else:
                written.append(bytes(out))
    assert written.count(written[0]) == len(written)


@given(st.binary(max_size=40))
def test_any_bytes_decode_or_raise_storage_error(data: bytes) -> None:
    with contextlib.suppress(StorageError):
        decode_image(data)


async def test_receipts_wait_for_the_commit_and_survive_a_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    store = StateStore.open(path)
    committer = GroupCommitter(store, interval=0.001)
    dispatcher = Dispatcher(Options(type=SubscriptionType.SHARED), SubscriptionImage(0), 10)
    key = ("billing", "orders", 3)
    receipts: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        dispatcher.attach(1, 0.0, credit=100, max_in_flight=100)
        committer.changed(key, dispatcher)
        await trio.sleep(0.05)  # the first commit leases offsets
        for offset in range(dispatcher.wants()):
            dispatcher.feed(offset, 0, 0.0)
        delivered = [
            offset
            for e in dispatcher.events
            if isinstance(e, Deliver)
            for offset in range(e.offset, e.stop)
        ]
        assert delivered == list(range(10))
        dispatcher.ack(1, [0, 1, 2, 5], 0.0)
        committer.changed(key, dispatcher, acks=4)
        committer.after_commit(lambda: receipts.append(len(receipts)))
        assert receipts == []
        await trio.sleep(0.05)
        assert receipts == [0]
        nursery.cancel_scope.cancel()
    store.close()
    reopened = GroupCommitter(StateStore.open(path))
    image = reopened.load()[key]
    assert image.cursor == 3
    assert image.acked == ((5, 5),)
    restored = Dispatcher(Options(type=SubscriptionType.SHARED), image, 10)
    # Unacked offsets below the limit count as delivered once (count = recorded + 1).
    assert restored.tracker.count(3) == 1
    assert restored.tracker.count(5) == 0


@pytest.mark.parametrize("acks", [4096])
async def test_a_full_batch_commits_before_the_interval(tmp_path: Path, acks: int) -> None:
    store = StateStore.open(str(tmp_path / "state.db"))
    committer = GroupCommitter(store, interval=60.0, max_acks=acks)
    dispatcher = Dispatcher(Options(), SubscriptionImage(0))
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        committer.after_commit(done.set)
        committer.changed(("s", "t", 0), dispatcher, acks=acks)
        with trio.fail_after(5):
            await done.wait()
        nursery.cancel_scope.cancel()
    assert committer.commits == 1
    store.close()


async def test_a_forgotten_subscription_is_deleted_and_a_recreated_one_kept(
    tmp_path: Path,
) -> None:
    """``forget`` deletes the name's rows with the next round, before that
    round's writes: pending writes of the old one are dropped, a definition
    written after the forget (the name recreated) survives."""
    path = str(tmp_path / "state.db")
    store = StateStore.open(path)
    committer = GroupCommitter(store, interval=0.001)
    old = Dispatcher(Options(), SubscriptionImage(7, limit=7))
    other = Dispatcher(Options(), SubscriptionImage(3, limit=3))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        committer.define("gone", "{}")
        committer.define("kept", "{}")
        committer.changed(("gone", "orders", 0), old)
        committer.changed(("kept", "orders", 0), other)
        await all_committed([committer])
        committer.changed(("gone", "orders", 0), old)  # pending when forgotten: dropped
        committer.forget("gone")
        await all_committed([committer])
        assert set(committer.load()) == {("kept", "orders", 0)}
        assert set(committer.load_definitions()) == {"kept"}
        committer.forget("again")
        committer.define("again", '{"new": 1}')
        committer.changed(("again", "orders", 0), Dispatcher(Options(), SubscriptionImage(0)))
        await all_committed([committer])
        nursery.cancel_scope.cancel()
    assert set(committer.load()) == {("kept", "orders", 0), ("again", "orders", 0)}
    assert committer.load_definitions()["again"] == '{"new": 1}'
    store.close()


async def test_a_hurried_change_commits_without_waiting_out_the_interval(
    tmp_path: Path,
) -> None:
    """A nack's redelivery waits for the commit of its count: ``hurry``
    starts that commit at once, where a plain change waits the interval."""
    store = StateStore.open(str(tmp_path / "state.db"))
    # A wide interval: the hurried commit still needs a thread hand-off and
    # an sqlite commit, which took over 0.25 s once on a loaded machine.
    committer = GroupCommitter(store, interval=1.0)
    dispatcher = Dispatcher(Options(type=SubscriptionType.SHARED), SubscriptionImage(0), 10)
    key = ("billing", "orders", 3)

    async def commit_took(hurry: bool) -> float:
        done = trio.Event()
        start = trio.current_time()
        committer.changed(key, dispatcher, hurry=hurry)
        committer.after_commit(done.set)
        await done.wait()
        return trio.current_time() - start

    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        assert await commit_took(hurry=False) >= 0.95
        assert await commit_took(hurry=True) < 0.5
        nursery.cancel_scope.cancel()
    store.close()
