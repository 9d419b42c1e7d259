"""PartitionLog.housekeeping_delay against tick: a property test with a fake clock.

The owner of a partition asks ``housekeeping_delay`` on the event loop and
hands a tick to a thread only when it says 0 (broky.durable.owner), so the
two must agree exactly: when it says 0 a tick does something (a sync, a
roll, a deletion), when it says later a tick now would do nothing, and the
clock moved by what it says brings that tick due.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from broky.storage.config import FsyncPolicy, LogConfig, RollSchedule
from broky.storage.log import PartitionLog
from tests.storage.runs import make_run
from tests.storage.test_log import FakeClock

#: An operation: append this many 40-byte messages, move the clock by this
#: many seconds, or tick (and check). Ticks are steps of their own, so
#: states where several rules are due, or one is and another is not yet,
#: build up between them.
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 12)),
        st.tuples(st.just("wait"), st.sampled_from([0.5, 1, 2, 3, 9, 31])),
        st.tuples(st.just("tick"), st.just(0)),
    ),
    max_size=30,
)

_CONFIGS = st.builds(
    LogConfig,
    segment_bytes=st.sampled_from([512, 4096]),
    fsync=st.sampled_from([FsyncPolicy.INTERVAL, FsyncPolicy.ALWAYS, FsyncPolicy.NEVER]),
    fsync_interval_seconds=st.sampled_from([0.5, 1.0, 2.0]),
    roll=st.sampled_from([None, RollSchedule.every(10)]),
    retention_seconds=st.sampled_from([None, 5, 30]),
    retention_bytes=st.sampled_from([None, 1500]),
)


def _observed(log: PartitionLog) -> tuple[object, ...]:
    """What a tick can change: segments, the start, the durable end, fsyncs."""
    return (
        tuple(segment.base_offset for segment in log.segments),
        log.start_offset,
        log.durable_offset,
        log.statistics().fsyncs,
    )


@settings(max_examples=300, deadline=None)
@given(config=_CONFIGS, steps=_STEPS)
def test_the_delay_says_exactly_when_a_tick_has_work(
    config: LogConfig, steps: list[tuple[str, float]]
) -> None:
    clock = FakeClock()
    with (
        tempfile.TemporaryDirectory() as directory,
        PartitionLog.open(directory, config, clock) as log,
    ):
        for kind, amount in steps:
            if kind == "append":
                log.append([make_run(b"k", [b"x" * 40] * int(amount))])
                continue
            if kind == "wait":
                clock.advance(amount)
                continue
            delay = log.housekeeping_delay()
            before = _observed(log)
            log.tick()
            changed = _observed(log) != before
            assert changed == (delay == 0.0), (delay, before, _observed(log))
            after = log.housekeeping_delay()
            if after is not None and after > 0:
                # The clock moved by the delay brings the tick due.
                clock.advance(after)
                assert log.housekeeping_delay() == 0.0
                clock.advance(-after)


def test_an_idle_synced_log_needs_no_tick(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_seconds=1.0)
    with PartitionLog.open(str(tmp_path), config, clock) as log:
        assert log.housekeeping_delay() is None, "nothing written: nothing to do, ever"
        log.append([make_run(b"k", [b"1"])])
        assert log.housekeeping_delay() == 1.0
        clock.advance(1)
        assert log.housekeeping_delay() == 0.0
        log.tick()
        assert log.durable_offset == 1
        assert log.housekeeping_delay() is None
