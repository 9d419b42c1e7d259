"""Reading a socket with no wasted work between one read and the next wait.

The broker's connection readers and the client's reader task read this way.
At light load every message arrives alone: the client's reader task reads
it, hands its runs to a subscription (waking the task iterating it), and
reads again. Through trio's ``SocketStream.receive_some`` that next read is
a ``recv`` that fails with EAGAIN (a syscall and an exception through
trio's ``_try_sync``) before the reader waits for readability, and all of
it ran before the woken consumer got the CPU: measured 11-14 us between a
delivery and its iterator waking, on a path of about 110 us socket to
socket.

``DirectReceiver`` remembers whether the last read drained the socket (it
returned fewer bytes than asked for: TCP hands over everything queued up to
the limit) and then waits for readability first: the reader parks at once
and the consumer runs next. Data that arrived in between is no problem:
trio's epoll registration reports a socket that is already readable at
once. A read that filled the buffer is followed by a plain checkpoint
instead, so a busy connection still lets every other task run between
reads. Only plain TCP or Unix sockets on POSIX are read this way; TLS
records belong to trio's SSLStream, which keeps ``receive_some``.

The broker's reader gains the same: it routes what it read (writing to idle
subscribers itself) and then parks, where it used to try a read that
failed with EAGAIN first (strace of a broker at light load: 0 failed reads
against 2,673 in 6,805, and one syscall fewer per message).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Final

import trio

#: Bytes asked of the socket per read: big reads mean few syscalls per
#: message; 256 KiB is what a busy publisher's kernel buffer typically holds.
RECEIVE_BYTES: Final = 256 * 1024


class DirectReceiver:
    """``receive_some`` for a plain socket, read with ``os.read`` (see the
    module docstring). One task reads at a time."""

    def __init__(self, socket: trio.socket.SocketType, max_bytes: int) -> None:
        self._socket = socket
        self._max_bytes = max_bytes
        #: Whether the last read emptied the socket's receive queue.
        self._drained = True

    async def receive(self) -> bytes:
        """Up to ``max_bytes`` bytes, waiting for some; b"" at end of stream.

        Raises ClosedResourceError once the socket is closed, and
        BrokenResourceError when the connection failed, as ``receive_some``
        does.
        """
        socket = self._socket
        wait = self._drained
        if not wait:
            await trio.lowlevel.checkpoint()
        while True:
            descriptor = socket.fileno()
            if descriptor < 0:
                raise trio.ClosedResourceError("the socket was closed")
            if wait:
                await trio.lowlevel.wait_readable(descriptor)
                wait = False
                continue  # read, after checking the socket was not closed meanwhile
            try:
                data = os.read(descriptor, self._max_bytes)
            except BlockingIOError:
                wait = True  # woken early: wait again
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket read failed: {exc}") from exc
            self._drained = len(data) < self._max_bytes
            return data


def stream_receiver(
    stream: trio.abc.Stream, max_bytes: int
) -> Callable[[], Awaitable[bytes | bytearray]]:
    """How a reader task reads ``stream``: directly for a plain socket on
    POSIX, through ``receive_some`` otherwise (TLS, in-memory streams)."""
    if os.name == "posix" and isinstance(stream, trio.SocketStream):
        return DirectReceiver(stream.socket, max_bytes).receive
    return partial(stream.receive_some, max_bytes)
