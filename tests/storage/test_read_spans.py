"""Reads by whole stored batches (``read_spans``) and the batch and read
window a segment keeps from its last read: the same messages as run by run
reads, and no second ``pread`` for a read that goes on inside them."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.storage.batch_reading import distinct_keys_compiled, distinct_keys_pure
from broky.storage.config import LogConfig
from broky.storage.log import PartitionLog
from broky.storage.segment import Segment
from tests.storage.runs import append_rounds, flatten, make_run


def _open(path: Path, segment_bytes: int = 1 << 20) -> PartitionLog:
    return PartitionLog.open(str(path), LogConfig(segment_bytes=segment_bytes))


@settings(max_examples=40, deadline=None)
@given(
    rounds=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=1, max_size=6),
    reads=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 12), st.integers(1, 2000))),
    segment_bytes=st.sampled_from([300, 1 << 20]),
)
def test_spans_hold_what_run_reads_hold(
    tmp_path_factory: pytest.TempPathFactory,
    rounds: list[list[int]],
    reads: list[tuple[float, int, int]],
    segment_bytes: int,
) -> None:
    with _open(tmp_path_factory.mktemp("log"), segment_bytes) as log:
        append_rounds(log, rounds)
        end = log.end_offset
        # Reads in any order: each may start inside the batch the last one kept.
        for where, length, budget in reads:
            start = int(where * end)
            stop = min(end, start + length)
            spans = log.read_spans(start, budget, stop)
            if start == stop:
                assert spans == []
                continue
            assert spans, "at least one batch: progress"
            assert spans[0].start == start
            assert spans[-1].stop <= stop
            for before, after in itertools.pairwise(spans):
                assert before.stop == after.start
            runs = [run for span in spans for run in span.runs()]
            expected = log.read(start, 1 << 30, spans[-1].stop)
            assert flatten(runs) == flatten(expected)
            for span in spans:  # as the batch's runs from its start, cut to the span
                whole = flatten(span.batch.runs())
                assert flatten(span.runs()) == [m for m in whole if span.start <= m[0] < span.stop]
            # Message ``m<offset>`` at each offset: runs skipped and sliced right.
            offsets = range(start, spans[-1].stop)
            assert [(o, p) for o, _, p in flatten(runs)] == [(o, b"m%d" % o) for o in offsets]


def test_a_read_inside_the_kept_batch_reads_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    preads: list[int] = []
    pread = os.pread

    def counted(fd: int, size: int, position: int) -> bytes:
        preads.append(position)
        return pread(fd, size, position)

    with _open(tmp_path) as log:
        log.append([make_run(b"k.%d" % i, [b"m%d" % i]) for i in range(10)])
        log.append([make_run(b"k", [b"last"])])
        monkeypatch.setattr(os, "pread", counted)
        assert [s.stop for s in log.read_spans(0, stop_offset=4)] == [4]
        assert len(preads) == 1
        assert flatten(log.read(4, stop_offset=7)) == [
            (offset, b"k.%d" % offset, b"m%d" % offset) for offset in (4, 5, 6)
        ]
        assert len(preads) == 1, "served from the kept batch"
        assert [(s.start, s.stop) for s in log.read_spans(7)] == [(7, 10), (10, 11)]
        assert len(preads) == 1, "the next batch comes from the window read already"
        log.append([make_run(b"k", [b"grown"])])
        assert flatten(log.read(11)) == [(11, b"k", b"grown")]
        assert len(preads) == 2, "past the window: read from the file"


def test_a_truncated_log_never_serves_the_batch_kept_before(tmp_path: Path) -> None:
    with _open(tmp_path) as log:
        log.append([make_run(b"k", [b"old%d" % i for i in range(6)])])
        log.read_spans(0, stop_offset=2)  # keeps the batch
        log.truncate(3)
        log.append([make_run(b"k", [b"new3"])])
        assert [payload for _, _, payload in flatten(log.read(0))] == [
            b"old0",
            b"old1",
            b"old2",
            b"new3",
        ]


def test_reading_another_segment_lets_go_of_the_kept_batch(tmp_path: Path) -> None:
    with _open(tmp_path, 300) as log:
        for index in range(8):
            log.append([make_run(b"k", [b"x" * 60, b"y%d" % index])])
        first, *_, last = log.segments
        assert first is not last
        log.read_spans(0, stop_offset=1)
        assert _keeps(first)
        log.read_spans(last.base_offset)
        assert not _keeps(first)
        assert _keeps(last)


def _keeps(segment: Segment) -> bool:
    """Whether ``segment`` holds on to a batch (and the read buffer it views)."""
    return segment._last_verified is not None


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 40)), min_size=1, max_size=60),
    base=st.integers(0, 2**40),
    where=st.integers(-2, 200),
    length=st.integers(0, 200),
)
def test_compiled_distinct_keys_agree_with_the_pure_ones(
    keys: list[tuple[int, int]], base: int, where: int, length: int
) -> None:
    """Runs over up to 41 keys of any length (past the 16 the compiled one
    remembers by address), any range around them."""
    counts = [count for count, _ in keys]
    names = [b"k%d" % name if name % 5 else b"" for _, name in keys]
    lengths = [len(name) for name in names]
    column = b"".join(names)
    start = base + where
    stop = start + length
    expected = {
        name
        for name, first, count in zip(
            names, itertools.accumulate([base, *counts]), counts, strict=False
        )
        if first < stop and first + count > start
    }
    assert distinct_keys_pure(counts, lengths, column, base, start, stop) == expected
    if distinct_keys_compiled is not None:
        assert distinct_keys_compiled(counts, lengths, column, base, start, stop) == expected
        assert distinct_keys_compiled(counts, lengths, memoryview(column), base, start, stop) == (
            expected
        )
