"""A leader's state for one partition at one epoch, and its held rounds.

Split from broky.replication.gate, which owns them: ``Leading`` is what
``PartitionReplica.leading`` holds while this node leads the partition,
``HeldRound`` one stored round's ack waiting for the high watermark.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from broky.cluster.isr import LeaderIsr
from broky.cluster.leadership import Term
from broky.durable.producers import Identity
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Run
from broky.replication.wire import ReplicatedRun

#: Bytes of the latest rounds a leader keeps per partition to answer fetches
#: without a read (a follower in step asks for what was just stored): a few
#: rounds of a busy partition; the memory cost is this per led partition.
RECENT_BYTES = 4 * 1024 * 1024


class HeldRound:
    """One stored round's ack, held until the high watermark passes ``end``.

    A round the leader showed its followers before its own fsync
    (``PartitionReplica.written``) is held from then on, in log order, but
    gets its callbacks only once that fsync returned (``hold``). It cannot
    be acked before: the high watermark counts the leader's fsynced end. An
    answer for a round that never got its callbacks (its fsync failed, and
    the owner already answered the error; or the node stepped down first,
    and ``hold`` then answers NotLeader itself) goes nowhere.
    """

    __slots__ = ("_deliver", "_fail", "end")

    def __init__(
        self,
        end: int,
        deliver: Callable[[], None] | None = None,
        fail: Callable[[ErrorCode, str], None] | None = None,
    ) -> None:
        self.end = end
        self._deliver = deliver
        self._fail = fail

    def attach(self, deliver: Callable[[], None], fail: Callable[[ErrorCode, str], None]) -> None:
        self._deliver, self._fail = deliver, fail

    def deliver(self) -> None:
        if self._deliver is not None:
            self._deliver()

    def fail(self, code: ErrorCode, reason: str) -> None:
        if self._fail is not None:
            self._fail(code, reason)


class Leading:
    """This node's leadership of the partition at one epoch."""

    def __init__(self, term: Term, isr: LeaderIsr) -> None:
        self.term = term
        self.isr = isr
        #: The etcd revision of the vbucket state whose ISR ``isr`` holds
        #: (broky.replication.service takes only newer ones).
        self.isr_revision = 0
        #: The held rounds, in log order (LeaderIsr answers in that order).
        self.tokens: deque[HeldRound] = deque()
        #: The rounds shown to followers whose fsync has not returned yet.
        self.written: deque[HeldRound] = deque()
        #: The latest runs stored in this term, as fetches answer them.
        self.recent: deque[ReplicatedRun] = deque()
        self.recent_bytes = 0

    def remember(
        self,
        offset: int,
        runs: Sequence[Run],
        stamps: Sequence[int],
        producers: Sequence[Identity] | None,
    ) -> None:
        identities = producers or [(0, 0)] * len(runs)
        for run, stamp, (producer, sequence) in zip(runs, stamps, identities, strict=True):
            copy = ReplicatedRun(
                self.term.epoch,
                offset,
                run.count,
                run.key,
                stamp,
                bytes(run.sizes),
                bytes(run.messages),
                producer,
                sequence,
            )
            self.recent.append(copy)
            self.recent_bytes += len(copy.messages)
            offset += run.count
        while self.recent_bytes > RECENT_BYTES and len(self.recent) > 1:
            self.recent_bytes -= len(self.recent.popleft().messages)

    def recent_from(self, offset: int, max_bytes: int) -> list[ReplicatedRun] | None:
        """The remembered runs from ``offset`` (up to ``max_bytes``, at least one), or
        None if ``offset`` is not where a remembered run starts."""
        recent = self.recent
        if not recent or not recent[0].base_offset <= offset <= recent[-1].base_offset:
            return None
        for index in range(len(recent) - 1, -1, -1):
            if recent[index].base_offset == offset:
                found: list[ReplicatedRun] = []
                size = 0
                for position in range(index, len(recent)):
                    run = recent[position]
                    if found and size + len(run.messages) > max_bytes:
                        break
                    found.append(run)
                    size += len(run.messages)
                return found
        return None
