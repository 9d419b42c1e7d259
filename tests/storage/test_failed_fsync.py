"""A log whose fsync failed takes no more writes until it is reopened.

After a failed fsync the kernel may have dropped the dirty pages and marked
them clean, so the next fsync "succeeds" without them (fsyncgate): the log
must not pretend the records past its durable offset are safe, nor take
writes that a later successful fsync would seem to cover."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from broky.storage.config import FsyncPolicy
from broky.storage.errors import StorageError
from broky.storage.segment import Segment
from tests.storage.runs import make_run, read_all
from tests.storage.test_log import open_log


def failing_sync(self: Segment) -> None:
    raise OSError(errno.EIO, "Input/output error")


def test_a_failed_fsync_stops_writes_until_reopen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_log(tmp_path, fsync=FsyncPolicy.ALWAYS) as log:
        log.append([make_run(b"k", [b"1"])])
        assert log.sync() == 1
        log.append([make_run(b"k", [b"2"])])
        with monkeypatch.context() as patched:
            patched.setattr(Segment, "sync", failing_sync)
            with pytest.raises(StorageError, match=r"fsync .* failed .*offsets from 1 on"):
                log.sync()
        # The disk "works" again: nothing may be written or called durable.
        assert log.write_failure is not None
        assert log.durable_offset == 1
        with pytest.raises(StorageError, match="no more writes"):
            log.append([make_run(b"k", [b"3"])])
        with pytest.raises(StorageError, match="no more writes"):
            log.sync()
        with pytest.raises(StorageError, match="no more writes"):
            log.roll()
        with pytest.raises(StorageError, match="no more writes"):
            log.truncate(0)
        log.tick()  # housekeeping does nothing rather than failing each tick
        # Reads go on: what the log holds is readable, as after reopening.
        assert read_all(log) == [(0, b"k", b"1"), (1, b"k", b"2")]
    with open_log(tmp_path, fsync=FsyncPolicy.ALWAYS) as reopened:
        # Recovery reads what the files hold; writes resume after it.
        assert reopened.write_failure is None
        assert reopened.end_offset == 2
        reopened.append([make_run(b"k", [b"3"])])
        assert reopened.sync() == 3


def test_a_failed_fsync_while_rolling_stops_writes_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_log(tmp_path, fsync=FsyncPolicy.NEVER) as log:
        log.append([make_run(b"k", [b"1"])])
        monkeypatch.setattr("broky.storage.segment.os.fdatasync", failing_sync)
        with pytest.raises(StorageError, match="fsync"):
            log.roll()
        assert log.write_failure is not None
        with pytest.raises(StorageError, match="no more writes"):
            log.append([make_run(b"k", [b"2"])])
        monkeypatch.undo()
