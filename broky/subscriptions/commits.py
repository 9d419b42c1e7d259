"""Group commits of subscription state: many acks, one sqlite transaction.

The dispatchers change in memory on every ack; the committer writes the
images of the ones that changed since the last round, one row each, in one
transaction (one WAL append and one fsync), at most every ``interval``
seconds (5 ms) or as soon as ``max_acks`` (4,096) acks wait. Callbacks
registered with ``after_commit`` run once a round that began after they were
registered has committed: that is when an ack receipt may leave, and when
the dispatchers' crash gates open (``Dispatcher.committed``).

Ownership: the committer owns the state store; the sqlite calls run in a
worker thread (sqlite blocks for the fsync; a commit round takes
``run_in_thread``, the partitions' owners' cheaper hand-off, as a busy
partition commits every 5 ms), one at a time (a commit round, or, for a
replicated partition, a follower storing its leader's rows or a new leader
reading them back: broky.subscriptions.replica), and the dispatchers are
only touched on the trio thread, before and after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Final

import trio

from broky.durable.thread_hop import run_in_thread
from broky.replication.wire import StateUpdate
from broky.storage.errors import StorageError
from broky.storage.state import StateStore
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.image import decode_image, encode_image
from broky.subscriptions.tracker import SubscriptionImage

log = logging.getLogger("broky.subscriptions")

#: Seconds between group commits while acks flow: the window in which an
#: acked-but-unreceipted ack can be lost by a crash.
COMMIT_INTERVAL: Final = 0.005
#: Acks that start a commit at once, without waiting for the interval.
MAX_ACKS_PER_COMMIT: Final = 4096

#: (subscription, topic, partition)
ImageKey = tuple[str, str, int]


class GroupCommitter:
    """See the module docstring."""

    def __init__(
        self,
        store: StateStore,
        *,
        interval: float = COMMIT_INTERVAL,
        max_acks: int = MAX_ACKS_PER_COMMIT,
    ) -> None:
        self._store = store
        self.interval = interval
        self.max_acks = max_acks
        self._dirty: dict[ImageKey, Dispatcher] = {}
        #: Subscription definitions to write with the next round.
        self._definitions: dict[str, str] = {}
        #: Subscriptions to delete with the next round (before its writes, so
        #: a subscription recreated meanwhile under the name is kept).
        self._deleted: set[str] = set()
        self._callbacks: list[Callable[[], None]] = []
        #: Called after every committed round, once the dispatchers' gates
        #: opened (their ``events`` may hold new deliveries then).
        self.on_commit: Callable[[], None] | None = None
        #: Called with the rows and the deleted subscriptions of every
        #: committed round (before its callbacks): what a replicated
        #: partition's followers must copy.
        self.on_rows: Callable[[list[tuple[ImageKey, bytes]], set[str]], None] | None = None
        #: One sqlite call at a time (module docstring).
        self._store_lock = trio.Lock()
        self._acks = 0
        self._wake = trio.Event()
        self._full = trio.Event()
        self.commits = 0
        self.failures = 0

    def load(self) -> dict[ImageKey, SubscriptionImage]:
        """Every committed image (blocking: call before serving, or in a thread)."""
        return {
            (subscription, topic, partition): decode_image(blob)
            for subscription, topic, partition, blob in self._store.load_images()
        }

    def changed(
        self, key: ImageKey, dispatcher: Dispatcher, acks: int = 0, *, hurry: bool = False
    ) -> None:
        """``dispatcher`` changed (``acks`` acks among the changes): commit it
        soon; with ``hurry``, at once (after the commit in flight, if any).

        Why hurry: a nacked message is redelivered only once a commit
        records its delivery count (the crash gate, broky.subscriptions.tracker),
        so waiting out the ``interval`` would add up to 5 ms to every
        redelivery. Commits stay grouped: one in flight gathers what comes
        meanwhile, so a burst of nacks is still one transaction per round."""
        self._dirty[key] = dispatcher
        self._acks += acks
        self._wake.set()
        if hurry or self._acks >= self.max_acks:
            self._full.set()

    def define(self, subscription: str, definition: str) -> None:
        """Write ``subscription``'s definition with the next round."""
        self._definitions[subscription] = definition
        self._wake.set()

    def forget(self, subscription: str) -> None:
        """Delete every row of ``subscription`` with the next round, and drop
        what was waiting to be written of it (``after_commit`` tells when
        the deletion is durable)."""
        self._dirty = {key: d for key, d in self._dirty.items() if key[0] != subscription}
        self._definitions.pop(subscription, None)
        self._deleted.add(subscription)
        self._wake.set()

    def load_definitions(self) -> dict[str, str]:
        """Every saved definition by subscription (blocking, like ``load``)."""
        return dict(self._store.load_definitions())

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once everything changed so far is durable."""
        self._callbacks.append(callback)
        self._wake.set()

    async def run(self) -> None:
        """Commit rounds until cancelled; a pending round is committed first."""
        try:
            while True:
                await self._wake.wait()
                with trio.move_on_after(self.interval):
                    await self._full.wait()
                await self.commit_now()
        finally:
            with trio.CancelScope(shield=True):
                if self._dirty or self._callbacks or self._definitions or self._deleted:
                    await self.commit_now()

    async def commit_now(self) -> None:
        """One round: take the images, write them in a thread, open the gates."""
        self._wake = trio.Event()
        self._full = trio.Event()
        self._acks = 0
        dirty, self._dirty = self._dirty, {}
        callbacks, self._callbacks = self._callbacks, []
        definitions, self._definitions = self._definitions, {}
        deleted, self._deleted = self._deleted, set()
        images = {key: dispatcher.tracker.image() for key, dispatcher in dirty.items()}
        rows = [(key, encode_image(image)) for key, image in images.items()]
        try:
            async with self._store_lock:
                await run_in_thread(partial(self._write, rows, definitions, deleted))
        except StorageError as exc:
            # Nothing was promised yet: keep everything for the next round.
            log.error("subscription state commit failed: %s", exc)
            self.failures += 1
            # Deleted meanwhile: its old images must not come back.
            forgotten = self._deleted
            for key, dispatcher in dirty.items():
                if key[0] not in forgotten:
                    self._dirty.setdefault(key, dispatcher)
            self._definitions = {
                **{name: text for name, text in definitions.items() if name not in forgotten},
                **self._definitions,
            }
            # Deletions run first in a round, so retrying one is right even if
            # the name was recreated meanwhile (its new rows follow it).
            self._deleted |= deleted
            self._callbacks[:0] = callbacks
            self._wake.set()
            await trio.sleep(self.interval)
            return
        self.commits += 1
        if self.on_rows is not None and (rows or deleted):
            self.on_rows(rows, deleted)
        now = trio.current_time()
        for key, image in images.items():
            dirty[key].committed(image, now)
        for callback in callbacks:
            callback()
        if self.on_commit is not None:
            self.on_commit()

    def discard_changes(self) -> None:
        """Write nothing more of the dispatchers changed so far (they were
        dropped); callbacks still run after the next round."""
        self._dirty.clear()
        self._definitions.clear()
        self._deleted.clear()

    async def store_rows(self, update: StateUpdate, topic: str, partition: int) -> None:
        """Store a leader's rows of ``topic``/``partition`` (a follower's
        copy), durably, in one transaction; on a resync, drop the
        subscriptions the leader does not have."""
        async with self._store_lock:
            await trio.to_thread.run_sync(self._store_rows, update, topic, partition)

    async def reload(self) -> tuple[dict[ImageKey, SubscriptionImage], dict[str, str]]:
        """Every stored image and definition (a follower taking the lead)."""
        async with self._store_lock:
            return await trio.to_thread.run_sync(lambda: (self.load(), self.load_definitions()))

    def _store_rows(self, update: StateUpdate, topic: str, partition: int) -> None:
        with self._store.transaction() as transaction:
            if update.names is not None:
                kept = set(update.names)
                for subscription, _ in self._store.load_definitions():
                    if subscription not in kept:
                        transaction.delete(subscription)
            for entry in update.entries:
                if entry.deleted:
                    transaction.delete(entry.subscription)
                    continue
                transaction.save_definition(entry.subscription, entry.definition)
                transaction.save_image(entry.subscription, topic, partition, entry.image)

    def close(self) -> None:
        """Close the state store (after ``run`` ended: nothing is pending)."""
        self._store.close()

    def _write(
        self,
        rows: list[tuple[ImageKey, bytes]],
        definitions: dict[str, str],
        deleted: set[str],
    ) -> None:
        if not (rows or definitions or deleted):
            return
        with self._store.transaction() as transaction:
            for subscription in deleted:
                transaction.delete(subscription)
            for subscription, definition in definitions.items():
                transaction.save_definition(subscription, definition)
            for (subscription, topic, partition), blob in rows:
                transaction.save_image(subscription, topic, partition, blob)


async def all_committed(committers: Sequence[GroupCommitter]) -> None:
    """Wait until every one of ``committers`` committed what changed so far
    (a new subscription's start, a deletion: both answered only once durable)."""
    if not committers:
        return
    committed = trio.Event()
    waiting = len(committers)

    def one_committed() -> None:
        nonlocal waiting
        waiting -= 1
        if not waiting:
            committed.set()

    for committer in committers:
        committer.after_commit(one_committed)
    await committed.wait()
