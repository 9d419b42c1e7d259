"""Durable topics on every worker: requests for another worker's partitions.

Each partition has one owner worker (broky.durable.ownership). A client may
be connected to any worker (the *ingress*); what it asks of a partition the
ingress does not own travels to the owner over an :class:`OwnerChannel`,
an ordinary protocol connection from the ingress to the owner's private
Unix socket with ``Hello.link = Durable``. The ingress speaks to the owner
as a client would, so the owner serves it with the code that serves clients
(appends, group commit, acks, replays, Fetch):

- **Acked publish.** Runs for the owner's partitions are sent whole (the
  chunk as the client sent it, no re-encode) in one acked Publish frame per
  client frame, on stream 1. The owner's PublishAcks come back in frame
  order, so the n-th ack answers the n-th forwarded frame (its ``sequence``
  is the request id, checked); each entry is handed to the client's ticket,
  and the client's own ack leaves once all its parts are acked.
- **Credit.** At most ``FORWARD_CREDIT_BYTES`` of forwarded publishes are
  unacknowledged per (ingress, owner) pair; past that the ingress stops
  reading its publishers' sockets (TCP backpressure, like the store's own
  bound), and nothing is ever dropped.
- **Lanes.** One socket per direction of each worker pair: on a channel the
  ingress writes requests and the owner writes answers, so acks and
  deliveries never wait behind requests, whatever either side's backlog.
- **Consume.** A client subscription whose pattern overlaps durable topics
  gets, on every other worker owning some of their partitions, a
  subscription with the same pattern and start position. The owner replays
  its partitions and continues live with its usual no-gap, no-duplicate
  seam; the ingress pushes what arrives into the client's subscription and
  gives the owner more credit only for what fits in the lower half of the
  client's outbox (by messages and by bytes), so a replay never overflows
  it. Fetch and ListPartitions are forwarded and answered on the
  client's stream.
- **Durable subscriptions.** A client's ``Consume`` reaching the owner's
  partitions is relayed as a ``Consume`` on a stream of the channel
  (broky.durable.consumer_relays); what the owner answers on such a stream
  goes to the channel's ``consumer_parts``.
- **Failure.** When a channel goes down (the owner died or is restarting),
  or the oldest forwarded publish waited ``FORWARD_TIMEOUT`` (a stalled
  owner), every outstanding request fails at once with ``OwnerUnavailable``
  (retriable: none of those messages was acknowledged), relayed
  subscriptions end with that error, and new requests for the owner's
  partitions fail at once until it is back. The channel reconnects within
  ``MAX_BACKOFF`` of the owner's return (broky.durable.owner_channel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import trio

from broky.durable.acks import AckQueue, AckTicket
from broky.durable.owner_channel import OwnerChannel
from broky.durable.producers import Identity
from broky.mesh.link import Connector
from broky.protocol.codec import encode_frame
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES, ErrorCode, StartKind
from broky.protocol.frames import Error, Run
from broky.router.outbox import Subscription
from broky.router.router import Router
from broky.storage.topics import TopicPolicy

#: Unacknowledged forwarded publish bytes per (ingress, owner) pair before
#: the ingress stops reading publishers: 8 MiB is ~80k messages of 100 bytes,
#: several group commits of the owner, and bounds the ingress's memory for
#: one owner whatever the number of publishers.
FORWARD_CREDIT_BYTES: Final = 8 * 1024 * 1024
#: Most bytes of runs in one forwarded Publish frame (half the node's
#: ``max_frame_bytes`` if that is less): a client frame split by partition
#: grows by a run header per piece, and must still fit the owner's limit.
FORWARD_FRAME_BYTES: Final = 1024 * 1024


class Forwarder:
    """One worker's channels to the owners of the partitions it does not own."""

    def __init__(
        self,
        router: Router,
        worker: int,
        owner_index: Callable[[str, int], int],
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self._router = router
        #: Gathered runs past this size leave as a forwarded frame at once.
        self.frame_bytes = min(FORWARD_FRAME_BYTES, max_frame_bytes // 2)
        self.worker = worker
        self._owner_index = owner_index
        self.channels: dict[int, OwnerChannel] = {}
        self._room = trio.Event()

    def add_channel(self, owner: int, connect: Connector, name: str) -> OwnerChannel:
        channel = OwnerChannel(self, owner, connect, name)
        self.channels[owner] = channel
        return channel

    def append(
        self,
        topic: TopicPolicy,
        partition: int,
        run: Run,
        ticket: AckTicket | None,
        acks: AckQueue | None,
        run_index: int,
        identity: Identity | None = None,
    ) -> None:
        """Gather a run for its partition's owner (sent by ``flush``); the
        store's ``forward`` hook."""
        owner = self._owner_index(topic.name, partition)
        channel = self.channels.get(owner)
        if channel is None:
            if ticket is not None:
                ticket.failed(f"no channel to worker {owner}", ErrorCode.OWNER_UNAVAILABLE)
            return
        channel.add(topic, partition, run, ticket, acks, run_index, identity)

    def flush(self) -> None:
        for channel in self.channels.values():
            channel.flush()

    @property
    def congested(self) -> bool:
        """Some owner holds FORWARD_CREDIT_BYTES unacknowledged: stop reading."""
        return any(
            channel.publishes.in_flight_bytes >= FORWARD_CREDIT_BYTES
            for channel in self.channels.values()
        )

    async def wait_for_room(self) -> None:
        while self.congested:
            if self._room.is_set():
                self._room = trio.Event()
            await self._room.wait()

    def room_changed(self) -> None:
        if not self.congested:
            self._room.set()

    def run_direct_writes(self) -> None:
        """Let connections woken by answers write at once (see Router.direct_writes)."""
        if self._router.direct_writes:
            self._router.run_direct_writes()

    def owner_confirmed(self, subscription: Subscription) -> None:
        """An owner registered its share of ``subscription``: its live runs flow."""
        self._router.confirm(subscription, owner=True)
        self.run_direct_writes()

    def end_subscription(self, subscription: Subscription, code: ErrorCode, message: str) -> None:
        """End a client subscription a relay can no longer serve."""
        if subscription.closed:
            return
        outlet = subscription.outlet
        self._router.unsubscribe(outlet, subscription.stream)
        outlet.send_control(encode_frame(Error(code, message, subscription.stream)))

    def subscribe(
        self,
        subscription: Subscription,
        owners: set[int],
        start: StartKind,
        start_time: int,
        start_offsets: tuple[int, ...],
    ) -> None:
        """Relay the shares of ``owners`` (other workers) of a client subscription."""
        for owner in sorted(owners):
            channel = self.channels.get(owner)
            if channel is None or not channel.subscribe(
                subscription, start, start_time, start_offsets
            ):
                self.end_subscription(
                    subscription,
                    ErrorCode.OWNER_UNAVAILABLE,
                    f"worker {owner}, owner of some partitions of this subscription, is "
                    "unavailable (restarting?); subscribe again shortly",
                )
                return

    @property
    def forwarded_messages(self) -> int:
        return sum(channel.publishes.acked_messages for channel in self.channels.values())
