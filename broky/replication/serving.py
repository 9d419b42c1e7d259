"""The leader side of replication connections: answer requests, count
durable-end reports.

A follower node's link (broky.replication.node_link) has one request out
at a time, so requests are answered in turn; but its ``DurableMany``
reports, unanswered, come while its next fetch waits in a long poll here
(the follower sent that fetch before its fsync returned). So one task reads
the connection and applies each report the moment it arrives (the high
watermark may pass a held round then), and another answers the requests
the reader hands it, one at a time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping

import trio

from broky.replication.faults import LinkSwitch
from broky.replication.gate import PartitionReplica, fetch_all, not_here
from broky.replication.link import ReplicationLink
from broky.replication.wire import (
    DurableMany,
    EpochEnd,
    Fetch,
    FetchedMany,
    FetchMany,
    Message,
    Progress,
    ProgressRequest,
    RefusalReason,
    Refused,
    ReplicationProtocolError,
)
from broky.storage.errors import StorageError

log = logging.getLogger("broky.replication")

#: What ends a connection quietly: the peer went away.
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class LinkServer:
    """Serves the replication connections of one member (its listener's
    handler is ``serve``); ``replicas`` is the member's, read only."""

    def __init__(
        self,
        replicas: Mapping[tuple[str, int], PartitionReplica],
        switch: LinkSwitch,
        progress: Callable[[], Progress],
    ) -> None:
        self.replicas = replicas
        self.switch = switch
        self.progress = progress

    async def serve(self, stream: trio.SocketStream) -> None:
        """One connection, until the peer closes it, sends garbage or the
        links are cut."""
        link = ReplicationLink(stream)
        async with stream:
            if self.switch.cut:
                return
            try:
                with self.switch.link():
                    await self.serve_link(link)
            except* ReplicationProtocolError as group:
                error = group.exceptions[0]
                log.warning("replication link from %s closed: %s", _peer(stream), error)
                with contextlib.suppress(*_GONE):
                    await link.send(
                        Refused(RefusalReason.NOT_LEADER, 0, f"protocol error: {error}")
                    )
            except* StorageError as group:
                # Our log failed a read (retention passed the follower, damage):
                # the follower reconnects and the ISR rules judge its lag.
                log.error("replication link from %s closed: %s", _peer(stream), group.exceptions[0])
            except* _GONE:
                pass

    async def serve_link(self, link: ReplicationLink) -> None:
        """``serve`` past the stream: until the peer closes ``link``."""
        # One slot: a follower has one request out at a time; a peer that
        # sends more waits for TCP, it is not buffered here.
        requests, waiting = trio.open_memory_channel[Message](1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._answer_each, link, waiting)
            async with requests:
                while (message := await link.receive()) is not None:
                    if isinstance(message, DurableMany):
                        self._take_durable(message)
                    else:
                        await requests.send(message)
            nursery.cancel_scope.cancel()  # the peer closed: nobody to answer

    def _take_durable(self, reports: DurableMany) -> None:
        for report in reports.durables:
            replica = self.replicas.get((report.topic, report.partition))
            if replica is not None:
                replica.take_durable(report)

    async def _answer_each(
        self, link: ReplicationLink, waiting: trio.MemoryReceiveChannel[Message]
    ) -> None:
        async for request in waiting:
            await link.send(await self._answer(request))

    async def _answer(self, request: Message) -> Message:
        if isinstance(request, ProgressRequest):
            return self.progress()
        if isinstance(request, FetchMany):
            replicas = self.replicas
            fetches = [(replicas.get((f.topic, f.partition)), f) for f in request.fetches]
            return FetchedMany(tuple(await fetch_all(fetches)))
        if not isinstance(request, Fetch | EpochEnd):
            raise ReplicationProtocolError(f"{type(request).__name__} is not a request")
        replica = self.replicas.get((request.topic, request.partition))
        if replica is None:
            return not_here(request)
        if isinstance(request, EpochEnd):
            return replica.epoch_end(request)
        return await replica.fetch(request)


def _peer(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername())
    except OSError:
        return "?"
