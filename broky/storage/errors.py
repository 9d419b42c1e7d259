"""Storage errors, split by whose fault they are.

``OffsetOutOfRangeError`` is the caller's: it asked for an offset the log does
not hold (deleted by retention, or not written yet). ``CorruptRecordError`` is
the disk's: bytes on disk failed their CRC32C or their framing, so they are
never handed out. ``StorageError`` covers the rest (a full disk, a bad data
directory). Each carries a wire code so that the broker can answer a client
without translating; storage has no codes of its own on the wire yet, so they
are ``Internal`` until the read API's frames add some.
"""

from __future__ import annotations

from broky.protocol.constants import ErrorCode


class StorageError(Exception):
    """Base class: the log could not do what was asked."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL) -> None:
        super().__init__(message)
        self.code = code


class CorruptRecordError(StorageError):
    """Bytes on disk failed verification; they are not served.

    ``path`` and ``position`` name the file and byte where the bad batch
    starts, so that an operator can inspect or cut it.
    """

    def __init__(self, message: str, path: str = "", position: int = 0) -> None:
        super().__init__(f"{message} ({path} at byte {position})" if path else message)
        self.path = path
        self.position = position


class OffsetOutOfRangeError(StorageError):
    """The offset asked for is outside ``[start_offset, end_offset]``."""

    def __init__(self, offset: int, start_offset: int, end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is outside the log's range [{start_offset}, {end_offset}]"
        )
        self.offset = offset
        self.start_offset = start_offset
        self.end_offset = end_offset
