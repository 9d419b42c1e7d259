"""PartitionReplica: what a partition's leader or follower lets through, without I/O."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import trio
import trio.testing

from broky.cluster.epochs import EpochHistory
from broky.cluster.isr import IsrSettings, LeaderIsr
from broky.cluster.leadership import Term
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Run
from broky.replication.gate import FETCH_WAIT, WATERMARK_LINGER, PartitionReplica, fetch_all
from broky.replication.wire import Fetch, Fetched, RefusalReason, Refused, StateUpdate
from tests.storage.runs import make_run


@attrs.define
class _Topic:
    name: str = "orders"
    acks: str = "all"


@attrs.define
class _Log:
    def read(self, offset: int, max_bytes: int) -> list[object]:
        return []


@attrs.define
class _Owner:
    """The part of a PartitionOwner the gate uses."""

    topic: _Topic = attrs.field(factory=_Topic)
    partition: int = 0
    start_offset: int = 0
    end_offset: int = 0

    async def call(self, request: Callable[[Any], Any]) -> Any:
        return request(_Log())


class _Outcomes:
    def __init__(self) -> None:
        self.delivered = 0
        self.failed: list[ErrorCode] = []

    def deliver(self) -> None:
        self.delivered += 1

    def fail(self, code: ErrorCode, reason: str) -> None:
        self.failed.append(code)


def _leading(
    isr: tuple[tuple[str, int], ...] = (("n1", 1), ("n2", 2)), acks: str = "all"
) -> tuple[PartitionReplica, _Owner]:
    owner = _Owner(_Topic(acks=acks))
    replica = PartitionReplica(owner, "n1", EpochHistory([(3, 0)]), 3)  # type: ignore[arg-type]
    leader = LeaderIsr(("n1", 1), 3, ("n1", "n2", "n3"), isr, 0, 0, 0.0, IsrSettings(min_insync=2))
    replica.lead(Term(0, 3, "n1", 1), leader, "leader n1 at 127.0.0.1:1 (epoch 3)")
    return replica, owner


def _run(count: int) -> Run:
    return make_run(b"orders.k", [b"m%d" % i for i in range(count)])


def _fetch(durable: int, epoch: int = 3) -> Fetch:
    return Fetch("orders", 0, epoch, "n2", 2, durable, durable)


def test_a_follower_refuses_publishes_naming_the_leader() -> None:
    replica = PartitionReplica(_Owner(), "n2", EpochHistory(), 0)  # type: ignore[arg-type]
    replica.leader_hint = "leader n1 at 127.0.0.1:7722 (epoch 3)"
    refusal = replica.refusal()
    assert refusal is not None
    assert refusal[0] is ErrorCode.NOT_LEADER
    assert refusal[1].endswith("leader n1 at 127.0.0.1:7722 (epoch 3)")


def test_a_node_named_leader_but_still_taking_over_says_so() -> None:
    """Elected in etcd, not leading yet (truncating, reloading state): the
    refusal says it is taking over, not that the leader is itself; once it
    leads, it serves; a node that steps down names the new leader."""
    replica = PartitionReplica(_Owner(), "n2", EpochHistory([(3, 0)]), 3)  # type: ignore[arg-type]
    replica.leader_hint = "leader n2 at 127.0.0.1:7723 (epoch 4)"
    refusal = replica.refusal()
    assert refusal == (
        ErrorCode.NOT_LEADER,
        "n2 is taking over the lead of orders/0 (leader n2 at 127.0.0.1:7723 (epoch 4)); "
        "retry shortly",
    )
    # A hint naming another node whose id starts with ours is not ours.
    replica.leader_hint = "leader n20 at 127.0.0.1:7724 (epoch 4)"
    assert replica.not_leading() == (
        "n2 does not lead orders/0; leader n20 at 127.0.0.1:7724 (epoch 4)"
    )
    leader = LeaderIsr(("n2", 1), 4, ("n2",), (("n2", 1),), 0, 0, 0.0, IsrSettings(min_insync=1))
    replica.lead(Term(0, 4, "n2", 1), leader, "leader n2 at 127.0.0.1:7723 (epoch 4)")
    assert replica.refusal() is None
    replica.step_down("leader n1 at 127.0.0.1:7722 (epoch 5)")
    assert replica.not_leading() == (
        "n2 does not lead orders/0; leader n1 at 127.0.0.1:7722 (epoch 5)"
    )


def test_too_small_an_isr_refuses_before_storing() -> None:
    replica, _ = _leading(isr=(("n1", 1),))
    refusal = replica.refusal()
    assert refusal is not None
    assert refusal[0] is ErrorCode.NOT_ENOUGH_REPLICAS


async def test_a_round_is_acked_once_the_follower_fetched_past_it() -> None:
    replica, owner = _leading()
    outcomes = _Outcomes()
    owner.end_offset = 5
    replica.hold(0, [_run(5)], [7], outcomes.deliver, outcomes.fail)
    assert outcomes.delivered == 0
    assert replica.high_watermark == 0
    answer = await replica.fetch(_fetch(durable=3))
    assert isinstance(answer, Fetched)
    assert outcomes.delivered == 0
    with trio.move_on_after(1):
        answer = await replica.fetch(_fetch(durable=5))
    assert outcomes.delivered == 1
    assert replica.high_watermark == 5
    assert isinstance(answer, Fetched)
    assert answer.high_watermark == 5


async def test_a_follower_of_a_newer_epoch_deposes_the_leader_and_fails_held_rounds() -> None:
    replica, owner = _leading()
    outcomes = _Outcomes()
    owner.end_offset = 2
    replica.hold(0, [_run(2)], [7], outcomes.deliver, outcomes.fail)
    answer = await replica.fetch(_fetch(durable=2, epoch=4))
    assert isinstance(answer, Refused)
    assert answer.reason is RefusalReason.FENCED
    assert outcomes.failed == [ErrorCode.NOT_LEADER]
    assert outcomes.delivered == 0
    refusal = replica.refusal()
    assert refusal is not None
    assert refusal[0] is ErrorCode.NOT_LEADER


async def test_an_older_epoch_is_told_to_catch_up_and_cannot_ack() -> None:
    replica, owner = _leading()
    outcomes = _Outcomes()
    owner.end_offset = 2
    replica.hold(0, [_run(2)], [7], outcomes.deliver, outcomes.fail)
    answer = await replica.fetch(_fetch(durable=2, epoch=2))
    assert isinstance(answer, Refused)
    assert answer.reason is RefusalReason.STALE_EPOCH
    assert outcomes.delivered == 0
    assert replica.high_watermark == 0


async def test_a_follower_in_step_is_answered_from_the_rounds_just_stored() -> None:
    """The stand-in log reads nothing: only the remembered rounds can answer."""
    replica, owner = _leading()
    outcomes = _Outcomes()
    first, second = _run(2), _run(3)
    owner.end_offset = 2
    replica.hold(0, [first], [7], outcomes.deliver, outcomes.fail)
    owner.end_offset = 5
    replica.hold(2, [second], [8], outcomes.deliver, outcomes.fail)
    answer = await replica.fetch(_fetch(durable=0))
    assert isinstance(answer, Fetched)
    assert [(r.epoch, r.base_offset, r.count, r.key, r.ts_broker) for r in answer.runs] == [
        (3, 0, 2, b"orders.k", 7),
        (3, 2, 3, b"orders.k", 8),
    ]
    assert answer.runs[1].messages == bytes(second.messages)
    assert answer.runs[1].sizes == bytes(second.sizes)
    answer = await replica.fetch(_fetch(durable=1))  # mid-run: read from the log
    assert isinstance(answer, Fetched)
    assert answer.runs == ()


async def test_a_fetch_below_the_log_start_names_the_start() -> None:
    replica, owner = _leading()
    owner.start_offset, owner.end_offset = 50, 80
    answer = await replica.fetch(_fetch(10))
    assert isinstance(answer, Refused)
    assert (answer.reason, answer.epoch, answer.log_start) == (
        RefusalReason.BEFORE_LOG_START,
        3,
        50,
    )
    assert isinstance(await replica.fetch(_fetch(50)), Fetched)


async def test_acks_leader_acks_at_the_leaders_fsync_with_too_small_an_isr() -> None:
    replica, owner = _leading(isr=(("n1", 1),), acks="leader")
    assert replica.refusal() is None  # min_insync binds only acks = "all"
    outcomes = _Outcomes()
    owner.end_offset = 4
    replica.hold(0, [_run(4)], [7], outcomes.deliver, outcomes.fail)
    assert (outcomes.delivered, outcomes.failed) == (1, [])
    # Readers still stop at the high watermark (here the leader alone's end).
    assert replica.high_watermark == 4
    replica, owner = _leading(acks="leader")
    owner.end_offset = 4
    replica.hold(0, [_run(4)], [7], outcomes.deliver, outcomes.fail)
    assert outcomes.delivered == 2
    assert replica.high_watermark == 0  # n2 has not fetched it yet


async def test_fetched_runs_carry_their_producer() -> None:
    """What a follower stores must name each run's idempotent producer, or
    a new leader would store a retry of it again."""
    replica, owner = _leading()
    owner.end_offset = 3
    replica.hold(
        0, [_run(2), _run(1)], [7, 8], _Outcomes().deliver, _Outcomes().fail, [(0xAB, 5), (0, 0)]
    )
    answer = await replica.fetch(_fetch(durable=0))
    assert isinstance(answer, Fetched)
    assert [(run.producer, run.sequence) for run in answer.runs] == [(0xAB, 5), (0, 0)]


class _Subscriptions:
    """Records what the gate tells a partition's subscriptions."""

    def __init__(self) -> None:
        self.watermarks: list[int] = []
        self.stepped_down = 0

    async def lead(self, epoch: int) -> None:
        raise AssertionError("the replication service calls lead, not the gate")

    def step_down(self) -> None:
        self.stepped_down += 1

    def state_since(self, epoch: int, version: int) -> StateUpdate | None:
        return None

    def readable(self, high_watermark: int) -> None:
        self.watermarks.append(high_watermark)

    async def store(self, update: StateUpdate) -> None:
        raise AssertionError("a leader stores nothing")


