"""Leader-epoch history of one partition log, and where a follower truncates.

Kafka's KIP-101 and KIP-279, sans I/O. Every record batch carries the
leader epoch it was written in; each replica keeps, per partition, the
list of ``(epoch, start_offset)``: where each epoch's records begin in its
own log. A new leader adds its epoch at its log end before it accepts a
write.

When a replica starts following a leader (after any election), it asks
the leader about its latest epoch ``E``; the leader answers the largest
epoch ``E' <= E`` it has and where that epoch ends in its log (the start of
its next epoch, or its log end). If the follower has ``E'`` too, it
truncates to the smaller of that and where ``E'`` ends in its own log, and
the logs agree; if not, it truncates to where its own last epoch before
``E'`` ends and asks again (``truncation_step``). Then it fetches. Truncating to the
local high watermark instead (Kafka before KIP-101) lost acknowledged
records and let replicas diverge after two quick failovers; answering
only for the exact epoch (before KIP-279) diverged when a follower had an
epoch the new leader never saw.

The history file is written and fsynced by the log layer; this module only
decides.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable

#: (epoch, start offset of its first record in this log).
EpochEntry = tuple[int, int]


class EpochHistoryError(ValueError):
    """An entry that would make the history go back (a caller's bug)."""


class EpochHistory:
    """Epochs in increasing order, start offsets non-decreasing."""

    def __init__(self, entries: Iterable[EpochEntry] = ()) -> None:
        self._entries: list[EpochEntry] = []
        for epoch, start in entries:
            self.assign(epoch, start)

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1][0] if self._entries else None

    def assign(self, epoch: int, start: int) -> None:
        """Records of ``epoch`` begin at ``start`` (a new leader: its log end;
        a follower: the first record of a newer epoch it appends).

        An epoch already known is ignored. Entries starting at or after
        ``start`` are dropped first: an epoch with no record before a newer
        one began holds nothing (Kafka's rule for non-monotonic entries)."""
        latest = self.latest_epoch
        if latest is not None and epoch <= latest:
            if epoch == latest:
                return
            raise EpochHistoryError(f"epoch {epoch} after epoch {latest}")
        if self._entries and start < self._entries[-1][1]:
            raise EpochHistoryError(
                f"epoch {epoch} starts at {start}, before epoch {latest} at {self._entries[-1][1]}"
            )
        while self._entries and self._entries[-1][1] >= start:
            self._entries.pop()
        self._entries.append((epoch, start))

    def end_for(self, epoch: int, log_end: int) -> EpochEntry | None:
        """The leader's answer for a follower whose latest epoch is ``epoch``:
        (the largest epoch <= ``epoch`` here, the offset where it ends in this
        log), or None if every epoch here is newer (truncate everything)."""
        index = bisect.bisect_right(self._entries, (epoch, float("inf"))) - 1
        if index < 0:
            return None
        found = self._entries[index][0]
        end = self._entries[index + 1][1] if index + 1 < len(self._entries) else log_end
        return found, end

    def truncate(self, end: int) -> None:
        """The log was truncated to ``end``: epochs that began at or after it go."""
        while self._entries and self._entries[-1][1] >= end:
            self._entries.pop()


def truncation_step(
    follower: EpochHistory, follower_end: int, answer: EpochEntry | None
) -> tuple[int, bool]:
    """One round of a follower's truncation: (where to truncate, whether the
    logs now agree). ``answer`` is the leader's ``end_for`` of the follower's
    latest epoch.

    If the leader answered an epoch the follower does not have, the follower
    truncates to where its own older epoch ends and asks again with its new
    latest epoch (Kafka's fetcher loop, KIP-279); each round lowers the
    latest epoch, so the rounds end."""
    if answer is None:
        return 0, True
    epoch, leader_end = answer
    own = follower.end_for(epoch, follower_end)
    if own is None:
        return 0, True
    own_epoch, own_end = own
    if own_epoch != epoch:
        return min(own_end, follower_end), False
    return min(leader_end, own_end, follower_end), True


class Verdict(enum.Enum):
    """What a follower does with a batch a leader sent it."""

    APPEND = "append"
    #: The sender leads an older epoch than one this follower follows: it
    #: was deposed. Answer FENCED with our epoch; it must step down.
    FENCED = "fenced"
    #: A newer epoch: run ``truncation_step`` rounds against this leader
    #: first, then ``FollowerFence.follow`` it.
    TRUNCATE_FIRST = "truncate_first"
    #: Not at our log end: fetch from our log end instead.
    OUT_OF_SEQUENCE = "out_of_sequence"


class FollowerFence:
    """The newest leader epoch a follower has truncated for, kept durably
    with the epoch history; the follower's half of fencing (a leader that
    lost its lease may still send)."""

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch

    def verdict(self, epoch: int, base_offset: int, log_end: int) -> Verdict:
        """For a batch of leader epoch ``epoch`` starting at ``base_offset``."""
        if epoch < self.epoch:
            return Verdict.FENCED
        if epoch > self.epoch:
            return Verdict.TRUNCATE_FIRST
        if base_offset != log_end:
            return Verdict.OUT_OF_SEQUENCE
        return Verdict.APPEND

    def follow(self, epoch: int) -> None:
        """Truncation against the leader of ``epoch`` is done (never goes back)."""
        if epoch < self.epoch:
            raise EpochHistoryError(f"following epoch {epoch} after epoch {self.epoch}")
        self.epoch = epoch
