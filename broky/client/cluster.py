"""Acked publishing to a replicated cluster that finds partition leaders by itself.

A node that does not lead a partition refuses a publish to it with
``NotLeader``, whose message ends with ``leader NODE at HOST:PORT (epoch
E)`` when it knows the leader (docs/protocol.md); a leader with too few
replicas in sync refuses with ``NotEnoughReplicas``. ``ClusterPublisher``
keeps one connection per node it was sent to, follows those redirects,
and retries the refused batch with a short backoff until ``retry_for``
runs out.

Retries are idempotent across nodes (the default): a batch whose leader
was deposed after it stored it fails with NotLeader although the new leader
may keep it (it was replicated before the failover). So the publisher is one
idempotent producer for the whole cluster: it draws one producer id, numbers
its messages itself from 1, and every attempt of a batch, on whichever node,
carries the same id and sequences (``Client.continue_producer``). Followers
store the producer columns with the runs they replicate, and a node that
takes the lead rebuilds its deduplication window from its log
(broky.durable.producers), so the retry is answered with the offsets the
original got instead of being stored again. ``idempotent=False`` turns this
off (each attempt is a new publish: a retry may be stored twice).

Pipelining (Kafka's ``max.in.flight.requests`` with idempotence): up to
``max_in_flight`` ``publish`` calls are in flight at once; each draws its
sequences in call order and keeps them for every attempt. Order per
partition is kept by two rules:

- here, batches that may share a partition are *related* (the same
  partition, learned from a key's first ack, or either key's partition not
  known yet). A batch is sent (first or again) only if every earlier
  related batch not acked yet is in flight on the same connection ahead of
  it, and no later related one is in flight: after a refusal the batches
  behind it are answered first, then all are resent oldest first;
- at the partition (broky.durable.producers): a batch refused with
  NotLeader or NotEnoughReplicas holds the producer's later runs back
  (refused with the retriable ``SequenceGap``) until it is resent. Without
  it a later batch already in flight behind it could be stored first (the
  ISR recovered, or that node was elected, in between) and the retry would
  then be out of order, since sequences jump at a partition.

A batch that is given up (``retry_for`` ran out, a refusal that is not
retriable, a cancelled call) ends the producer id: later batches are drawn
under a new one, which no partition holds back. A batch of the new id is
not sent while an earlier related batch of the old one is still being
retried (acked or given up first): the partitions' holds are per producer,
so it could be stored ahead of that batch.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Final, NamedTuple

import attrs
import trio

from broky.client.acked import MAX_UNACKED_MESSAGES
from broky.client.client import Client
from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.durable import AckedRun
from broky.client.errors import AckTimeout, BrokyError, ConnectionClosed
from broky.protocol.constants import ErrorCode

#: Refusals after which the same batch may be sent again (somewhere else).
RETRIABLE: Final = frozenset(
    {
        ErrorCode.NOT_LEADER,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.OWNER_UNAVAILABLE,
        ErrorCode.SEQUENCE_GAP,
    }
)
#: First pause between attempts; doubles up to MAX_BACKOFF, which stays
#: short because failover takes about a lease TTL (1 s) and each attempt
#: costs one connect or one refused frame.
FIRST_BACKOFF: Final = 0.02
MAX_BACKOFF: Final = 0.2
#: Seconds an attempt (connect, publish, ack) may take before the node is
#: taken for dead or paused and the next one is tried.
ATTEMPT_TIMEOUT: Final = 3.0
#: Batches in flight by default (Kafka's ``max.in.flight.requests``, 5 with
#: idempotence): enough that a partition's next batch is already there when
#: a replication round ends.
MAX_IN_FLIGHT: Final = 5

_LEADER = re.compile(r"leader (\S+) at (\S+) \(epoch (\d+)\)")


class _Extras(NamedTuple):
    """What every message of a batch carries besides its payload."""

    key_partition: bytes
    tags: Sequence[tuple[str, str]]
    uid: bytes


@attrs.define(slots=True, eq=False)
class _Batch:
    """One ``publish`` call until it is acked or given up."""

    #: Call order (sequences restart under a new producer id).
    order: int
    key: str
    payloads: Sequence[bytes]
    extras: _Extras
    producer_id: int
    first_sequence: int
    #: The connection its current attempt was queued on (None: not in flight).
    client: Client | None = None
    #: The node its current or last attempt went to.
    address: str | None = None

    @property
    def route(self) -> tuple[str, bytes]:
        return self.key, self.extras.key_partition


class _NotSent(ConnectionClosed):
    """A batch's turn did not come before its deadline (earlier related
    batches were still being retried): it was never sent."""


def leader_address(message: str) -> str | None:
    """The leader's address a NotLeader message names, if any."""
    found = _LEADER.search(message)
    return found.group(2) if found else None


