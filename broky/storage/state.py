"""Consumer state that must survive crashes: cursors and acknowledgements.

Durable subscriptions will keep, per subscription and partition, a *cursor*
(every offset below it is acknowledged) and the ranges acknowledged above it
(acks arrive out of order when consumers share a partition). The consumer
code owns that state in memory and saves snapshots of it here; a snapshot
of several partitions is saved in one transaction, so a crash never leaves
half of an acknowledgement batch.

Why sqlite3: it ships with Python, it is ACID, and in WAL mode a commit is
one append to the WAL plus one fsync (``synchronous=FULL``), so saving acks
costs about what a log append costs. The interface below is all the consumer
code may use, so the engine can change without touching it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Final

import attrs

from broky.storage.errors import StorageError

#: The schema version this code writes; an unknown one is refused.
SCHEMA_VERSION: Final = 1
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS cursors (
    subscription TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    cursor INTEGER NOT NULL,
    PRIMARY KEY (subscription, topic, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS acked (
    subscription TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    PRIMARY KEY (subscription, topic, partition, first_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscription_definitions (
    subscription TEXT NOT NULL PRIMARY KEY,
    definition TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscription_images (
    subscription TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    image BLOB NOT NULL,
    PRIMARY KEY (subscription, topic, partition)
) WITHOUT ROWID;
"""
#: How long a writer waits for another connection's lock before failing.
#: Only one broker process opens a state file, so a wait means something is
#: wrong; 5 s is long enough to ride out a checkpoint.
BUSY_TIMEOUT_MS: Final = 5000


@attrs.frozen(slots=True)
class PartitionCursor:
    """A subscription's progress in one partition.

    ``cursor``: every offset below it is acknowledged. ``acked``: sorted,
    disjoint inclusive ranges above the cursor that are acknowledged too.
    """

    topic: str
    partition: int
    cursor: int
    acked: tuple[tuple[int, int], ...] = ()


class StateTransaction:
    """Writes inside one transaction; see :meth:`StateStore.transaction`."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def save(self, subscription: str, state: PartitionCursor) -> None:
        """Replace the subscription's state for one partition."""
        key = (subscription, state.topic, state.partition)
        self._connection.execute(
            "INSERT OR REPLACE INTO cursors VALUES (?, ?, ?, ?)", (*key, state.cursor)
        )
        self._connection.execute(
            "DELETE FROM acked WHERE subscription = ? AND topic = ? AND partition = ?", key
        )
        self._connection.executemany(
            "INSERT INTO acked VALUES (?, ?, ?, ?, ?)",
            [(*key, first, last) for first, last in state.acked],
        )

    def save_image(self, subscription: str, topic: str, partition: int, image: bytes) -> None:
        """Replace one durable subscription's image of one partition (one row,
        see ``broky.subscriptions.image``)."""
        self._connection.execute(
            "INSERT OR REPLACE INTO subscription_images VALUES (?, ?, ?, ?)",
            (subscription, topic, partition, image),
        )

    def save_definition(self, subscription: str, definition: str) -> None:
        """Record a durable subscription's settings (JSON, see
        ``broky.subscriptions.definition``): it exists until deleted."""
        self._connection.execute(
            "INSERT OR REPLACE INTO subscription_definitions VALUES (?, ?)",
            (subscription, definition),
        )

    def delete(self, subscription: str) -> None:
        """Forget a subscription entirely."""
        for table in ("cursors", "acked", "subscription_images", "subscription_definitions"):
            self._connection.execute(f"DELETE FROM {table} WHERE subscription = ?", (subscription,))


class StateStore:
    """A state file; one owner (not thread-safe, like the logs)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    @classmethod
    def open(cls, path: str) -> StateStore:
        """Open or create the state database at ``path`` (WAL mode, full sync)."""
        try:
            # One owner at a time, but it may call from any worker thread
            # (trio.to_thread): the owner serialises, so sqlite's own
            # same-thread check is off.
            connection = sqlite3.connect(
                path,
                isolation_level=None,
                timeout=BUSY_TIMEOUT_MS / 1000,
                check_same_thread=False,
            )
            mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise StorageError(f"{path}: sqlite refused WAL mode (got {mode})")
            connection.execute("PRAGMA synchronous=FULL")
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise StorageError(f"{path}: state schema {version}, this broker knows 1")
            connection.executescript(_SCHEMA)
            connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open state store {path}: {exc}") from exc
        return cls(connection)

    @contextmanager
    def transaction(self) -> Iterator[StateTransaction]:
        """All writes in the block commit together (one fsync) or not at all."""
        try:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                yield StateTransaction(self._connection)
            except BaseException:
                self._connection.execute("ROLLBACK")
                raise
            self._connection.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StorageError(f"state store transaction failed: {exc}") from exc

    def save(self, subscription: str, states: Sequence[PartitionCursor]) -> None:
        """Save several partitions' states in one transaction."""
        with self.transaction() as transaction:
            for state in states:
                transaction.save(subscription, state)

    def load(self, subscription: str) -> list[PartitionCursor]:
        """Every partition state saved for ``subscription``, by topic and partition."""
        cursors = self._connection.execute(
            "SELECT topic, partition, cursor FROM cursors WHERE subscription = ?"
            " ORDER BY topic, partition",
            (subscription,),
        ).fetchall()
        ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for topic, partition, first, last in self._connection.execute(
            "SELECT topic, partition, first_offset, last_offset FROM acked"
            " WHERE subscription = ? ORDER BY topic, partition, first_offset",
            (subscription,),
        ):
            ranges.setdefault((topic, partition), []).append((first, last))
        return [
            PartitionCursor(topic, partition, cursor, tuple(ranges.get((topic, partition), ())))
            for topic, partition, cursor in cursors
        ]

    def load_images(self) -> list[tuple[str, str, int, bytes]]:
        """Every saved image as ``(subscription, topic, partition, image)``."""
        return list(
            self._connection.execute(
                "SELECT subscription, topic, partition, image FROM subscription_images"
                " ORDER BY subscription, topic, partition"
            )
        )

    def load_definitions(self) -> list[tuple[str, str]]:
        """Every saved subscription definition as ``(subscription, definition)``."""
        return list(
            self._connection.execute(
                "SELECT subscription, definition FROM subscription_definitions"
                " ORDER BY subscription"
            )
        )

    def subscriptions(self) -> list[str]:
        """Every subscription with saved state."""
        rows = self._connection.execute(
            "SELECT DISTINCT subscription FROM cursors ORDER BY subscription"
        )
        return [row[0] for row in rows]

    def close(self) -> None:
        self._connection.close()
