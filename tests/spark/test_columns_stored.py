"""A data directory read through the columnar path gives exactly the rows of
the run-by-run path: logs written one message per key (format 2 batches of
many runs) and old logs (format 1), whole or sliced to any offset range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.frames import Run
from broky.protocol.message import encode_message, pack_sizes
from broky.spark.columns import RunColumns, record_batches, slice_run
from broky.spark.logs import DataDirLog
from broky.spark.planning import OffsetRange
from broky.storage.batch import encode_batch
from broky.storage.config import LogConfig
from broky.storage.log import PartitionLog
from broky.storage.reader import iter_batches, partition_files
from broky.storage.segment import LOG_SUFFIX, segment_stem

messages = st.fixed_dictionaries(
    {
        "payload": st.binary(max_size=60),
        "ts_producer": st.one_of(st.just(0), st.integers(1, 2**62)),
        "key_partition": st.one_of(st.just(b""), st.binary(min_size=1, max_size=4)),
    }
)
run_specs = st.tuples(
    st.sampled_from(["k0", "k1", "orders.é", "x.y.z"]),
    st.integers(0, 2**62),
    st.lists(messages, min_size=1, max_size=3),
)


def make_run(key: str, ts_broker: int, fields: list[dict[str, Any]]) -> Run:
    encoded = [encode_message(**item) for item in fields]
    return Run(
        key.encode(),
        ts_broker,
        len(encoded),
        pack_sizes([len(m) for m in encoded]),
        b"".join(encoded),
    )


def rows_by_runs(directory: Path, start: int, stop: int) -> list[dict[str, Any]]:
    """The reference: every stored run through the run-by-run path."""
    runs = [
        Run(b.key, b.ts_broker, b.count, b.sizes, b.messages, 0, b.base_offset)
        for b in iter_batches(partition_files(str(directory)), start)
        if b.base_offset < stop
    ]
    sliced = [run for run in (slice_run(run, start, stop) for run in runs) if run.count]
    return [row for batch in record_batches("t", 0, sliced) for row in batch.to_pylist()]


@settings(max_examples=30, deadline=None)
@given(
    appends=st.lists(st.lists(run_specs, min_size=1, max_size=12), min_size=1, max_size=4),
    old=st.lists(run_specs, max_size=4),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_the_columnar_read_equals_the_run_by_run_read(
    tmp_path_factory: pytest.TempPathFactory,
    appends: list[list[tuple[str, int, list[dict[str, Any]]]]],
    old: list[tuple[str, int, list[dict[str, Any]]]],
    cut: tuple[float, float],
) -> None:
    root = tmp_path_factory.mktemp("data")
    directory = root / "t" / "0"
    directory.mkdir(parents=True)
    offset = 0
    if old:  # a format 1 segment first, as an older broker left it
        data = []
        for key, ts, fields in old:
            data.append(encode_batch(offset, 1, make_run(key, ts, fields)))
            offset += len(fields)
        (directory / (segment_stem(0) + LOG_SUFFIX)).write_bytes(b"".join(data))
    with PartitionLog.open(str(directory), LogConfig(segment_bytes=2048)) as log:
        for specs in appends:
            log.append([make_run(key, ts, fields) for key, ts, fields in specs])
        end = log.end_offset
    start = int(min(cut) * end)
    stop = max(int(max(cut) * end), start)
    reader = DataDirLog(str(root))
    got = [
        row
        for batch in reader.read_range(OffsetRange("t", 0, start, stop))
        for row in batch.to_pylist()
    ]
    assert got == rows_by_runs(directory, start, stop)
    assert [row["offset"] for row in got] == list(range(start, stop))


def test_columns_of_many_runs_make_one_arrow_batch() -> None:
    runs = [make_run(f"k{n}", n + 1, [{"payload": b"p%d" % n}]) for n in range(50)]
    pieces = RunColumns.of_runs(
        [
            Run(r.key, r.ts_broker, r.count, r.sizes, r.messages, 0, 7 + n)
            for n, r in enumerate(runs)
        ]
    )
    (batch,) = record_batches("t", 0, [pieces])
    assert batch.column("key").to_pylist() == [f"k{n}" for n in range(50)]
    assert batch.column("offset").to_pylist() == list(range(7, 57))
