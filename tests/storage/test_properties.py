"""Property: any interleaving of appends, syncs, rolls, retention and restarts
(clean or crashed) keeps offsets dense and increasing, and reads back exactly
what was written from the start offset on."""

from __future__ import annotations

import itertools
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from broky.storage.config import NS_PER_SECOND, LogConfig
from broky.storage.log import PartitionLog
from tests.storage.runs import make_run, read_all

KEYS = [b"a", b"b.c", b"d.e.f"]
runs_strategy = st.lists(
    st.tuples(st.sampled_from(KEYS), st.lists(st.binary(max_size=40), min_size=1, max_size=6)),
    min_size=1,
    max_size=4,
)


class LogMachine(RuleBasedStateMachine):
    """The log against a model: a dict from offset to (key, payload)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.now = 1_000 * NS_PER_SECOND
        self.model: dict[int, tuple[bytes, bytes]] = {}
        self.end = 0
        self.start = 0

    def clock(self) -> int:
        return self.now

    @initialize(
        segment_bytes=st.integers(256, 4096),
        retention_bytes=st.none() | st.integers(512, 8192),
        retention_seconds=st.none() | st.integers(5, 60),
        index_interval_bytes=st.integers(32, 1024),
    )
    def open_log(
        self,
        segment_bytes: int,
        retention_bytes: int | None,
        retention_seconds: int | None,
        index_interval_bytes: int,
    ) -> None:
        self.directory = str(self.root / f"log-{next(COUNTER)}")
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            retention_bytes=retention_bytes,
            retention_seconds=retention_seconds,
            index_interval_bytes=index_interval_bytes,
        )
        self.log = PartitionLog.open(self.directory, self.config, self.clock)

    @rule(runs=runs_strategy)
    def append(self, runs: list[tuple[bytes, list[bytes]]]) -> None:
        result = self.log.append([make_run(key, payloads) for key, payloads in runs])
        assert result.first_offset == self.end, "offsets continue without a gap"
        for key, payloads in runs:
            for payload in payloads:
                self.model[self.end] = (key, payload)
                self.end += 1
        assert result.last_offset == self.end - 1

    @rule()
    def sync(self) -> None:
        assert self.log.sync() == self.end

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(seconds=st.integers(0, 30))
    def retention(self, seconds: int) -> None:
        self.now += seconds * NS_PER_SECOND
        self.log.enforce_retention()
        assert self.log.start_offset >= self.start, "start offset never moves back"
        self.start = self.log.start_offset

    @rule()
    def restart_cleanly(self) -> None:
        self.log.close()
        self.log = PartitionLog.open(self.directory, self.config, self.clock)
        assert self.log.recovery.segments_scanned == 0
        assert self.log.recovery.clean

    @rule()
    def restart_after_crash(self) -> None:
        self.log.abandon()  # the process died: page cache kept, no index written
        self.log = PartitionLog.open(self.directory, self.config, self.clock)
        assert self.log.recovery.clean

    @invariant()
    def reads_back_exactly_what_was_written(self) -> None:
        assert self.log.end_offset == self.end
        assert self.log.start_offset == self.start
        expected = [(offset, *self.model[offset]) for offset in range(self.start, self.end)]
        assert read_all(self.log, max_bytes=700) == expected
        if self.log.last_offsets():
            assert max(self.log.last_offsets().values()) == self.end - 1

    def teardown(self) -> None:
        if hasattr(self, "log"):
            self.log.close()


COUNTER = itertools.count()


def test_any_interleaving_keeps_offsets_dense_and_data_exact(tmp_path: Path) -> None:
    run_state_machine_as_test(
        lambda: LogMachine(tmp_path),  # type: ignore[arg-type]  # any factory works
        settings=settings(max_examples=60, stateful_step_count=30, deadline=None),
    )
