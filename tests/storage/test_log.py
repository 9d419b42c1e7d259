"""PartitionLog: offsets, reads, rolls, retention, fsync policy, with a fake clock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broky.storage.config import (
    NS_PER_DAY,
    NS_PER_SECOND,
    FsyncPolicy,
    LogConfig,
    RollSchedule,
)
from broky.storage.errors import OffsetOutOfRangeError, StorageError
from broky.storage.log import PartitionLog
from tests.storage.runs import flatten, make_run, read_all

#: 2026-01-01T00:00:00Z, a start for the fake clock.
EPOCH_2026 = 1_767_225_600 * NS_PER_SECOND


class FakeClock:
    """Wall time that moves only when the test says so."""

    def __init__(self, now: int = EPOCH_2026) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * NS_PER_SECOND)


def open_log(path: Path, clock: FakeClock | None = None, **settings: object) -> PartitionLog:
    return PartitionLog.open(str(path), LogConfig(**settings), clock or FakeClock())  # type: ignore[arg-type]


def test_offsets_are_dense_across_runs_and_appends(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        first = log.append([make_run(b"a", [b"1", b"2"]), make_run(b"b", [b"3"])])
        second = log.append([make_run(b"a", [b"4"])])
        assert (first.first_offset, first.last_offset, first.count) == (0, 2, 3)
        assert (second.first_offset, second.last_offset) == (3, 3)
        assert read_all(log) == [(0, b"a", b"1"), (1, b"a", b"2"), (2, b"b", b"3"), (3, b"a", b"4")]


def test_read_starts_mid_batch_and_stops_at_stop_offset(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append([make_run(b"k", [b"%d" % i for i in range(10)])])
        batches = log.read(3, stop_offset=6)
        assert [(offset, payload) for offset, _, payload in flatten(batches)] == [
            (3, b"3"),
            (4, b"4"),
            (5, b"5"),
        ]
        assert log.read(10) == []


def test_read_returns_at_least_one_batch_then_whole_batches_within_budget(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append([make_run(b"k", [b"x" * 100] * 5) for _ in range(4)])
        assert len(log.read(0, max_bytes=1)) == 1, "one batch even over budget: progress"
        one = log.read(0, max_bytes=1)[0].stored_bytes
        assert len(log.read(0, max_bytes=2 * one)) == 2
        assert len(log.read(0, max_bytes=2 * one - 1)) == 1


def test_offsets_outside_the_log_are_the_callers_error(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append([make_run(b"k", [b"1"])])
        with pytest.raises(OffsetOutOfRangeError) as caught:
            log.read(2)
        assert (caught.value.start_offset, caught.value.end_offset) == (0, 1)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(-1)


def test_empty_append_is_refused(tmp_path: Path) -> None:
    with open_log(tmp_path) as log, pytest.raises(StorageError):
        log.append([])


def test_size_roll_keeps_segments_under_the_limit(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=1024) as log:
        for index in range(20):
            log.append([make_run(b"k", [b"%d" % index] * 3)])
        assert len(log.segments) > 3
        for segment in log.segments:
            assert segment.size <= 1024
            assert os.path.getsize(segment.path) == segment.size
        bases = [segment.base_offset for segment in log.segments]
        assert bases == sorted(bases)
        assert [s.next_offset for s in log.segments[:-1]] == bases[1:]
        assert len(read_all(log)) == 60


def test_one_append_that_crosses_the_size_limit_is_split_across_segments(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=1024) as log:
        result = log.append([make_run(b"k", [b"%d" % i] * 4) for i in range(10)])
        assert (result.first_offset, result.last_offset) == (0, 39)
        assert len(log.segments) > 2
        assert [payload for _, _, payload in read_all(log)] == [
            b"%d" % i for i in range(10) for _ in range(4)
        ]


def test_interval_roll_uses_the_first_batch_time(tmp_path: Path) -> None:
    clock = FakeClock()
    with open_log(tmp_path, clock, roll=RollSchedule.every(60)) as log:
        log.append([make_run(b"k", [b"1"])])
        clock.advance(59)
        log.append([make_run(b"k", [b"2"])])
        assert len(log.segments) == 1
        clock.advance(1)
        log.append([make_run(b"k", [b"3"])])
        assert [s.base_offset for s in log.segments] == [0, 2]


def test_daily_roll_at_a_utc_offset() -> None:
    # 02:30 at UTC+02:00 is 00:30 UTC.
    schedule = RollSchedule.daily(hour=2, minute=30, utc_offset_minutes=120)
    half_past_midnight_utc = EPOCH_2026 + 30 * 60 * NS_PER_SECOND
    assert schedule.deadline(EPOCH_2026) == half_past_midnight_utc
    assert schedule.deadline(half_past_midnight_utc) == half_past_midnight_utc + NS_PER_DAY
    assert schedule.deadline(half_past_midnight_utc - 1) == half_past_midnight_utc
    with pytest.raises(StorageError):
        RollSchedule.daily(hour=24)


def test_daily_roll_happens_on_the_first_append_after_the_boundary(tmp_path: Path) -> None:
    clock = FakeClock(EPOCH_2026 + 23 * 3600 * NS_PER_SECOND)  # 23:00 UTC
    with open_log(tmp_path, clock, roll=RollSchedule.daily()) as log:
        log.append([make_run(b"k", [b"1"])])
        clock.advance(3599)
        log.append([make_run(b"k", [b"2"])])
        clock.advance(2)  # past midnight
        log.append([make_run(b"k", [b"3"])])
        assert [s.base_offset for s in log.segments] == [0, 2]


def test_tick_rolls_an_idle_segment_by_time(tmp_path: Path) -> None:
    clock = FakeClock()
    with open_log(tmp_path, clock, roll=RollSchedule.every(10)) as log:
        log.append([make_run(b"k", [b"1"])])
        clock.advance(11)
        log.tick()
        assert len(log.segments) == 2
        assert log.segments[-1].size == 0


def test_retention_by_age_deletes_whole_old_segments_only(tmp_path: Path) -> None:
    clock = FakeClock()
    with open_log(tmp_path, clock, segment_bytes=512, retention_seconds=100) as log:
        for _ in range(5):
            log.append([make_run(b"k", [b"old"] * 3)])
        old_end = log.end_offset
        clock.advance(50)
        log.append([make_run(b"k", [b"new"] * 3)])
        assert log.enforce_retention().deleted_segments == 0
        clock.advance(60)  # the old batches are 110 s old, the new 60 s
        result = log.enforce_retention()
        assert result.deleted_segments > 0
        assert log.start_offset == result.start_offset
        assert log.start_offset <= old_end, "a segment holding new data is kept"
        assert all(payload == b"new" for offset, _, payload in read_all(log) if offset >= old_end)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(0)
        files = sorted(os.listdir(tmp_path))
        assert files[0].startswith(f"{log.start_offset:020d}")


def test_retention_by_age_expires_an_idle_active_segment(tmp_path: Path) -> None:
    clock = FakeClock()
    with open_log(tmp_path, clock, retention_seconds=10) as log:
        log.append([make_run(b"k", [b"1", b"2"])])
        clock.advance(11)
        log.tick()
        assert (log.start_offset, log.end_offset) == (2, 2)
        assert log.read(2) == []
        assert log.append([make_run(b"k", [b"3"])]).first_offset == 2


def test_retention_by_bytes_keeps_at_most_the_limit_and_never_the_active(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=600, retention_bytes=1500) as log:
        for index in range(30):
            log.append([make_run(b"k", [b"%d" % index] * 2)])
            log.enforce_retention()
            assert log.statistics().size_bytes <= max(1500, log.segments[-1].size)
        assert log.start_offset > 0
        assert read_all(log)[-1] == (59, b"k", b"29")


def test_fsync_always_moves_durable_offset_only_on_sync(tmp_path: Path) -> None:
    with open_log(tmp_path, fsync=FsyncPolicy.ALWAYS) as log:
        log.append([make_run(b"k", [b"1"])])
        log.append([make_run(b"k", [b"2"])])
        assert log.durable_offset == 0
        assert log.sync() == 2
        assert log.statistics().fsyncs == 1, "one fsync covers both appends (group commit)"
        log.sync()
        assert log.statistics().fsyncs == 1, "nothing pending: no fsync"
        assert log.read(0, stop_offset=log.durable_offset)


def test_fsync_interval_syncs_once_the_window_has_passed(tmp_path: Path) -> None:
    clock = FakeClock()
    with open_log(tmp_path, clock, fsync=FsyncPolicy.INTERVAL, fsync_interval_seconds=1.0) as log:
        log.append([make_run(b"k", [b"1"])])
        assert log.durable_offset == 0
        clock.advance(1)
        log.append([make_run(b"k", [b"2"])])
        assert log.durable_offset == 2
        log.append([make_run(b"k", [b"3"])])
        clock.advance(1)
        log.tick()
        assert log.durable_offset == 3


def test_fsync_never_syncs_on_roll_and_close_only(tmp_path: Path) -> None:
    with open_log(tmp_path, fsync=FsyncPolicy.NEVER) as log:
        log.append([make_run(b"k", [b"1"])])
        log.tick()
        assert log.durable_offset == 0
        log.roll()
        assert log.durable_offset == 1


def test_time_lookup_finds_the_first_batch_at_or_after(tmp_path: Path) -> None:
    clock = FakeClock()
    with open_log(tmp_path, clock, segment_bytes=512, index_interval_bytes=64) as log:
        times = []
        for index in range(20):
            times.append(clock.now)
            log.append([make_run(b"k", [b"%d" % index] * 2)])
            clock.advance(1)
        for index, moment in enumerate(times):
            assert log.offset_for_time(moment) == 2 * index
            assert log.offset_for_time(moment - 1) == 2 * index
        assert log.offset_for_time(clock.now) == log.end_offset


def test_log_time_never_goes_backwards(tmp_path: Path) -> None:
    clock = FakeClock()
    with open_log(tmp_path, clock) as log:
        log.append([make_run(b"k", [b"1"])])
        clock.advance(-100)
        log.append([make_run(b"k", [b"2"])])
        first, second = log.read(0)
        assert second.log_time == first.log_time


def test_last_message_per_key_survives_reopen_and_follows_appends(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=400) as log:
        for index in range(10):
            log.append([make_run(b"a", [b"a%d" % index]), make_run(b"b.%d" % (index % 3), [b"b"])])
    with open_log(tmp_path, segment_bytes=400) as log:
        assert log.last_offsets() == {b"a": 18, b"b.0": 19, b"b.1": 15, b"b.2": 17}
        log.append([make_run(b"a", [b"latest"])])
        last = log.read_last(lambda key: key == b"a")
        assert flatten(last) == [(20, b"a", b"latest")]
        assert [batch.base_offset for batch in log.read_last()] == [15, 17, 19, 20]


def test_a_closed_log_refuses_work(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.close()
    log.close()
    with pytest.raises(StorageError):
        log.append([make_run(b"k", [b"1"])])


def test_statistics_count_what_happened(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=256) as log:
        log.append([make_run(b"k", [b"1", b"2"]), make_run(b"j", [b"3"])])
        log.append([make_run(b"k", [b"x" * 300])])
        log.sync()
        stats = log.statistics()
        assert (stats.appended_batches, stats.appended_messages) == (3, 4)
        assert (stats.start_offset, stats.end_offset, stats.durable_offset) == (0, 4, 4)
        assert stats.rolls == stats.segments - 1 >= 1


def test_an_append_said_quick_never_rolls_or_syncs(tmp_path: Path) -> None:
    """``append_is_quick`` (an owner then appends on its event loop) is
    never wrong the dangerous way: an append it calls quick stays one write
    to the active segment; near a roll, or with interval fsyncs, it says no."""
    clock = FakeClock()
    with open_log(tmp_path, clock, segment_bytes=256 * 1024, fsync=FsyncPolicy.ALWAYS) as log:
        quick_seen = 0
        for index in range(80):
            runs = [make_run(b"k%d" % index, [b"x" * 1000] * 5) for _ in range(3)]
            nbytes = sum(len(run.messages) for run in runs)
            quick = log.append_is_quick(nbytes, 15, len(runs))
            segments = len(log.segments)
            log.append(runs)
            if quick:
                quick_seen += 1
                assert len(log.segments) == segments
        assert len(log.segments) > 3
        assert quick_seen > 40
    with open_log(tmp_path / "timed", clock, roll=RollSchedule.every(60)) as log:
        log.append([make_run(b"k", [b"1"])])
        assert log.append_is_quick(1, 1, 1)
        clock.advance(60)
        assert not log.append_is_quick(1, 1, 1)  # the next append rolls by time
    with open_log(tmp_path / "interval", clock, fsync=FsyncPolicy.INTERVAL) as log:
        assert not log.append_is_quick(1, 1, 1)
