"""The ingress side of one channel to an owner worker (broky.durable.forwarding).

An OwnerChannel is an ordinary protocol connection from this worker (the
ingress) to the private Unix socket of the worker owning some partitions,
with ``Hello.link = Durable``: requests are queued without waiting on the
trio thread and written by the channel's writer task; the reader hands the
owner's answers to their requests, relays and consumer parts. When the
channel goes down everything outstanding fails at once with
``OwnerUnavailable`` and the channel reconnects with a short backoff. The
``Forwarder`` (broky.durable.forwarding) owns one channel per owner.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Final, cast

import attrs
import trio

from broky.durable.acks import AckQueue, AckTicket
from broky.durable.forwarded import PUBLISH_STREAM, ForwardedPublishes
from broky.durable.producers import Identity
from broky.durable.relays import (
    RELAY_START_CREDIT,
    ChannelConsumer,
    ConsumerFrame,
    PartitionListing,
    Relay,
)
from broky.mesh.link import Connector
from broky.mesh.outgoing import OutgoingFrames
from broky.protocol.chunks import encode_chunk, runs_frame_parts
from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    BodyType,
    ErrorCode,
    LinkKind,
    SlowConsumerPolicy,
    StartKind,
)
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import (
    Deliver,
    Error,
    Fetch,
    Fetched,
    Flow,
    Frame,
    Hello,
    ListPartitions,
    LocatedDeliver,
    Notice,
    Partitions,
    Ping,
    Pong,
    PublishAck,
    Run,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Welcome,
)
from broky.router.outbox import Outlet, Subscription
from broky.storage.topics import TopicPolicy

if TYPE_CHECKING:
    # Types only: the forwarder creates its channels (no import cycle at run time).
    from broky.durable.forwarding import Forwarder

log = logging.getLogger("broky.forwarding")

#: Seconds the oldest forwarded publish may wait for its ack before the
#: owner counts as stalled and everything outstanding fails (retriable).
FORWARD_TIMEOUT: Final = 10.0
#: How often a channel returns relay credit and notices closed
#: subscriptions and stalled owners.
CHECK_SECONDS: Final = 0.02
#: Reconnection pauses: a restarted owner is found within MAX_BACKOFF.
INITIAL_BACKOFF: Final = 0.02
MAX_BACKOFF: Final = 0.25
RECEIVE_BYTES: Final = 256 * 1024


class OwnerUnavailable(Exception):
    """The channel to an owner went down or stalled (carried to clients as
    ``ErrorCode.OWNER_UNAVAILABLE``)."""


def _shutting_down(problem: BaseException) -> bool:
    """Whether the owner closed the channel because it is stopping (logged
    at info: a clean stop of the node is not a fault)."""
    return "SERVER_SHUTDOWN" in str(problem)


@attrs.define(slots=True, eq=False)
class _Answer:
    """Where an owner's answer to a Fetch goes: the client's outlet and stream."""

    outlet: Outlet
    stream: int


class OwnerChannel:
    """The ingress side of the connection to one owner worker (module docstring)."""

    def __init__(self, forwarder: Forwarder, owner: int, connect: Connector, name: str) -> None:
        self._forwarder = forwarder
        self.owner = owner
        self._connect = connect
        self.name = name
        self.connected = False
        self.ready = trio.Event()
        #: Frames for the peer and the writer task sending them (broky.mesh.outgoing).
        self._outgoing = OutgoingFrames()
        self._stream_ids = itertools.count(PUBLISH_STREAM + 1)
        self.publishes = ForwardedPublishes(forwarder.frame_bytes)
        self._relays: dict[int, Relay] = {}
        self._fetches: dict[int, _Answer] = {}
        self._listings: dict[int, PartitionListing] = {}
        #: Relayed consumers' parts by channel stream.
        self.consumer_parts: dict[int, ChannelConsumer] = {}

    # --- requests (trio thread, never waiting) ----------------------------------

    def _send(self, data: bytes) -> None:
        self._outgoing.put(data)

    def send(self, data: bytes) -> None:
        """Queue a request frame (a relayed consumer's); sent in order."""
        self._send(data)

    def new_stream(self) -> int:
        """A stream id of this channel, unused by any other request."""
        return next(self._stream_ids)

    def _unavailable(self, what: str) -> str:
        return (
            f"worker {self.owner}, owner of {what}, is unavailable (restarting?); "
            "nothing was stored, retry shortly"
        )

    def add(
        self,
        topic: TopicPolicy,
        partition: int,
        run: Run,
        ticket: AckTicket | None,
        acks: AckQueue | None,
        run_index: int,
        identity: Identity | None = None,
    ) -> None:
        """Gather a run for the owner; ``flush`` sends what was gathered."""
        if not self.connected:
            if ticket is not None:
                ticket.failed(
                    self._unavailable(f"{topic.name}/{partition}"), ErrorCode.OWNER_UNAVAILABLE
                )
            return
        if self.publishes.add(run, ticket, acks, run_index, identity):
            self.flush()  # a client frame split into pieces may outgrow a frame

    def flush(self) -> None:
        """Send the gathered runs as one acked Publish frame."""
        data = self.publishes.take_frame(trio.current_time())
        if data is not None:
            self._send(data)

    def subscribe(
        self,
        subscription: Subscription,
        start: StartKind,
        start_time: int,
        start_offsets: tuple[int, ...],
    ) -> bool:
        """Serve the owner's share of ``subscription``; False if the owner is down."""
        if not self.connected:
            return False
        stream = next(self._stream_ids)
        self._relays[stream] = Relay(subscription)
        self._send(
            encode_frame(
                Subscribe(
                    stream,
                    subscription.pattern,
                    SlowConsumerPolicy.DROP,
                    RELAY_START_CREDIT,
                    start,
                    start_time,
                    start_offsets,
                )
            )
        )
        return True

    def fetch(self, frame: Fetch, budget: int, outlet: Outlet) -> bool:
        """Forward a Fetch; the answer goes to ``outlet`` on the client's stream."""
        if not self.connected:
            return False
        stream = next(self._stream_ids)
        self._fetches[stream] = _Answer(outlet, frame.stream)
        self._send(encode_frame(Fetch(stream, frame.topic, frame.partition, frame.offset, budget)))
        return True

    def list_partitions(self, topic: str, listing: PartitionListing) -> None:
        """Ask the owner for its partitions of ``topic`` ("" for all)."""
        if not self.connected:
            listing.fail(self._unavailable("some partitions"))
            return
        stream = next(self._stream_ids)
        self._listings[stream] = listing
        self._send(encode_frame(ListPartitions(stream, topic)))

    # --- the connection -----------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, reconnect: until cancelled."""
        backoff = INITIAL_BACKOFF
        while True:
            try:
                stream = await self._connect()
            except OSError as exc:
                log.debug("channel %s: connect failed: %s", self.name, exc)
            else:
                try:
                    await self._session(stream)
                except* (
                    trio.BrokenResourceError,
                    trio.ClosedResourceError,
                    OSError,
                    RemoteProtocolError,
                    OwnerUnavailable,
                ) as group:
                    problem = group.exceptions[0]
                    level = logging.INFO if _shutting_down(problem) else logging.WARNING
                    log.log(level, "channel %s: down: %s", self.name, problem)
                finally:
                    self._down()
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        await stream.aclose()
                backoff = INITIAL_BACKOFF
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _session(self, stream: trio.abc.Stream) -> None:
        machine = ProtocolMachine(Role.CLIENT, DEFAULT_MAX_FRAME_BYTES)
        self._outgoing.restart(
            [
                machine.initiate(),
                encode_frame(Hello(client_name=self.name, link=LinkKind.DURABLE)),
            ]
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._outgoing.write_to, stream)
            nursery.start_soon(self._check)
            await self._reader(stream, machine)
            nursery.cancel_scope.cancel()

    async def _check(self) -> None:
        """Return relay credit, forget closed subscriptions, notice a stall."""
        while True:
            await trio.sleep(CHECK_SECONDS)
            for stream, relay in list(self._relays.items()):
                self._grant(stream, relay)
            oldest = self.publishes.oldest_sent_at
            if oldest is not None and trio.current_time() - oldest > FORWARD_TIMEOUT:
                raise OwnerUnavailable(
                    f"worker {self.owner} acknowledged nothing for {FORWARD_TIMEOUT} s"
                )

    def _grant(self, stream: int, relay: Relay) -> None:
        if relay.subscription.closed:
            del self._relays[stream]
            if self.connected:
                self._send(encode_frame(Unsubscribe(stream)))
            return
        credit = relay.grant()
        if credit:
            self._send(encode_frame(Flow(stream, credit)))

    async def _reader(self, stream: trio.abc.Stream, machine: ProtocolMachine) -> None:
        while True:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise trio.BrokenResourceError("the owner closed the channel")
            for received in machine.receive_deliveries(data):
                if type(received) is PublishAck:
                    self.publishes.acked(received, self.owner)
                    self._forwarder.room_changed()
                    continue
                if (
                    self.consumer_parts
                    and isinstance(received, ConsumerFrame)
                    and (part := self.consumer_parts.get(received.stream)) is not None
                ):
                    part.receive(received)
                    continue
                # Only a spread consumer's part takes a Deliver left in the frame.
                frame = (
                    decode_frame(received.buffer)
                    if type(received) is LocatedDeliver
                    else cast(Frame, received)
                )
                if type(frame) is Deliver:
                    relay = self._relays.get(frame.stream)
                    if relay is not None:  # else unsubscribed meanwhile
                        relay.receive(frame.runs)
                        self._grant(frame.stream, relay)
                elif type(frame) is Fetched:
                    self._fetched(frame)
                elif type(frame) is Partitions:
                    self._listed(frame)
                elif type(frame) is Error:
                    self._error(frame)
                elif type(frame) is Notice:
                    relay = self._relays.get(frame.stream)
                    if relay is not None and not relay.subscription.closed:
                        relay.dropped(frame.count)
                elif type(frame) is Subscribed:
                    relay = self._relays.get(frame.stream)
                    if relay is not None:
                        self._forwarder.owner_confirmed(relay.subscription)
                elif type(frame) is Welcome:
                    self.connected = True
                    self.ready.set()
                    log.info("channel %s: connected", self.name)
                elif type(frame) is Ping:
                    self._send(encode_frame(Pong(frame.nonce)))
            self._forwarder.run_direct_writes()

    # --- answers ------------------------------------------------------------------

    def _fetched(self, frame: Fetched) -> None:
        answer = self._fetches.pop(frame.stream, None)
        if answer is not None:
            chunks = [encode_chunk(run) for run in frame.runs]
            answer.outlet.send_control(
                b"".join(runs_frame_parts(BodyType.FETCHED, answer.stream, chunks))
            )

    def _listed(self, frame: Partitions) -> None:
        listing = self._listings.pop(frame.stream, None)
        if listing is not None:
            entries = zip(
                frame.topics, frame.partitions, frame.start_offsets, frame.end_offsets, strict=True
            )
            listing.add(list(entries))

    def _error(self, frame: Error) -> None:
        stream = frame.stream
        if stream == 0:
            raise OwnerUnavailable(f"owner error: {frame.code.name}: {frame.message}")
        if stream == PUBLISH_STREAM:
            self.publishes.refused(frame.code, frame.message)
            self._forwarder.room_changed()
            return
        answer = self._fetches.pop(stream, None)
        if answer is not None:
            answer.outlet.send_control(
                encode_frame(Error(frame.code, frame.message, answer.stream))
            )
            return
        listing = self._listings.pop(stream, None)
        if listing is not None:
            if frame.code is ErrorCode.UNKNOWN_TOPIC:
                listing.add([])  # the owner has no partition of that topic
            else:
                listing.fail(frame.message)
            return
        relay = self._relays.pop(stream, None)
        if relay is not None:
            self._forwarder.end_subscription(relay.subscription, frame.code, frame.message)

    def _down(self) -> None:
        """Fail everything outstanding (see the module docstring)."""
        self.connected = False
        reason = (
            f"worker {self.owner}, the owner of the partition, went down or stalled before "
            "acknowledging; nothing of this frame was acknowledged, retry"
        )
        failed = self.publishes.fail_all(ErrorCode.OWNER_UNAVAILABLE, reason)
        fetches, self._fetches = self._fetches, {}
        for answer in fetches.values():
            answer.outlet.send_control(
                encode_frame(Error(ErrorCode.OWNER_UNAVAILABLE, reason, answer.stream))
            )
        listings, self._listings = self._listings, {}
        for listing in listings.values():
            listing.fail(reason)
        parts, self.consumer_parts = self.consumer_parts, {}
        for part in parts.values():
            part.down()
        relays, self._relays = self._relays, {}
        for relay in relays.values():
            self._forwarder.end_subscription(
                relay.subscription,
                ErrorCode.OWNER_UNAVAILABLE,
                f"worker {self.owner}, owner of some partitions of this subscription, went "
                "down; resubscribe from the last offsets received",
            )
        self._forwarder.room_changed()
        self._forwarder.run_direct_writes()
        if failed:
            log.warning("channel %s: %d forwarded frames failed", self.name, failed)