async def test_subscriptions_hear_of_every_high_watermark_move_and_of_the_step_down() -> None:
    """Records a new leader took over below its high watermark are acked by
    no round of its own: only the watermark's move makes them deliverable."""
    replica, owner = _leading()
    subscriptions = _Subscriptions()
    replica.subscriptions = subscriptions
    owner.end_offset = 5
    replica.hold(0, [_run(5)], [7], _Outcomes().deliver, _Outcomes().fail)
    with trio.move_on_after(1):
        await replica.fetch(_fetch(durable=5))
    assert subscriptions.watermarks == [5]
    replica.step_down("leader n2 at 127.0.0.1:2 (epoch 4)")
    assert subscriptions.stepped_down == 1


async def test_a_leader_whose_lease_may_be_gone_acks_nothing_until_renewed() -> None:
    replica, owner = _leading()
    lease = [True]
    replica.lease_valid = lambda: lease[0]
    outcomes = _Outcomes()
    owner.end_offset = 3
    replica.hold(0, [_run(3)], [7], outcomes.deliver, outcomes.fail)
    lease[0] = False
    refusal = replica.refusal()
    assert refusal is not None
    assert refusal[0] is ErrorCode.NOT_LEADER
    assert "lease" in refusal[1]
    with trio.move_on_after(1):
        await replica.fetch(_fetch(durable=3))
    assert outcomes.delivered == 0  # the follower has it, but etcd may have moved on
    lease[0] = True  # renewed after all: the held round is answered
    replica.settle()
    assert (outcomes.delivered, outcomes.failed) == (1, [])


