"""A Publish frame's runs grouped by partition in one pass
(broky.storage.grouping): the compiled twin answers as the pure version, and
the store's one-pass path (``append_publish``) queues exactly the parts,
tickets and ephemeral runs its general loop (``append_frame``) queues."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.durable.acks import AckQueue, AckTicket
from broky.durable.parts import Part
from broky.durable.store import DurableStore
from broky.protocol.frames import Publish, Run
from broky.protocol.message import encode_message, pack_sizes
from broky.router.router import Router
from broky.storage import grouping
from broky.storage.topics import TopicPolicy

ORDERS = TopicPolicy(name="orders", pattern=b"orders.>", partitions=4)
EVENTS = TopicPolicy(name="events", pattern=b"events.>", partitions=3)
KEYS = [b"orders.a", b"orders.b", b"orders.c", b"events.x", b"live.y"]

#: A run: its key's position in KEYS and each message's key_partition.
runs_strategy = st.lists(
    st.tuples(
        st.integers(0, len(KEYS) - 1),
        st.lists(st.sampled_from([b"", b"p1", b"p2", b"p3"]), max_size=3),
    ),
    max_size=12,
)


def make_runs(spec: list[tuple[int, list[bytes]]]) -> list[Run]:
    runs = []
    for key_index, partition_keys in spec:
        messages = [encode_message(b"m", key_partition=key) for key in partition_keys]
        runs.append(
            Run(
                KEYS[key_index],
                0,
                len(messages),
                pack_sizes([len(m) for m in messages]),
                b"".join(messages),
            )
        )
    return runs


class Owner:
    """Stands in for a partition's owner: records the parts queued to it."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.parts: list[Part] = []

    def append_part(self, part: Part) -> None:
        self.parts.append(part)


def store_with_owners() -> tuple[DurableStore, list[Owner]]:
    store = DurableStore("/nonexistent", [ORDERS, EVENTS], Router(), clock=lambda: 7)
    owners: list[Owner] = []
    for topic in (ORDERS, EVENTS):
        mine = [Owner(partition) for partition in range(topic.partitions)]
        store._partition_owners[topic.name] = mine  # type: ignore[assignment]
        owners.extend(mine)
    return store, owners


def content(run: Run) -> tuple[bytes, int, bytes, bytes]:
    """A run's data (a run split by partition is a new object in each path)."""
    return run.key, run.count, bytes(run.sizes), bytes(run.messages)


def queued(owners: list[Owner]) -> list[tuple[Any, ...]]:
    return [
        (
            owner.partition,
            part.stamp,
            part.producer,
            [content(run) for run in part.runs],
            part.counts,
            part.indexes,
            part.sequences,
            part.messages,
            part.nbytes,
            part.next_sequence,
        )
        for owner in owners
        for part in owner.parts
    ]


def plain(answer: grouping.Grouped, runs: list[Run]) -> object:
    """An answer with the frame's runs by identity (the pair must hand out
    the same objects) and the pieces of split runs (new objects in each) by
    content."""
    if not isinstance(answer, tuple):
        return answer
    ephemeral, topic, groups = answer
    originals = {id(run) for run in runs}

    def named(run: Run) -> object:
        return id(run) if id(run) in originals else content(run)

    return (
        [id(run) for run in ephemeral],
        topic,
        [
            None if group is None else [[named(run) for run in group[0]], *group[1:]]
            for group in groups
        ],
    )


@settings(max_examples=200, deadline=None)
@given(spec=runs_strategy, first_sequence=st.integers(0, 2**40), locate_all=st.booleans())
def test_compiled_and_pure_grouping_agree(
    spec: list[tuple[int, list[bytes]]], first_sequence: int, locate_all: bool
) -> None:
    compiled = grouping.partition_groups_compiled
    if compiled is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    runs = make_runs(spec)
    store, _ = store_with_owners()
    for key in KEYS[: len(KEYS) if locate_all else 2]:
        store.locate(key)
    located = store._located
    assert plain(compiled(runs, located, first_sequence), runs) == plain(
        grouping.partition_groups_pure(runs, located, first_sequence), runs
    )


@settings(max_examples=200, deadline=None)
@given(
    spec=runs_strategy,
    producer=st.sampled_from([0, 0x5EED]),
    first_sequence=st.integers(1, 2**40),
    acked=st.booleans(),
)
def test_append_publish_queues_what_append_frame_queues(
    spec: list[tuple[int, list[bytes]]], producer: int, first_sequence: int, acked: bool
) -> None:
    runs = make_runs(spec)
    frame = Publish(1, tuple(runs), ack=acked, producer_id=producer, first_sequence=first_sequence)
    answers = []
    for one_pass in (True, False):
        store, owners = store_with_owners()
        acks = AckQueue(None)  # type: ignore[arg-type]  # never released here
        ticket: AckTicket | None = acks.open(1, producer, first_sequence) if acked else None
        if one_pass:
            ephemeral = store.append_publish(
                runs,
                ticket,
                acks if acked else None,
                producer if acked else 0,
                first_sequence,
                frame.run_identities if acked else lambda: None,
            )
        else:
            identities = frame.run_identities() if acked else None
            ephemeral = store.append_frame(runs, ticket, acks if acked else None, identities)
        answers.append(
            (
                [id(run) for run in ephemeral],
                queued(owners),
                None if ticket is None else (ticket.remaining, ticket.failure),
            )
        )
    assert answers[0] == answers[1]
