"""PartitionLog.truncate: what a follower does to a tail its new leader never had."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.storage.config import LogConfig
from broky.storage.errors import OffsetOutOfRangeError
from broky.storage.log import PartitionLog
from tests.storage.runs import append_rounds, make_run, read_all


def _fill(log: PartitionLog, rounds: list[list[int]]) -> list[tuple[int, bytes, bytes]]:
    """Append one call per round, each with runs of the given sizes; return the records."""
    append_rounds(log, rounds)
    log.sync()
    return read_all(log)


@settings(max_examples=40, deadline=None)
@given(
    rounds=st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=4), min_size=1, max_size=8),
    cut=st.floats(0, 1),
    segment_bytes=st.sampled_from([300, 4096]),
)
def test_truncate_keeps_exactly_the_prefix(
    tmp_path_factory: pytest.TempPathFactory,
    rounds: list[list[int]],
    cut: float,
    segment_bytes: int,
) -> None:
    directory = tmp_path_factory.mktemp("log")
    config = LogConfig(segment_bytes=segment_bytes)
    with PartitionLog.open(str(directory), config) as log:
        records = _fill(log, rounds)
        end = int(cut * log.end_offset)
        log.truncate(end)
        assert log.end_offset == end
        assert log.durable_offset == end
        assert read_all(log) == records[:end]
        # Appending continues at the cut, and survives a reopen.
        log.append([make_run(b"k.new", [b"after"])])
        log.sync()
        expected = [*records[:end], (end, b"k.new", b"after")]
        assert read_all(log) == expected
    with PartitionLog.open(str(directory), config) as log:
        assert read_all(log) == expected


def test_truncate_past_the_end_does_nothing_and_before_the_start_fails(tmp_path: Path) -> None:
    with PartitionLog.open(str(tmp_path)) as log:
        _fill(log, [[2, 3]])
        log.truncate(10)
        assert log.end_offset == 5
        with pytest.raises(OffsetOutOfRangeError):
            log.truncate(-1)


def test_restart_at_drops_everything_and_continues_at_the_new_start(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=300)
    with PartitionLog.open(str(tmp_path), config) as log:
        _fill(log, [[3, 2], [4], [5, 1]])
        end = log.end_offset
        with pytest.raises(OffsetOutOfRangeError):
            log.restart_at(end - 1)
        log.restart_at(end + 40)
        assert (log.start_offset, log.end_offset, log.durable_offset) == (end + 40,) * 3
        assert read_all(log) == []
        log.append([make_run(b"k", [b"a", b"b"])])
        log.sync()
        expected = [(end + 40, b"k", b"a"), (end + 41, b"k", b"b")]
        assert read_all(log) == expected
    with PartitionLog.open(str(tmp_path), config) as log:
        assert log.start_offset == end + 40
        assert read_all(log) == expected
