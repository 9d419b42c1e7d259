"""Per-partition offsets for ``broky cluster status``: high watermark, log
end per replica and lag, asked of the nodes themselves.

etcd holds placement, leaders, epochs and ISRs but not offsets: those
change with every publish, and writing them to etcd, even at a bounded
rate, would put a steady write load on the store every lease depends on
and grow its history until compaction. So the command asks each live
member over its replication listener (its address is in etcd), one
``ProgressRequest`` each, concurrently, bounded by ``PROGRESS_TIMEOUT``:
the figures are current, cost nothing when nobody asks, and a node that
does not answer (down, paused, cut off) is shown as such. On a node of
several workers each worker answers for the partitions it owns, on the
replication port + its index (broky.replication.worker_member). A follower's
lag is the leader's log end minus the follower's own log end, both as
reported; when the follower does not answer, the leader's view of its lag
(from its last fetch) is shown instead.

``partition_rows`` is pure (etcd's status and the answers in, rows out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TextIO

import attrs
import trio

from broky.cluster.membership import Member
from broky.cluster.placement import vbucket_of
from broky.cluster.vbuckets import StoredState
from broky.replication.link import ReplicationLink
from broky.replication.wire import (
    PartitionProgress,
    Progress,
    ProgressRequest,
    ReplicationProtocolError,
)
from broky.replication.worker_member import worker_listen

#: Seconds to wait for every node's answer: a few round trips on a LAN;
#: a node that takes longer is reported as not answering.
PROGRESS_TIMEOUT = 2.0


@attrs.frozen
class ReplicaRow:
    node: str
    #: The replica's log end as it reported it (None: no answer).
    log_end: int | None
    #: Messages behind the leader's log end (None: unknown).
    lag: int | None
    in_sync: bool


@attrs.frozen
class PartitionRow:
    topic: str
    partition: int
    vbucket: int
    leader: str | None
    epoch: int
    isr: tuple[str, ...]
    #: The leader's high watermark (None: the leader did not answer).
    high_watermark: int | None
    replicas: tuple[ReplicaRow, ...]

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


async def ask(address: str) -> Progress | str:
    """One node's Progress, or why there is none (the caller bounds the time)."""
    host, _, port = address.rpartition(":")
    try:
        stream = await trio.open_tcp_stream(host, int(port))
    except (OSError, ValueError) as exc:
        return f"unreachable: {exc}"
    async with stream:
        try:
            answer = await ReplicationLink(stream).request(ProgressRequest())
        except (ReplicationProtocolError, OSError, trio.BrokenResourceError) as exc:
            return f"no answer: {exc}"
    if not isinstance(answer, Progress):
        return f"unexpected answer {type(answer).__name__}"
    return answer


async def ask_node(address: str, workers: int) -> Progress | str:
    """A node's Progress: each of its ``workers`` answers for the partitions
    it owns, on the registered replication address + its index."""
    answers = [await ask(worker_listen(address, index)) for index in range(max(1, workers))]
    for answer in answers:
        if not isinstance(answer, Progress):
            return answer
    progress = [answer for answer in answers if isinstance(answer, Progress)]
    first = progress[0]
    return Progress(
        first.node, first.node_epoch, tuple(part for p in progress for part in p.partitions)
    )


async def gather(
    members: Mapping[str, Member], bound: float = PROGRESS_TIMEOUT
) -> dict[str, Progress | str]:
    """Every member's answer (or the reason it gave none), concurrently,
    within ``bound`` seconds."""
    answers: dict[str, Progress | str] = {}

    async def one(node: str, member: Member) -> None:
        answers[node] = f"no answer within {bound} s"
        with trio.move_on_after(bound):
            answers[node] = await ask_node(member.info.replication_address, member.info.workers)

    async with trio.open_nursery() as nursery:
        for node, member in sorted(members.items()):
            if member.info.replication_address:
                nursery.start_soon(one, node, member)
            else:
                answers[node] = "no replication address"
    return answers


def partition_rows(
    vbuckets: int, states: Mapping[int, StoredState], answers: Mapping[str, Progress | str]
) -> list[PartitionRow]:
    """One row per placed partition any node reported: leader, epoch and
    ISR from etcd's ``states`` (of a cluster of ``vbuckets``), offsets from
    the nodes' ``answers`` (see the module docstring)."""
    reported: dict[tuple[str, int], dict[str, PartitionProgress]] = {}
    for node, answer in answers.items():
        if isinstance(answer, Progress):
            for part in answer.partitions:
                reported.setdefault((part.topic, part.partition), {})[node] = part
    rows = []
    for (topic, partition), by_node in sorted(reported.items()):
        vbucket = vbucket_of(topic, partition, vbuckets)
        stored = states.get(vbucket)
        if stored is None:
            continue
        state = stored.state
        leader_part = by_node.get(state.leader) if state.leader is not None else None
        leader_lag = dict(leader_part.follower_lag) if leader_part is not None else {}
        isr = tuple(node for node, _ in state.isr)
        replicas = []
        for node in state.replicas:
            held = by_node.get(node)
            end = None if held is None else held.log_end
            lag: int | None
            if node == state.leader:
                lag = 0 if end is not None else None
            elif end is not None and leader_part is not None:
                lag = max(0, leader_part.log_end - end)
            else:
                lag = leader_lag.get(node)
            replicas.append(ReplicaRow(node, end, lag, node in isr))
        rows.append(
            PartitionRow(
                topic,
                partition,
                vbucket,
                state.leader,
                state.epoch,
                isr,
                None if leader_part is None else leader_part.high_watermark,
                tuple(replicas),
            )
        )
    return rows


def _figure(value: int | None) -> str:
    return "?" if value is None else str(value)


def render_rows(
    rows: list[PartitionRow], answers: Mapping[str, Progress | str], out: TextIO
) -> None:
    """The partitions table; nodes that did not answer are listed first."""
    for node, answer in sorted(answers.items()):
        if not isinstance(answer, Progress):
            print(f"node {node}: {answer}", file=out)
    if not rows:
        return
    width = max(12, *(len(f"{r.topic}/{r.partition}") for r in rows))
    print(
        f"\n{'partition':<{width}} {'leader':<10} {'epoch':>6} {'hw':>10}  "
        "replica=log end (lag), * = in the ISR",
        file=out,
    )
    for row in rows:
        name = f"{row.topic}/{row.partition}"
        replicas = "  ".join(
            f"{r.node}{'*' if r.in_sync else ''}={_figure(r.log_end)}"
            + ("" if r.lag == 0 else f" (lag {_figure(r.lag)})")
            for r in row.replicas
        )
        leader = row.leader or "OFFLINE"
        print(
            f"{name:<{width}} {leader:<10} {row.epoch:>6} {_figure(row.high_watermark):>10}  "
            f"{replicas}",
            file=out,
        )
