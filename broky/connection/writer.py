"""The writing half of a broker connection: its outlet, writer task and direct writes.

The router leaves Deliver runs and control frames in the connection's
``Outlet``; this object gets them onto the socket. Normally the writer task
(``run``) drains the outlet into one ``send_all`` per batch. At light load
the reader that routed a batch writes instead (``write_directly``, queued by
``wake`` while ``Router.routing``): one non-blocking ``os.write`` per
connection per read, no task switch. The two never interleave bytes: a
direct write happens only while the writer task is idle, and whatever the
socket did not take the writer task sends first.

A failed outlet (slow consumer, protocol error, shutdown) makes the writer
send its Error frame and stop; a write blocked when that happens gets
CLOSE_TIMEOUT more seconds and is then abandoned.
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from typing import Final, Protocol

import trio

from broky.connection.reasons import CloseReason
from broky.protocol.codec import encode_frame
from broky.protocol.frames import Error
from broky.router.outbox import Outlet
from broky.router.router import Router

#: How long a closing connection may take to flush its last frames.
CLOSE_TIMEOUT: Final = 1.0


def stream_fd(stream: trio.abc.Stream) -> int:
    """The socket descriptor of a plain TCP or Unix stream (-1 otherwise:
    TLS must encrypt through its stream, an in-process pipe has no socket)."""
    if isinstance(stream, trio.SocketStream):
        return stream.socket.fileno()
    return -1


class WriterCounters(Protocol):
    """The broker-wide counters a writer adds to (settings.ConnectionCounters)."""

    bytes_sent: int
    direct_writes: int


class ConnectionWriter:
    """See the module docstring. ``greet`` queues the preamble if it was not
    sent yet (an Error frame must follow one); ``close_reason`` records why
    the connection ends."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        router: Router,
        counters: WriterCounters,
        greet: Callable[[], None],
        close_reason: Callable[[CloseReason, str], None],
    ) -> None:
        self._stream = stream
        self._router = router
        self._counters = counters
        self._greet = greet
        self._close_reason = close_reason
        self._work = trio.Event()
        #: True while the writer task waits for work: then the task that
        #: routed something may write it at once (write_directly).
        self._idle = False
        #: The socket for direct reads and writes (-1: none, e.g. TLS or
        #: in-process, or once the connection is closing).
        self.direct_fd = stream_fd(stream)
        #: The socket under any TLS, to ask whether it has room (-1: none).
        self._socket_fd = stream_fd(getattr(stream, "transport_stream", stream))
        #: Bytes a direct write left unsent; the writer task sends them first.
        self._unsent = b""
        self._send_scope: trio.CancelScope | None = None
        self.outlet: Outlet = router.attach(self.wake)
        if self._socket_fd >= 0:
            self.outlet.writable = self.socket_has_room

    def close(self) -> None:
        """Forget the descriptors: their numbers may be reused once closed."""
        self.direct_fd = self._socket_fd = -1

    def wake(self) -> None:
        """The outlet has something to write (Outlet's ``wake``)."""
        router = self._router
        if self._idle and self.direct_fd >= 0 and router.routing and self.outlet.failure is None:
            # A reader is routing: it makes this write when its batch is
            # done (Router.run_direct_writes), and wakes the writer task only
            # if the socket does not take everything: no task switch per
            # message at light load.
            router.direct_writes.append(self.write_directly)
        else:
            self._work.set()
        if self.outlet.failure is not None and self._send_scope is not None:
            # A blocked write gets CLOSE_TIMEOUT more seconds, then is abandoned.
            self._send_scope.deadline = min(
                self._send_scope.deadline, trio.current_time() + CLOSE_TIMEOUT
            )

    def socket_has_room(self) -> bool:
        """Whether the kernel would take more bytes on this socket now (for
        broky.router.pressure: a full send buffer means the peer does not read)."""
        if self._socket_fd < 0:
            return False
        try:
            return bool(select.select([], [self._socket_fd], [], 0)[1])
        except (OSError, ValueError):
            return False

    def write_directly(self) -> None:
        """Send what the outlet holds with one non-blocking write, from the
        task that routed it (see the module docstring)."""
        outlet = self.outlet
        if not self._idle or self._unsent or outlet.failure is not None:
            self._work.set()  # the writer task takes it from here
            return
        if not outlet.has_work:
            return
        data = b"".join(outlet.take())
        try:
            sent = os.write(self.direct_fd, data)
        except OSError:
            sent = 0  # would block, or broken: the writer sends it, or meets the error
        self._counters.bytes_sent += sent
        self._counters.direct_writes += 1
        if sent < len(data):
            self._unsent = data[sent:]
        if self._unsent or outlet.has_work:
            self._work.set()

    async def run(self, connection_scope: trio.CancelScope) -> None:
        """The writer task; cancels ``connection_scope`` when it ends."""
        outlet = self.outlet
        stream = self._stream
        counters = self._counters
        try:
            while True:
                if not outlet.has_work and not self._unsent:
                    self._idle = True
                    await self._work.wait()
                    self._idle = False
                    self._work = trio.Event()
                failure = outlet.failure
                if failure is not None:
                    self._greet()  # the Error frame must follow a preamble to be read
                parts = outlet.take()
                if self._unsent:
                    parts.insert(0, self._unsent)
                    self._unsent = b""
                if failure is not None:
                    self._close_reason(CloseReason.for_error(failure[0]), failure[1])
                    parts.append(encode_frame(Error(failure[0], failure[1])))
                if parts:
                    data = b"".join(parts)
                    with trio.CancelScope() as send_scope:
                        self._send_scope = send_scope
                        if failure is not None:
                            send_scope.deadline = trio.current_time() + CLOSE_TIMEOUT
                        started = outlet.write_started = trio.current_time()
                        try:
                            await stream.send_all(data)
                        finally:
                            outlet.wrote(trio.current_time() - started)
                    self._send_scope = None
                    if send_scope.cancelled_caught:
                        # The write was abandoned mid-frame (see wake): nothing
                        # more can be framed on this stream, so close it as is.
                        failure = outlet.failure or failure
                        if failure is not None:
                            self._close_reason(CloseReason.for_error(failure[0]), failure[1])
                        return
                    counters.bytes_sent += len(data)
                if failure is not None:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._close_reason(CloseReason.TRANSPORT_ERROR, str(exc) or type(exc).__name__)
        finally:
            self._idle = False
            connection_scope.cancel()
