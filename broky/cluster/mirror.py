"""A live local copy of every key under an etcd prefix.

The one way the cluster code reads etcd state that changes: a range read,
then a watch from the revision after it, applied in order. The mirror's
task alone writes its dict; readers take snapshots and wait on
``changed()``. A dropped watch resumes from the last applied revision; a
compacted one re-reads the prefix, so no change is missed or applied twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

import trio

from broky.cluster.etcd import EtcdClient
from broky.cluster.etcd_wire import EtcdError, EventType, KeyValue, WatchCompacted, prefix_end

log = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")

#: Pause before re-opening a watch etcd dropped: short, since failover time
#: depends on seeing changes, but not a busy loop while etcd is down.
RETRY_DELAY = 0.1
#: Longest pause between re-reads while etcd stays unreachable.
MAX_RETRY_DELAY = 2.0


class PrefixMirror:
    """Every key under ``prefix``, as of ``revision``."""

    def __init__(self, client: EtcdClient, prefix: bytes) -> None:
        self.client = client
        self.prefix = prefix
        self._kvs: dict[bytes, KeyValue] = {}
        #: The etcd revision the copy reflects (0 before the first read).
        self.revision = 0
        #: Counts the changes applied (reads and watch batches): what a
        #: ``ParsedView`` compares to know its parse is stale.
        self.generation = 0
        self._changed = trio.Event()

    @property
    def kvs(self) -> Mapping[bytes, KeyValue]:
        """A read-only view; copy it to keep it across an await."""
        return self._kvs

    async def changed(self) -> None:
        """Return after the next change applied (any key, any kind)."""
        await self._changed.wait()

    def _notify(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = trio.Event()

    async def _reload(self) -> None:
        found = await self.client.get_prefix(self.prefix)
        self._kvs = {kv.key: kv for kv in found.kvs}
        self.revision = found.revision
        self._notify()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the copy current until cancelled; started once the first read
        is in (so callers of ``nursery.start`` see a full copy)."""
        await self._reload_until_done()
        task_status.started()
        while True:
            try:
                await self._follow()
            except WatchCompacted:
                log.info("watch of %r compacted, re-reading it", self.prefix)
                await self._reload_until_done()
            except EtcdError as exc:
                log.warning("watch of %r ended (%s), resuming", self.prefix, exc)
                await trio.sleep(RETRY_DELAY)

    async def _reload_until_done(self) -> None:
        delay = RETRY_DELAY
        while True:
            try:
                await self._reload()
                return
            except EtcdError as exc:
                level = logging.WARNING if delay == RETRY_DELAY else logging.DEBUG
                log.log(level, "reading %r from etcd failed (%s), retrying", self.prefix, exc)
                await trio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)

    async def _follow(self) -> None:
        end = prefix_end(self.prefix)
        async with self.client.watch(self.prefix, end, self.revision + 1) as stream:
            async for batch in stream:
                for event in batch.events:
                    if event.type is EventType.DELETE:
                        self._kvs.pop(event.kv.key, None)
                    else:
                        self._kvs[event.kv.key] = event.kv
                if batch.events:
                    # Resume after the last event applied: a batch's header
                    # revision can run ahead of the events it carries.
                    self.revision = max(event.kv.mod_revision for event in batch.events)
                    self._notify()


class ParsedView(Generic[K, V]):
    """A mirror's keys parsed, once per change rather than once per read.

    A node reads its parsed views of etcd on timers that run under any load
    (every led partition's ISR review ten times a second, the role and
    empty-vbucket checks four times a second): parsing every key's JSON at
    each read was a steady few per cent of an RF 3 node's CPU on the 2-core
    benchmark machine (docs/cluster.md), for tables that change only at a
    failover, an ISR change or a move. Invalidated by the mirror's
    generation, as nats-server's sublist cache; the parse's own warnings
    (an unreadable key) are logged once per change, not per read.
    """

    def __init__(
        self,
        mirror: PrefixMirror,
        parse: Callable[[Mapping[bytes, KeyValue]], dict[K, V]],
    ) -> None:
        self._mirror = mirror
        self._parse = parse
        self._generation = -1
        self._parsed: dict[K, V] = {}

    def current(self) -> dict[K, V]:
        """The parse of the mirror as it is now: a new dict each call (the
        caller may keep or change it), sharing the parsed values, which
        must be immutable."""
        mirror = self._mirror
        if self._generation != mirror.generation:
            self._parsed = self._parse(mirror.kvs)
            self._generation = mirror.generation
        return dict(self._parsed)
