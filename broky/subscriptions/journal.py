"""What a partition leader's followers must copy of its subscription state.

Sans-IO, owned by the partition's subscriptions (broky.subscriptions.replica)
on the trio thread, read by the replication server when a follower fetches.

Every group commit of the leader hands its rows here (``committed``); each
row gets the next *version* of this leadership, and only the latest row per
subscription is kept (a row is the whole image of the subscription in this
partition, so a newer one replaces an older one: Kafka compacts
``__consumer_offsets`` by key for the same reason). A follower reports the
``(epoch, version)`` it has stored; ``since`` answers with the rows it lacks,
oldest version first, cut at ``max_bytes`` (a cut is safe: the follower's
version then names the last row it got, and every later one is sent next
time). A deleted subscription leaves a tombstone row (no definition, no
image) that makes followers delete it too. A follower of another leadership
(or a new one, version -1) gets a *resync*: every subscription this leader
has, and the names of all of them, so that it drops what the old leadership
left behind (and any deleted one).

Memory: one row per subscription of the partition (its definition and
image, a few hundred bytes each) and one small tombstone per subscription
deleted during this leadership, whatever the ack rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from broky.replication.wire import StateEntry, StateUpdate

#: Bytes of rows one fetch answer carries at most: bounds the answer next to
#: the runs it carries (FETCH_MAX_BYTES); the rest follows in the next one.
STATE_MAX_BYTES: Final = 1024 * 1024


class StateJournal:
    """The latest committed row of each subscription, numbered (module docstring)."""

    def __init__(self, epoch: int, rows: Iterable[tuple[str, str, bytes]] = ()) -> None:
        """``rows``: ``(subscription, definition JSON, image)`` this leader
        starts with (what it loaded, as a follower or before a restart)."""
        self.epoch = epoch
        self.version = 0
        self._latest: dict[str, StateEntry] = {}
        self.committed(rows)

    def __len__(self) -> int:
        return len(self._latest)

    def committed(self, rows: Iterable[tuple[str, str, bytes]]) -> None:
        """Rows a group commit made durable here, in commit order."""
        latest = self._latest
        for subscription, definition, image in rows:
            self.version += 1
            latest.pop(subscription, None)  # keeps ``latest`` in version order
            latest[subscription] = StateEntry(self.version, subscription, definition, image)

    def deleted(self, subscriptions: Iterable[str]) -> None:
        """Subscriptions a group commit deleted here: a tombstone each
        (before that commit's rows, as the commit deletes first)."""
        latest = self._latest
        for subscription in subscriptions:
            self.version += 1
            latest.pop(subscription, None)
            latest[subscription] = StateEntry(self.version, subscription, "", b"")

    def since(
        self, epoch: int, version: int, max_bytes: int = STATE_MAX_BYTES
    ) -> StateUpdate | None:
        """What a follower at ``(epoch, version)`` lacks; None if nothing."""
        resync = epoch != self.epoch or version < 0
        if not resync and version >= self.version:
            return None
        start = 0 if resync else version
        entries: list[StateEntry] = []
        size = 0
        for entry in self._latest.values():
            if entry.version <= start or (resync and entry.deleted):
                continue
            if entries and size + len(entry.image) + len(entry.definition) > max_bytes:
                break
            entries.append(entry)
            size += len(entry.image) + len(entry.definition)
        names = (
            tuple(name for name, entry in self._latest.items() if not entry.deleted)
            if resync
            else None
        )
        last = entries[-1].version if entries else self.version
        return StateUpdate(self.epoch, last, names, tuple(entries))
