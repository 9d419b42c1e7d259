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

Batches are published one at a time (``publish`` calls do not overlap): a
partition must see a producer's sequences in order, and a batch retried on a
new leader must not be overtaken by a later one, or the retry would be
refused as out of order (Kafka's idempotent producer keeps the same rule
with its in-flight limit).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Final, NamedTuple

import trio

from broky.client.client import Client
from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.durable import AckedRun
from broky.client.errors import AckTimeout, BrokyError, ConnectionClosed
from broky.protocol.constants import ErrorCode

#: Refusals after which the same batch may be sent again (somewhere else).
RETRIABLE: Final = frozenset(
    {ErrorCode.NOT_LEADER, ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.OWNER_UNAVAILABLE}
)
#: First pause between attempts; doubles up to MAX_BACKOFF, which stays
#: short because failover takes about a lease TTL (1 s) and each attempt
#: costs one connect or one refused frame.
FIRST_BACKOFF: Final = 0.02
MAX_BACKOFF: Final = 0.2
#: Seconds an attempt (connect, publish, ack) may take before the node is
#: taken for dead or paused and the next one is tried.
ATTEMPT_TIMEOUT: Final = 3.0

_LEADER = re.compile(r"leader (\S+) at (\S+) \(epoch (\d+)\)")


class _Extras(NamedTuple):
    """What every message of a batch carries besides its payload."""

    key_partition: bytes
    tags: Sequence[tuple[str, str]]
    uid: bytes


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
    ) -> None:
        if not seeds:
            raise ValueError("a cluster publisher needs at least one seed address")
        self._nursery = nursery
        self.seeds = list(seeds)
        self.retry_for = retry_for
        self.name = name
        #: Presented on every connection (to each node it is sent to).
        self.credentials = credentials
        #: TLS for every connection (None: plain TCP).
        self.ssl_context = ssl_context
        #: Attempts that were refused or failed and retried.
        self.retries = 0
        self._clients: dict[str, tuple[Client, trio.Event]] = {}
        self._next_seed = 0
        #: The node that last acked each key (bounded by the keys used).
        self._leaders: dict[str, str] = {}
        #: One producer for every node (0: not idempotent), and the sequence
        #: of the next batch's first message.
        self.producer_id = (secrets.randbits(64) or 1) if idempotent else 0
        self._next_sequence = 1
        self._one_batch = trio.Lock()

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
    ) -> AsyncIterator[ClusterPublisher]:
        async with trio.open_nursery() as nursery:
            publisher = cls(nursery, seeds, retry_for, name, idempotent, credentials, ssl_context)
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
        offsets once acked. Raises the last BrokyError after ``retry_for``
        (the batch may then be stored or not; a later batch is not held
        back by it). Calls wait for each other (module docstring). ``tags``
        and ``uid`` go with every message of the batch."""
        async with self._one_batch:
            first_sequence = self._next_sequence
            self._next_sequence += len(payloads)
            return await self._publish(
                key, payloads, _Extras(key_partition, tags, uid), first_sequence
            )

    async def _publish(
        self, key: str, payloads: Sequence[bytes], extras: _Extras, first_sequence: int
    ) -> list[AckedRun]:
        deadline = trio.current_time() + self.retry_for
        address = self._leaders.get(key) or self._seed()
        backoff = FIRST_BACKOFF
        while True:
            try:
                with trio.fail_after(ATTEMPT_TIMEOUT):
                    client = await self._client(address)
                    if self.producer_id:
                        client.continue_producer(self.producer_id, first_sequence)
                    for payload in payloads:
                        await client.publish(
                            key,
                            payload,
                            key_partition=extras.key_partition,
                            tags=extras.tags,
                            uid=extras.uid,
                            ack=True,
                        )
                    acked = list(await client.flush_acks())
                    self._leaders[key] = address
                    return acked
            except (BrokyError, trio.TooSlowError, OSError) as exc:
                error = exc
                refusal = exc if isinstance(exc, BrokyError) else None
                found = self._clients.get(address)
                lost = found is None or found[0].closed
                if isinstance(exc, (trio.TooSlowError, AckTimeout)) and found is not None:
                    # A paused node: a graceful close would wait on it for ever.
                    found[0].abort(f"{address} did not answer within {ATTEMPT_TIMEOUT} s")
                if isinstance(exc, ConnectionClosed) or refusal is None or lost:
                    self._drop(address)  # a refusal leaves the connection usable
                    address = self._seed()
                elif refusal.code not in RETRIABLE:
                    raise
                elif refusal.code is ErrorCode.NOT_LEADER:
                    address = leader_address(str(refusal)) or self._seed()
            self.retries += 1
            if trio.current_time() + backoff > deadline:
                if isinstance(error, BrokyError):
                    raise error
                raise ConnectionClosed(f"no node acked within {self.retry_for} s: {error!r}")
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _seed(self) -> str:
        self._next_seed += 1
        return self.seeds[self._next_seed % len(self.seeds)]

    async def _client(self, address: str) -> Client:
        found = self._clients.get(address)
        if found is not None and not found[0].closed:
            return found[0]
        self._drop(address)
        client: Client = await self._nursery.start(self._hold, address)
        return client

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
                self._clients[address] = (client, stop)
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

    def _drop(self, address: str) -> None:
        found = self._clients.pop(address, None)
        if found is not None:
            found[1].set()