async def test_a_round_being_fsynced_is_fetched_but_acked_only_after_the_leaders_fsync() -> None:
    """``written`` (before the leader's fsync) lets the follower fetch and
    fsync the round; the ack still waits for ``hold`` (the leader's fsync).
    The owner's end offset stays at the last finished round meanwhile."""
    replica, _ = _leading()
    outcomes = _Outcomes()
    run = _run(4)
    replica.written(0, [run], [7], None)
    answer = await replica.fetch(_fetch(durable=0))
    assert isinstance(answer, Fetched)
    assert [(r.base_offset, r.count) for r in answer.runs] == [(0, 4)]
    with trio.move_on_after(1):
        answer = await replica.fetch(_fetch(durable=4))  # the follower fsynced it
    assert isinstance(answer, Fetched)
    assert outcomes.delivered == 0
    assert replica.high_watermark == 0  # the leader has not fsynced it yet
    replica.hold(0, [run], [7], outcomes.deliver, outcomes.fail)
    assert outcomes.delivered == 1
    assert outcomes.failed == []
    assert replica.high_watermark == 4
    # The round is held once: a second round is acked on its own.
    second = _run(2)
    replica.written(4, [second], [8], None)
    replica.hold(4, [second], [8], outcomes.deliver, outcomes.fail)
    assert outcomes.delivered == 1
    with trio.move_on_after(1):
        await replica.fetch(_fetch(durable=6))
    assert outcomes.delivered == 2


