"""A connection's liveness clocks and its keepalive task.

Liveness counts complete frames, not bytes: a peer trickling a byte at a
time is not kept alive by them. Before the Hello a connection has
``handshake_timeout`` from its start; after it, a frame must complete within
``idle_timeout`` of the last one (a Ping goes out after
``heartbeat_interval`` of quiet); a frame being received instead has
``frame_timeout`` plus one second per MIN_FRAME_BYTES_PER_SECOND bytes
received so far. Time the broker chooses not to read (a quota throttle,
backpressure) counts against none of these. Every limit is stretched by the
connection's share of TIMEOUT_JITTER.

The connection's reader reports each read (``note_progress``) and wraps its
deliberate pauses in ``hold_reading``; ``run`` is the keepalive task.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import trio

from broky.protocol.codec import encode_frame
from broky.protocol.connection import ProtocolMachine, State
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Ping
from broky.router.outbox import Outlet

if TYPE_CHECKING:
    from broky.connection.settings import ConnectionSettings

#: Once a frame has had ``frame_timeout`` seconds, it must keep arriving at
#: least this fast (Kestrel's minimum data rate, in spirit): a 4 MiB frame
#: may take up to 74 s, a peer trickling a byte at a time is closed after the
#: grace. 64 KiB/s is far below any link a broker client uses.
MIN_FRAME_BYTES_PER_SECOND: Final = 64 * 1024
#: Timeouts fire up to this fraction of their limit late, at random per
#: connection: thousands of connections opened in one instant (a flood) then
#: time out spread over a while, not in one scheduling round that would
#: stall every other client's traffic behind thousands of closes.
TIMEOUT_JITTER: Final = 0.1


class Liveness:
    """One connection's clocks; see the module docstring."""

    def __init__(self, settings: ConnectionSettings, machine: ProtocolMachine) -> None:
        self._settings = settings
        self._machine = machine
        #: When the last complete frame arrived.
        self.last_received = trio.current_time()
        #: When the frame being received began (None: no frame in progress).
        self.frame_started: float | None = None
        #: True while the reader deliberately does not read.
        self.reading_held = False
        #: This connection's share of TIMEOUT_JITTER.
        self.stretch = 1.0 + random.random() * settings.timeout_jitter

    def note_progress(self, completed: bool) -> None:
        """Update the clocks after a read: a completed frame is activity; a
        frame left unfinished starts (or keeps) its deadline."""
        now = trio.current_time()
        if completed:
            self.last_received = now
        if not self._machine.partial_frame_bytes:
            self.frame_started = None
        elif completed or self.frame_started is None:
            self.frame_started = now

    async def hold_reading(self, wait: Callable[[], Awaitable[object]]) -> None:
        """Stop reading while ``wait`` runs; the time it takes counts against
        neither the idle timeout nor the frame deadline (the broker chose
        not to read, the peer was not slow)."""
        started = trio.current_time()
        self.reading_held = True
        try:
            await wait()
        finally:
            self.reading_held = False
        held = trio.current_time() - started
        self.last_received += held
        if self.frame_started is not None:
            self.frame_started += held

    async def run(self, outlet: Outlet) -> None:
        """Ping a quiet peer through ``outlet`` and fail it once it misses a deadline."""
        settings = self._settings
        machine = self._machine
        interval = settings.heartbeat_interval
        stretch = self.stretch
        opened = trio.current_time()
        nonce = 0
        while True:
            now = trio.current_time()
            if self.reading_held:
                await trio.sleep(min(interval, 1.0))
                continue
            partial_bytes = machine.partial_frame_bytes
            if machine.state is not State.OPEN:
                limit = settings.handshake_timeout * stretch
                deadline = opened + limit
                wake = min(deadline, now + interval)  # the Hello may come meanwhile
                problem = f"no Hello within {limit:.1f} s of connecting"
            elif self.frame_started is not None and partial_bytes:
                grace = settings.frame_timeout * stretch
                elapsed = now - self.frame_started
                deadline = self.frame_started + grace + partial_bytes / MIN_FRAME_BYTES_PER_SECOND
                wake = min(deadline, now + interval)  # the frame may end meanwhile
                problem = (
                    f"a frame arrived too slowly: {partial_bytes} bytes in {elapsed:.1f} s "
                    f"(after {grace:.1f} s, frames must keep arriving at "
                    f"{MIN_FRAME_BYTES_PER_SECOND // 1024} KiB/s)"
                )
            else:
                limit = settings.idle_timeout * stretch
                quiet_for = now - self.last_received
                deadline = self.last_received + limit
                problem = f"no frame received for {quiet_for:.1f} s (limit {limit:.1f} s)"
                if interval <= quiet_for < limit:
                    nonce += 1
                    outlet.send_control(encode_frame(Ping(nonce)))
                wake = min(deadline, now + interval - quiet_for % interval)
            if now >= deadline:
                outlet.fail(ErrorCode.IDLE_TIMEOUT, problem)
                return
            await trio.sleep_until(max(wake, now + 0.01))
