"""A partition's leader-epoch history and fence, kept beside its log.

``leader-epochs.json`` in the partition's directory holds the
``(epoch, start offset)`` entries (broky.cluster.epochs) and the newest
epoch this replica truncated for (its fence). It is written whole to a
temporary file, fsynced and renamed over the old one, so a crash leaves
the old or the new version, never a torn one. Only the partition's owner
thread reads or writes it (it changes inside owner rounds, beside the log).

Kafka keeps the epoch in every batch header as well and rebuilds this
file from the log; Broky's batch format has no epoch field (changing it is
a format migration), so this file is the only record: losing it makes the
replica truncate more than needed on its next failover (it asks about
epoch -1 and gets everything refetched), never less.
"""

from __future__ import annotations

import json
import os

from broky.cluster.epochs import EpochHistory, EpochHistoryError
from broky.storage.segment import fsync_directory

FILE_NAME = "leader-epochs.json"


def load(directory: str) -> tuple[EpochHistory, int]:
    """The history and fence stored in ``directory`` (empty and 0 if none)."""
    path = os.path.join(directory, FILE_NAME)
    try:
        with open(path, "rb") as file:
            fields = json.load(file)
        history = EpochHistory((int(epoch), int(start)) for epoch, start in fields["entries"])
        return history, int(fields["fence"])
    except FileNotFoundError:
        return EpochHistory(), 0
    except (ValueError, KeyError, TypeError, EpochHistoryError):
        # Unreadable: start empty, which only makes the next truncation
        # refetch more (see the module docstring).
        return EpochHistory(), 0


def save(directory: str, history: EpochHistory, fence: int) -> None:
    """Replace the stored history and fence durably."""
    path = os.path.join(directory, FILE_NAME)
    temporary = path + ".tmp"
    data = json.dumps({"entries": [list(e) for e in history.entries], "fence": fence}).encode()
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(directory)


def epoch_at(history: EpochHistory, offset: int) -> int:
    """The epoch the record at ``offset`` was written in (0 before any entry)."""
    found = 0
    for epoch, start in history.entries:
        if start > offset:
            break
        found = epoch
    return found
