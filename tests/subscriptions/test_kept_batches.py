"""Batches a partition's subscription rounds keep for their next rounds.

A key-shared message parked for a consumer out of credit is delivered from
the batch its round read, kept (``PartitionSubscriptions._kept``), not read
again; a cut of the log's tail (a replica truncating to a new leader's
epoch) drops what was kept, so no delivery carries bytes the log no longer
holds. The round runs against a real log behind a stand-in owner and
service (no sockets, no threads).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
from hypothesis import given
from hypothesis import strategies as st

from broky.protocol.codec import decode_frame
from broky.protocol.constants import SubscriptionKind
from broky.protocol.frames import Deliver, Run
from broky.protocol.message import decode_run, encode_message, pack_sizes
from broky.storage.batch_reading import BatchSpan
from broky.storage.log import PartitionLog
from broky.storage.state import StateStore
from broky.subscriptions.consumers import SubscriptionCounters
from broky.subscriptions.definition import Definition
from broky.subscriptions.delivery import BatchCache
from broky.subscriptions.model import Options, SubscriptionType
from broky.subscriptions.partition import PartitionSubscriptions
from broky.subscriptions.round_reads import KEEP_BYTES, KeptBudget
from broky.subscriptions.tracker import SubscriptionImage
from tests.subscriptions.test_delivery import span

KEYS = 12


@attrs.define
class _Topic:
    name: str = "orders"
    pattern: bytes = b"orders.>"


class _Owner:
    """The partition's owner: runs each request on the log at once, then
    copies what the trio side reads of the log (as ``PartitionOwner.refresh``)."""

    def __init__(self, partition_log: PartitionLog) -> None:
        self.log = partition_log
        self.topic = _Topic()
        self.partition = 0
        self.refresh()

    def refresh(self) -> None:
        self.rewrites = self.log.rewrites
        self.end_offset = self.readable_end = self.log.end_offset

    async def call(self, request: Any) -> Any:
        await trio.lowlevel.checkpoint()
        result = request(self.log)
        self.refresh()
        return result


@attrs.define
class _Link:
    """A consumer's connection: keeps the payloads delivered to it."""

    stream: int
    max_frame_bytes: int = 1 << 20
    named_topic: str | None = None
    payloads: dict[int, bytes] = attrs.field(factory=dict)

    def send(self, frames: Sequence[bytes]) -> None:
        for data in frames:
            frame = decode_frame(data[4:])
            if isinstance(frame, Deliver):
                for run in frame.runs:
                    for message in decode_run(run):
                        self.payloads[message.offset] = bytes(message.payload)


class _Service:
    def __init__(self) -> None:
        self.consumers: dict[int, _Link] = {}
        self.totals = SubscriptionCounters()
        self.kept = KeptBudget()

    def counters(self, name: str) -> SubscriptionCounters:
        return self.totals


def _append(partition_log: PartitionLog, tag: bytes) -> None:
    """One message per key, each its own run: ``tag`` + its number."""
    runs = []
    for number in range(KEYS):
        message = encode_message(tag + b"%d" % number)
        runs.append(Run(b"orders.k%d" % number, 7, 1, pack_sizes([len(message)]), message))
    partition_log.append(runs)


def _setup(tmp_path: Path) -> tuple[PartitionLog, _Service, PartitionSubscriptions]:
    partition_log = PartitionLog.open(str(tmp_path / "log"))
    _append(partition_log, b"old")
    service = _Service()
    store = StateStore.open(str(tmp_path / "state.sqlite"))
    partition = PartitionSubscriptions(service, _Owner(partition_log), store)  # type: ignore[arg-type]
    options = Options(type=SubscriptionType.KEY_SHARED)
    definition = Definition("work", b"orders.>", SubscriptionKind.KEY_SHARED, options)
    dispatcher = partition.add(definition, SubscriptionImage(0))
    # The lease its first read takes, committed: deliveries may go.
    dispatcher.tracker.want_lease()
    dispatcher.committed(dispatcher.tracker.image(), 0.0)
    for consumer, credit in ((1, 100), (2, 0)):
        service.consumers[consumer] = _Link(consumer)
        dispatcher.attach(consumer, 0.0, credit=credit, max_in_flight=100)
    return partition_log, service, partition


async def _parked_then_granted(tmp_path: Path, cut: bool) -> tuple[dict[int, bytes], int]:
    """Consumer 2 has no credit: its keys' messages park in the first
    round; ``cut``: the log's tail is then replaced; consumer 2 gets credit
    and a second round delivers what was parked. Its payloads, and how
    many messages parked."""
    partition_log, service, partition = _setup(tmp_path)
    dispatcher = partition.dispatchers["work"]
    await partition._round()
    parked = dispatcher.parked
    if cut:
        # A replica's cut to a new leader's log, which then wrote anew.
        partition_log.truncate(0)
        _append(partition_log, b"new")
        owner: _Owner = partition.owner  # type: ignore[assignment]
        owner.refresh()
    dispatcher.grant(2, 100, 0.0)
    await partition._round()
    return service.consumers[2].payloads, parked


def test_a_parked_message_is_delivered_from_the_batch_kept(tmp_path: Path) -> None:
    payloads, parked = trio.run(_parked_then_granted, tmp_path, False)
    assert parked
    assert len(payloads) == parked
    assert all(payload == b"old%d" % offset for offset, payload in payloads.items())


def test_no_parked_message_is_read_again(tmp_path: Path) -> None:
    """The second round delivers the parked messages without a log read."""
    assert trio.run(_reads_for_parked, tmp_path, None) == 0