async def test_a_round_written_late_or_after_a_failed_fsync_is_held_once() -> None:
    replica, _ = _leading()
    outcomes = _Outcomes()
    # The fsync of the first round failed: the owner answered the error, no hold.
    replica.written(0, [_run(2)], [7], None)
    replica.written(2, [_run(3)], [8], None)
    replica.hold(2, [_run(3)], [8], outcomes.deliver, outcomes.fail)
    # A round whose ``written`` comes after its ``hold`` is not held twice.
    replica.hold(5, [_run(1)], [9], outcomes.deliver, outcomes.fail)
    replica.written(5, [_run(1)], [9], None)
    with trio.move_on_after(1):
        await replica.fetch(_fetch(durable=6))
    assert outcomes.delivered == 2
    assert outcomes.failed == []
    assert replica.high_watermark == 6


async def test_stepping_down_while_a_round_is_fsynced_fails_it_once() -> None:
    replica, _ = _leading()
    outcomes = _Outcomes()
    replica.written(0, [_run(2)], [7], None)
    replica.step_down("leader n2 at 127.0.0.1:2 (epoch 4)")
    replica.hold(0, [_run(2)], [7], outcomes.deliver, outcomes.fail)
    assert outcomes.failed == [ErrorCode.NOT_LEADER]
    assert outcomes.delivered == 0


async def test_a_long_poll_is_woken_by_new_rounds_and_a_caught_up_watermark_only() -> None:
    """Waking a waiting fetch answers it, and the follower sends another:
    the leader's fsync of a round its followers already have, or a
    watermark move while a newer round is on its way to them (whose answer
    carries the watermark), must not answer it empty."""
    replica, _ = _leading()
    outcomes = _Outcomes()
    answers: list[Fetched | Refused] = []

    async def poll(durable: int) -> None:
        answers.append(await replica.fetch(_fetch(durable)))

    first, second = _run(4), _run(2)
    async with trio.open_nursery() as nursery:
        replica.written(0, [first], [7], None)
        replica.written(4, [second], [8], None)
        nursery.start_soon(poll, 6)  # the follower has both rounds: it waits
        await trio.testing.wait_all_tasks_blocked()
        replica.hold(0, [first], [7], outcomes.deliver, outcomes.fail)
        await replica.fetch(_fetch(durable=4))  # another fetch acks the first
        await trio.testing.wait_all_tasks_blocked()
        assert (outcomes.delivered, replica.high_watermark) == (1, 4)
        assert answers == []  # 4 < the log end 6: no empty answer
        replica.hold(4, [second], [8], outcomes.deliver, outcomes.fail)
        await replica.fetch(_fetch(durable=6))
        await trio.testing.wait_all_tasks_blocked()
    assert outcomes.delivered == 2
    # Caught up: the watermark goes out alone, after WATERMARK_LINGER.
    assert answers == [Fetched(3, 6, ())]


