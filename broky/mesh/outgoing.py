"""The send side of a broker-to-broker connection: frames queued, one writer task.

A router link (broky.mesh.link) and a durable owner channel
(broky.durable.owner_channel) both dial a peer as a client would and send
it frames from the trio thread, where nothing may wait: ``put`` queues the
encoded frame and wakes the writer, which sends everything queued since its
last write in one ``send_all``, in queueing order. Each new session starts
the queue afresh with its preamble and Hello (``restart``); what was queued
for a lost session is dropped with it (its requests have failed by then).

No bound of its own, as before this was shared: each user bounds what it
queues (a link queues interest changes only; an owner channel's forwarded
publishes are held to FORWARD_CREDIT_BYTES, its other requests to what its
clients have outstanding).
"""

from __future__ import annotations

from typing import NoReturn

import trio


class OutgoingFrames:
    """Encoded frames waiting for the connection's writer task."""

    def __init__(self) -> None:
        self._frames: list[bytes] = []
        self._work = trio.Event()

    def put(self, data: bytes) -> None:
        """Queue ``data`` (whole frames) behind what is queued; never waits."""
        self._frames.append(data)
        self._work.set()

    def restart(self, first: list[bytes]) -> None:
        """Drop what is queued and queue ``first`` (a new session's opening frames)."""
        self._frames = first
        self._work.set()

    async def write_to(self, stream: trio.abc.Stream) -> NoReturn:
        """Send what is queued to ``stream`` until cancelled or the stream fails."""
        while True:
            if not self._frames:
                await self._work.wait()
                self._work = trio.Event()
            data = b"".join(self._frames)
            self._frames = []
            if data:
                await stream.send_all(data)
