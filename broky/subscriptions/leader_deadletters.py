"""Dead letters whose dead-letter partition another node leads.

In a replicated cluster the dead-letter topic's partition (the built-in
``_dlq``, or the one a subscription chose) may be led by another node than
the partition whose subscription dead-letters a message. This node's own
append is then refused with ``NotLeader``, naming the leader; retried here
it would be refused forever and the message would loop.

So such a dead letter is published to the leader as a client would, with
acks, through one :class:`~broky.client.cluster.ClusterPublisher` per
worker (it follows ``NotLeader`` redirects and failovers by itself, and its
retries are idempotent: one producer id, its own sequences, so a retried
batch the old leader had replicated is not stored twice). The original is
acked only once that publish is acked (``done("")``); a failure hands it
back to the partition's retry list, as a local append failure does. A
crash in between leaves the original unacked: it is dead-lettered again,
and the copies carry the same ``dlq.*`` tags to de-duplicate on
(at-least-once, as locally).

Publishes go one at a time, from one task (the cluster publisher could
keep several in flight, but dead letters are rare, so that is no
bottleneck). The queue is bounded (``PENDING_LIMIT``): past it a dead letter
is refused at once and retried by the partition's next rounds.

The publisher connects as the node itself, with the node's
``cluster_token`` (the credentials its cluster links present): with
``[[users]]`` configured an anonymous connection is refused, and every
dead letter would go back to its partition's retry list for ever. The
token's principal needs ``link = true`` on the peers, and may publish the
dead-letter keys (a user's default ``publish`` is every key). Where the
nodes' client ports speak TLS it connects with the node's own trust and
certificate (``Config.peer_client_context``): a plain connection would be
refused the same way.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Final

import attrs
import trio

from broky.client.cluster import ClusterPublisher
from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.errors import BrokyError
from broky.protocol.message import Message

log = logging.getLogger("broky.subscriptions")

#: Dead letters waiting for the leader at once (each holds one message,
#: up to the frame limit; 256 x 1 MiB at worst, usually a few KiB).
PENDING_LIMIT: Final = 256
#: Seconds a dead letter may take to be acked by the leader, retries and
#: failovers included, before it goes back to its partition's retry list.
RETRY_FOR: Final = 10.0

#: ``done(failure)``: "" once the leader acked the copy, else why not.
Done = Callable[[str], None]


@attrs.frozen
class _Pending:
    key: str
    message: Message
    done: Done


class LeaderDeadLetters:
    """One worker's dead letters on their way to other nodes (module docstring)."""

    def __init__(
        self,
        name: str,
        credentials: Credentials = ANONYMOUS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._name = name
        self._credentials = credentials
        self._ssl_context = ssl_context
        self._send, self._receive = trio.open_memory_channel[_Pending](PENDING_LIMIT)
        self._publisher: ClusterPublisher | None = None
        #: Leaders named by refusals; the publisher's seeds.
        self._seeds: list[str] = []
        self.sent = 0

    def send(self, leader: str, key: str, message: Message, done: Done) -> None:
        """Publish ``message`` on ``key`` to ``leader`` (or wherever it
        redirects); ``done`` is called once, never from inside this call."""
        if leader not in self._seeds:
            self._seeds.append(leader)
            if self._publisher is not None:
                self._publisher.seeds.append(leader)
        try:
            self._send.send_nowait(_Pending(key, message, done))
        except trio.WouldBlock:
            done(f"{PENDING_LIMIT} dead letters already wait for other nodes' leaders")

    async def run(self) -> None:
        """Publish what ``send`` queued until cancelled (a task of the
        worker's subscription service)."""
        first = await self._receive.receive()  # no connections before one is needed
        async with ClusterPublisher.open(
            list(self._seeds),
            retry_for=RETRY_FOR,
            name=self._name,
            credentials=self._credentials,
            ssl_context=self._ssl_context,
        ) as publisher:
            self._publisher = publisher
            await self._publish(publisher, first)
            async for pending in self._receive:
                await self._publish(publisher, pending)

    async def _publish(self, publisher: ClusterPublisher, pending: _Pending) -> None:
        message = pending.message
        try:
            await publisher.publish(
                pending.key,
                [message.payload],
                key_partition=message.key_partition,
                tags=message.tags,
                uid=message.uid,
            )
        except (BrokyError, OSError) as exc:
            log.warning("dead letter on %r not acked by its leader: %s", pending.key, exc)
            pending.done(str(exc) or repr(exc))
            return
        self.sent += 1
        pending.done("")
