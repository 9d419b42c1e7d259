"""A subscription's consumer side, fed runs directly as the client's reader
feeds them: batches, credit, checkpoints, undecodable runs.

The owner is a stand-in that records the control frames the subscription
sends; the broker-facing behaviour is in tests/integration/test_batches.py.
"""

from __future__ import annotations

import logging

import pytest
import trio

from broky.client.subscription import ITERATION_MESSAGES, Subscription
from broky.protocol.frames import Flow, Frame, Run
from broky.protocol.message import Message, encode_message, pack_sizes


class Owner:
    """The client, as far as a subscription sees it."""

    closed = False

    def __init__(self) -> None:
        self.sent: list[Frame] = []

    def _send_control(self, frame: Frame) -> None:
        self.sent.append(frame)

    def _forget(self, subscription: object) -> None:
        pass


def _run(first: int, count: int) -> Run:
    """``count`` messages whose payloads number them from ``first``."""
    blobs = [encode_message(str(number).encode()) for number in range(first, first + count)]
    return Run(b"k", 0, count, pack_sizes([len(b) for b in blobs]), b"".join(blobs))


def _subscription(credit: int = 0) -> tuple[Owner, Subscription]:
    owner = Owner()
    return owner, Subscription(owner, 2, "k", credit)


def _numbers(messages: list[Message]) -> list[int]:
    return [int(message.payload) for message in messages]


async def test_batches_keep_order_and_hold_at_most_max_messages() -> None:
    _, subscription = _subscription()
    subscription._deliver((_run(0, 30), _run(30, 5), _run(35, 70)))
    batches = subscription.batches(max_messages=40)
    with trio.fail_after(5):
        taken = [await anext(batches) for _ in range(3)]
    # Whole runs while they fit (30 + 5); a run bigger than a batch is split.
    assert [len(batch) for batch in taken] == [35, 40, 30]
    assert _numbers([m for batch in taken for m in batch]) == list(range(105))
    assert subscription.statistics().buffered_messages == 0


async def test_per_message_and_batch_iteration_share_one_position() -> None:
    _, subscription = _subscription()
    subscription._deliver((_run(0, 10), _run(10, 10)))
    with trio.fail_after(5):
        first = await anext(subscription)
        rest = await anext(subscription.batches())
        subscription._deliver((_run(20, 3),))
        last = await anext(subscription)
    assert _numbers([first, *rest, last]) == list(range(21))


async def test_a_batch_handed_over_is_the_callers() -> None:
    _, subscription = _subscription()
    subscription._deliver((_run(0, 3), _run(3, 3)))
    with trio.fail_after(5):
        batch = await anext(subscription.batches())
        batch.clear()
        subscription._deliver((_run(6, 1),))
        assert _numbers([await anext(subscription)]) == [6]


async def test_credit_returns_in_grants_of_half_the_window() -> None:
    owner, subscription = _subscription(credit=100)
    subscription._deliver(tuple(_run(n * 10, 10) for n in range(25)))
    with trio.fail_after(5):
        for _ in range(25):
            await anext(subscription.batches(max_messages=10))
    grants = [frame for frame in owner.sent if isinstance(frame, Flow)]
    assert [grant.credit for grant in grants] == [50, 50, 50, 50, 50]
    assert subscription.received == 250


async def test_one_checkpoint_per_batch_not_per_message() -> None:
    """A consumer that awaits nothing else lets other tasks run between
    batches, but its messages cost no trio round each."""
    _, subscription = _subscription()
    total = 20 * ITERATION_MESSAGES
    subscription._deliver(tuple(_run(n * 128, 128) for n in range(total // 128)))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await trio.lowlevel.checkpoint()
            ticks += 1

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            count = 0
            async for _ in subscription:
                count += 1
                if count == total:
                    break
            nursery.cancel_scope.cancel()
    assert count == total
    assert total // ITERATION_MESSAGES - 2 <= ticks <= total // 128


async def test_an_undecodable_run_is_dropped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    _, subscription = _subscription()
    bad = Run(b"k", 0, 1, pack_sizes([8]), bytes(8))
    subscription._deliver((_run(0, 2), bad, _run(2, 2)))
    with caplog.at_level(logging.WARNING, "broky.client"), trio.fail_after(5):
        batch = await anext(subscription.batches())
    assert _numbers(batch) == [0, 1, 2, 3]
    assert "undecodable run" in caplog.text
    assert subscription.received == 5  # its credit is returned all the same


async def test_iteration_ends_after_the_buffer_once_unsubscribed() -> None:
    _, subscription = _subscription()
    subscription._deliver((_run(0, 3), _run(3, 3)))
    with trio.fail_after(5):
        first = await anext(subscription.batches(max_messages=2))
        await subscription.unsubscribe()
        rest = [message async for batch in subscription.batches() for message in batch]
    assert _numbers(first + rest) == list(range(6))


def test_max_messages_must_be_positive() -> None:
    _, subscription = _subscription()
    with pytest.raises(ValueError, match="at least 1"):
        subscription.batches(max_messages=0)