def test_past_the_workers_budget_parked_messages_are_read_again(tmp_path: Path) -> None:
    """With the worker's kept-batch budget taken by other partitions, the
    round keeps nothing, and the parked messages are read from the log
    when delivered (what they cost before batches were kept)."""
    assert trio.run(_reads_for_parked, tmp_path, 0) > 0


async def _reads_for_parked(tmp_path: Path, budget: int | None) -> int:
    """Log reads of the round that delivers what the first one parked;
    ``budget``: the service's kept-batch total (None: the default)."""
    _, service, partition = _setup(tmp_path)
    if budget is not None:
        service.kept = KeptBudget(budget)
    await partition._round()
    owner = partition.owner
    calls = 0
    call = owner.call

    async def counted(request: Any) -> Any:
        nonlocal calls
        calls += 1
        return await call(request)

    owner.call = counted  # type: ignore[method-assign]
    partition.dispatchers["work"].grant(2, 100, 0.0)
    await partition._round()
    assert all(payload == b"old%d" % o for o, payload in service.consumers[2].payloads.items())
    assert service.consumers[2].payloads
    return calls


def test_a_cut_of_the_log_drops_the_kept_batches(tmp_path: Path) -> None:
    """After the tail was cut and written again, the parked offsets carry
    the log's new bytes, not the kept ones."""
    payloads, parked = trio.run(_parked_then_granted, tmp_path, True)
    assert parked
    assert len(payloads) == parked
    assert all(payload == b"new%d" % offset for offset, payload in payloads.items())


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=12))
def test_overlapping_spans_are_held_once_sorted_and_disjoint(
    cuts: list[tuple[int, int]],
) -> None:
    """Spans of one batch added in any overlapping slices (kept batches
    meeting a new read) hold every offset once, from the batch."""
    whole = span(100, [3, 1, 4, 2, 5, 1, 9, 2, 6])
    cache = BatchCache()
    covered: set[int] = set()
    for first, length in cuts:
        start = whole.start + first
        stop = min(whole.stop, start + length)
        if start < stop:
            cache.add([BatchSpan(whole.batch, start, stop)])
            covered.update(range(start, stop))
    pieces = list(cache.cover(whole.start, whole.stop))
    held = [offset for piece, a, b in pieces if piece is not None for offset in range(a, b)]
    assert held == sorted(covered)
    starts = cache._bases
    assert starts == sorted(starts)
    assert all(stop <= start for stop, start in zip(cache._stops, starts[1:], strict=False))
    assert cache.missing([(whole.start, whole.stop)]) == _gaps(covered, whole.start, whole.stop)


def _gaps(covered: set[int], first: int, stop: int) -> list[tuple[int, int]]:
    gaps: list[tuple[int, int]] = []
    for offset in range(first, stop):
        if offset in covered:
            continue
        if gaps and gaps[-1][1] == offset:
            gaps[-1] = (gaps[-1][0], offset + 1)
        else:
            gaps.append((offset, offset + 1))
    return gaps


def test_keep_from_drops_what_is_below_the_floor_then_the_lowest() -> None:
    spans = [span(base, [5]) for base in (0, 5, 10, 15)]
    cache = BatchCache()
    cache.add(spans)
    cache.keep_from(7, 1 << 30)
    assert cache._bases == [5, 10, 15]
    cache.keep_from(7, 2 * spans[0].batch.stored_bytes)
    assert cache._bases == [10, 15]
    cache.keep_from(None, 1 << 30)
    assert cache._bases == []


@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(1, 8)), max_size=6),
    st.lists(st.tuples(st.integers(0, 60), st.integers(1, 4)), max_size=30),
)
def test_missing_is_what_no_held_span_covers(
    held: list[tuple[int, int]], needed: list[tuple[int, int]]
) -> None:
    """``missing`` (its skip of spans inside the held one found last
    included) against the offsets' own set difference."""
    whole = span(0, [1] * 50)
    cache = BatchCache()
    covered: set[int] = set()
    for first, length in held:
        stop = min(50, first + length)
        if first < stop:
            cache.add([BatchSpan(whole.batch, first, stop)])
            covered.update(range(first, stop))
    wanted = {o for first, length in needed for o in range(first, first + length)}
    got = cache.missing([(first, first + length) for first, length in needed])
    assert {o for a, b in got for o in range(a, b)} == wanted - covered


def test_the_budget_bounds_the_workers_total_and_counts_a_partitions_own_share() -> None:
    budget = KeptBudget(3 * KEEP_BYTES // 2)
    first, second = ("orders", 0), ("orders", 1)
    assert budget.allowance(first) == KEEP_BYTES
    budget.hold(first, KEEP_BYTES)
    assert budget.allowance(second) == KEEP_BYTES // 2
    assert budget.allowance(first) == KEEP_BYTES  # its own bytes count as free
    budget.hold(second, KEEP_BYTES // 2)
    assert budget.allowance(second) == KEEP_BYTES // 2
    budget.hold(first, 0)
    assert budget.used == KEEP_BYTES // 2
    assert budget.allowance(second) == KEEP_BYTES


def test_an_append_wakes_the_task_only_where_a_subscription_reads(tmp_path: Path) -> None:
    """A partition without subscriptions runs no round per append; one
    with a subscription is woken and its dispatcher learns the new end."""
    _, _, partition = _setup(tmp_path)
    dispatcher = partition.dispatchers["work"]
    partition.appended(500)
    assert partition._wake.is_set()
    assert dispatcher.end_offset == 500
    partition.remove("work")
    partition._wake = trio.Event()
    partition.appended(600)
    assert not partition._wake.is_set()
