"""Reading a plain socket with ``os.read``, one scheduler trip fewer per read.

trio's SocketStream yields to the scheduler once more after a read that had
to wait (cancel_shielded_checkpoint), so at light load every message took a
trip through the run queue before routing. Here a read that waited returns
at once; a read that found data without waiting is preceded by a checkpoint
instead, so a busy connection still lets every other task run between its
reads.
"""

from __future__ import annotations

import os
from typing import Final

import trio

#: Bytes asked of the socket per read: big reads mean few syscalls per
#: message; 256 KiB is what a busy publisher's kernel buffer typically holds.
RECEIVE_BYTES: Final = 256 * 1024


class DirectReader:
    """``receive_some`` for one non-blocking socket file descriptor."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        #: Whether the last read had to wait for data.
        self._read_waited = True

    async def receive_some(self) -> bytes:
        """Up to RECEIVE_BYTES from the socket; b"" at EOF."""
        if not self._read_waited:
            await trio.lowlevel.checkpoint()
        self._read_waited = False
        while True:
            try:
                return os.read(self._fd, RECEIVE_BYTES)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._fd)
                self._read_waited = True
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket read failed: {exc}") from exc