async def test_a_watermark_alone_goes_out_after_the_linger_not_the_long_poll() -> None:
    replica, _ = _leading()
    outcomes = _Outcomes()
    replica.written(0, [_run(4)], [7], None)
    replica.hold(0, [_run(4)], [7], outcomes.deliver, outcomes.fail)
    waits: list[float] = []

    async def poll() -> None:
        started = trio.current_time()
        # n2 has it all, not yet synced: it waits.
        answer = await replica.fetch(Fetch("orders", 0, 3, "n2", 2, 4, 0))
        waits.append(trio.current_time() - started)
        assert answer == Fetched(3, 4, ())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await trio.testing.wait_all_tasks_blocked()
        replica.leading.isr.follower_ack("n2", 2, 3, 4, 0.0)  # type: ignore[union-attr]
        replica.settle()  # the watermark reaches the log end: a wake
        assert replica.high_watermark == 4
    assert WATERMARK_LINGER <= waits[0] < FETCH_WAIT


async def test_a_round_written_during_the_linger_carries_the_watermark() -> None:
    """The wake for a caught-up watermark and the next round's runs make
    one answer, not two (an empty one, then one with the runs)."""
    replica, _ = _leading()
    outcomes = _Outcomes()
    replica.written(0, [_run(4)], [7], None)
    replica.hold(0, [_run(4)], [7], outcomes.deliver, outcomes.fail)
    answers: list[Fetched | Refused] = []

    async def poll() -> None:
        answers.append(await replica.fetch(Fetch("orders", 0, 3, "n2", 2, 4, 0)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await trio.testing.wait_all_tasks_blocked()
        replica.leading.isr.follower_ack("n2", 2, 3, 4, 0.0)  # type: ignore[union-attr]
        replica.settle()
        await trio.testing.wait_all_tasks_blocked()
        assert answers == []
        replica.written(4, [_run(3)], [8], None)
    [answer] = answers
    assert isinstance(answer, Fetched)
    assert answer.high_watermark == 4
    assert [(run.base_offset, run.count) for run in answer.runs] == [(4, 3)]


async def test_fetches_of_one_link_are_judged_per_partition() -> None:
    """A FetchMany's partitions are refused or deposed one by one: a fenced
    partition steps its leader down, a stale one is told so, an unknown one
    is not led here, and the partition in step still gets its runs and acks."""
    in_step, in_step_owner = _leading()
    fenced, _ = _leading()
    stale, _ = _leading()
    outcomes = _Outcomes()
    in_step_owner.end_offset = 2
    in_step.hold(0, [_run(2)], [7], outcomes.deliver, outcomes.fail)
    answers = await fetch_all(
        [
            (in_step, _fetch(durable=0)),
            (fenced, _fetch(durable=0, epoch=4)),
            (stale, _fetch(durable=0, epoch=2)),
            (None, _fetch(durable=0)),
        ]
    )
    assert isinstance(answers[0], Fetched)
    assert [run.count for run in answers[0].runs] == [2]
    reasons = [answer.reason for answer in answers[1:] if isinstance(answer, Refused)]
    assert reasons == [RefusalReason.FENCED, RefusalReason.STALE_EPOCH, RefusalReason.NOT_LEADER]
    assert fenced.leading is None
    assert in_step.leading is not None
    assert stale.leading is not None
    await fetch_all([(in_step, _fetch(durable=2)), (stale, _fetch(durable=0, epoch=2))])
    assert outcomes.delivered == 1


async def test_one_long_poll_wakes_for_any_partition_of_the_link() -> None:
    quiet, _ = _leading()
    busy, busy_owner = _leading()
    answers: list[Fetched | Refused] = []

    async def poll() -> None:
        answers.extend(await fetch_all([(quiet, _fetch(0)), (busy, _fetch(0))]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await trio.testing.wait_all_tasks_blocked()
        woken = trio.current_time()
        busy_owner.end_offset = 3
        busy.hold(0, [_run(3)], [7], lambda: None, lambda code, reason: None)
    assert trio.current_time() - woken < FETCH_WAIT / 2  # not the long poll's timeout
    assert [type(answer) for answer in answers] == [Fetched, Fetched]
    assert isinstance(answers[1], Fetched)
    assert [run.count for run in answers[1].runs] == [3]