class ClusterPublisher:
    """Publishes with acks to whichever node leads each partition (see the
    module docstring). Create it with ``async with ClusterPublisher.open(seeds)``:
    its connections live in tasks of its own nursery. ``credentials`` are
    presented to every node it connects to (a node's own dead-letter
    publisher presents its ``cluster_token``); with ``ssl_context`` (see
    ``broky.security.tls.client_context``) every connection speaks TLS,
    checking each node's certificate against the host it dials."""

    def __init__(
        self,
        nursery: trio.Nursery,
        seeds: Sequence[str],
        retry_for: float,
        name: str,
        idempotent: bool = True,
        credentials: Credentials = ANONYMOUS,
        ssl_context: ssl.SSLContext | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        if not seeds:
            raise ValueError("a cluster publisher needs at least one seed address")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._nursery = nursery
        self.seeds = list(seeds)
        self.retry_for = retry_for
        self.name = name
        #: Presented on every connection (to each node it is sent to).
        self.credentials = credentials
        #: TLS for every connection (None: plain TCP).
        self.ssl_context = ssl_context
        #: ``publish`` calls in flight at most (1: one at a time).
        self.max_in_flight = max_in_flight
        #: Attempts that were refused or failed and retried.
        self.retries = 0
        self._clients: dict[str, tuple[Client, trio.Event, trio.Lock]] = {}
        #: Set when the connection being made to an address is made or failed.
        self._connecting: dict[str, trio.Event] = {}
        self._next_seed = 0
        #: The node that last acked each key (bounded by the keys used).
        self._leaders: dict[str, str] = {}
        #: The partition each (key, key_partition) was acked in (same bound).
        self._partitions: dict[tuple[str, bytes], int] = {}
        #: One producer for every node (0: not idempotent), and the sequence
        #: of the next batch's first message.
        self.producer_id = (secrets.randbits(64) or 1) if idempotent else 0
        self._next_sequence = 1
        #: Batches not acked or given up yet, in call order.
        self._batches: list[_Batch] = []
        self._calls = 0
        #: Admits calls in call order (trio's locks are fair).
        self._admission = trio.Lock()
        self._changed = trio.Event()

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        seeds: Sequence[str],
        retry_for: float = 10.0,
        name: str = "",
        *,
        idempotent: bool = True,
        credentials: Credentials = ANONYMOUS,
        ssl_context: ssl.SSLContext | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> AsyncIterator[ClusterPublisher]:
        async with trio.open_nursery() as nursery:
            publisher = cls(
                nursery,
                seeds,
                retry_for,
                name,
                idempotent,
                credentials,
                ssl_context,
                max_in_flight,
            )
            try:
                yield publisher
            finally:
                for address in list(publisher._clients):
                    publisher._drop(address)

    async def publish(
        self,
        key: str,
        payloads: Sequence[bytes],
        *,
        key_partition: bytes = b"",
        tags: Sequence[tuple[str, str]] = (),
        uid: bytes = b"",
    ) -> list[AckedRun]:
        """Publish ``payloads`` on ``key`` as one acked batch; returns the
        offsets once acked. Calls from several tasks overlap, up to
        ``max_in_flight`` (the next waits); their batches are stored in call
        order per partition. Raises the last BrokyError after ``retry_for``
        (the batch may then be stored or not; a later batch is not held
        back by it). ``tags`` and ``uid`` go with every message of the batch."""
        async with self._admission:
            while self._batches and (
                len(self._batches) >= self.max_in_flight
                or sum(len(b.payloads) for b in self._batches) + len(payloads)
                > MAX_UNACKED_MESSAGES
            ):
                await self._wait_changed()
            self._calls += 1
            batch = _Batch(
                self._calls,
                key,
                payloads,
                _Extras(key_partition, tags, uid),
                self.producer_id,
                self._next_sequence,
            )
            self._next_sequence += len(payloads)
            self._batches.append(batch)
        acked = False
        try:
            runs = await self._publish(batch)
            acked = True
            return runs
        finally:
            self._batches.remove(batch)
            if not acked and self.producer_id and self.producer_id == batch.producer_id:
                # Partitions may hold its later batches back for ever.
                self.producer_id = secrets.randbits(64) or 1
                self._next_sequence = 1
            self._notify()

    async def _publish(self, batch: _Batch) -> list[AckedRun]:
        deadline = trio.current_time() + self.retry_for
        address: str | None = None
        backoff = FIRST_BACKOFF
        while True:
            try:
                acked = await self._attempt(batch, address, deadline)
                self._learn(batch, acked)
                return acked
            except _NotSent:
                raise  # its connection serves the batches ahead of it: keep it
            except (BrokyError, trio.TooSlowError, OSError) as exc:
                error = exc
                address = self._failed(batch, exc)
            self.retries += 1
            if trio.current_time() + backoff > deadline:
                if isinstance(error, BrokyError):
                    raise error
                raise ConnectionClosed(f"no node acked within {self.retry_for} s: {error!r}")
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _attempt(self, batch: _Batch, address: str | None, deadline: float) -> list[AckedRun]:
        """One attempt: wait for the batch's turn (module docstring), queue
        it on the connection its predecessors took (or ``address``, or the
        key's leader) and wait for its answer."""
        fallback = address or self._leaders.get(batch.key) or self._seed()
        while True:
            batch.address = self._ahead(batch) or fallback
            with trio.fail_after(ATTEMPT_TIMEOUT):
                client, lock = await self._client(batch.address)
            if self._may_send(batch, client):
                break
            if trio.current_time() >= deadline:
                raise _NotSent(f"not sent within {self.retry_for} s: earlier batches were retried")
            with trio.move_on_at(deadline):
                await self._wait_changed()
        # In flight from here: later batches may follow it on this connection
        # (the lock is fair and taken without a checkpoint, so they queue
        # behind it), and earlier ones wait for its answer before a resend.
        batch.client = client
        self._notify()
        try:
            with trio.fail_after(ATTEMPT_TIMEOUT):
                async with lock:
                    answers = await client.publish_batch(
                        batch.key,
                        batch.payloads,
                        batch.producer_id,
                        batch.first_sequence,
                        key_partition=batch.extras.key_partition,
                        tags=batch.extras.tags,
                        uid=batch.extras.uid,
                    )
                acked = list(await client.wait_batch(answers))
        finally:
            batch.client = None
            self._notify()
        self._leaders[batch.key] = batch.address
        return acked

    def _failed(self, batch: _Batch, exc: Exception) -> str | None:
        """Handle a failed attempt; the address to try next (None: any).
        Raises ``exc`` if it is not retriable."""
        refusal = exc if isinstance(exc, BrokyError) else None
        target = batch.address
        found = self._clients.get(target) if target is not None else None
        if isinstance(exc, (trio.TooSlowError, AckTimeout)) and found is not None:
            # A paused node: a graceful close would wait on it for ever.
            found[0].abort(f"{target} did not answer within {ATTEMPT_TIMEOUT} s")
        lost = found is None or found[0].closed
        if isinstance(exc, ConnectionClosed) or refusal is None or lost:
            if target is not None:
                self._drop(target)  # a refusal leaves the connection usable
            return self._seed()
        if refusal.code not in RETRIABLE:
            raise exc
        if refusal.code is ErrorCode.NOT_LEADER:
            return leader_address(str(refusal)) or self._seed()
        return target

    def _related(self, one: _Batch, other: _Batch) -> bool:
        """Whether the two batches may go to one partition."""
        partition = self._partitions.get(one.route)
        return partition is None or self._partitions.get(other.route, partition) == partition

    def _may_send(self, batch: _Batch, client: Client) -> bool:
        """Every earlier related batch is in flight on ``client`` and no
        later one is in flight (module docstring), and none of the earlier
        ones is of another producer id: those must be acked or given up
        first. Queued behind one on a connection is not enough there: a
        partition holds back only its own producer's later runs
        (``SequenceGap``), so the other producer's batch could be stored
        while the earlier one is refused, which then lands after it once its
        hold is gone (a new leader never saw it): acked, out of call order.
        Only after a give-up (a new producer id) does this wait."""
        for other in self._batches:
            if other is batch or not self._related(batch, other):
                continue
            if other.order < batch.order and (
                other.client is not client or other.producer_id != batch.producer_id
            ):
                return False
            if other.order > batch.order and other.client is not None:
                return False
        return True

    def _ahead(self, batch: _Batch) -> str | None:
        """The address of the latest earlier related batch in flight, which
        this one must follow on the same connection."""
        for other in reversed(self._batches):
            if (
                other.order < batch.order
                and other.client is not None
                and self._related(batch, other)
            ):
                return other.address
        return None

    def _learn(self, batch: _Batch, acked: list[AckedRun]) -> None:
        """Remember the partition the batch's key went to (if one)."""
        partitions = {run.partition for run in acked}
        if len(partitions) == 1:
            self._partitions[batch.route] = partitions.pop()

    def _notify(self) -> None:
        self._changed.set()

    async def _wait_changed(self) -> None:
        if self._changed.is_set():
            self._changed = trio.Event()
        await self._changed.wait()

    def _seed(self) -> str:
        self._next_seed += 1
        return self.seeds[self._next_seed % len(self.seeds)]

    async def _client(self, address: str) -> tuple[Client, trio.Lock]:
        """The open connection to ``address``, made by one task at a time
        (a second one made meanwhile would be left open, unknown to ``_drop``)."""
        while address in self._connecting:
            await self._connecting[address].wait()
        found = self._clients.get(address)
        if found is not None and not found[0].closed:
            return found[0], found[2]
        self._drop(address)
        self._connecting[address] = connected = trio.Event()
        try:
            client: Client = await self._nursery.start(self._hold, address)
        finally:
            del self._connecting[address]
            connected.set()
        return client, self._clients[address][2]

    async def _hold(self, address: str, *, task_status: trio.TaskStatus[Client]) -> None:
        """One connection, open until dropped or broken (its errors surface
        in ``publish`` as a closed client, not here)."""
        stop = trio.Event()
        started = False
        try:
            async with self.credentials.connect(
                address, self.name, self.ssl_context, idempotent=bool(self.producer_id)
            ) as client:
                # A lost connection fails the batch at once: this publisher
                # retries it on whichever node leads now, not on this one.
                client.retry_timeout = 0.0
                self._clients[address] = (client, stop, trio.Lock())
                task_status.started(client)
                started = True
                await stop.wait()
        except (BrokyError, OSError, trio.BrokenResourceError):
            if not started:
                raise
        finally:
            found = self._clients.get(address)
            if found is not None and found[1] is stop:
                del self._clients[address]
            self._notify()

    def _drop(self, address: str) -> None:
        found = self._clients.pop(address, None)
        if found is not None:
            found[1].set()
