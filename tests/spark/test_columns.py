"""The columnar decoder agrees with the message decoder, without Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.frames import Run
from broky.protocol.message import decode_run, encode_message, pack_sizes
from broky.spark import columns
from broky.spark.columns import ARROW_SCHEMA, READ_SCHEMA, record_batches, slice_run

messages: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {
        "payload": st.binary(max_size=200),
        "ts_producer": st.one_of(st.just(0), st.integers(1, 2**62)),
        "key_partition": st.one_of(st.just(b""), st.binary(min_size=1, max_size=8)),
        "uid": st.one_of(st.just(b""), st.binary(min_size=20, max_size=20)),
        "tags": st.lists(
            st.tuples(st.text(min_size=1, max_size=5), st.text(max_size=5)), max_size=2
        ),
    }
)


def make_run(fields: list[dict[str, Any]], base: int, ts_broker: int, key: str) -> Run:
    encoded = [encode_message(**item) for item in fields]
    return Run(
        key.encode(),
        ts_broker,
        len(encoded),
        pack_sizes([len(m) for m in encoded]),
        b"".join(encoded),
        3,
        base,
    )


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@settings(deadline=None, max_examples=60)
@given(
    st.lists(st.lists(messages, min_size=1, max_size=20), min_size=1, max_size=5),
    st.one_of(st.just(0), st.integers(1, 2**62)),
)
def test_columns_match_decode_run(runs_fields: list[list[dict[str, Any]]], ts: int) -> None:
    runs, base = [], 0
    for index, fields in enumerate(runs_fields):
        runs.append(make_run(fields, base, ts, f"orders.k{index}"))
        base += len(fields)
    batches = list(record_batches("orders", 3, runs))
    assert all(batch.schema == ARROW_SCHEMA for batch in batches)
    rows = [row for batch in batches for row in batch.to_pylist()]
    expected = [message for run in runs for message in decode_run(run)]
    assert len(rows) == len(expected)
    for row, message in zip(rows, expected, strict=True):
        assert row["topic"] == "orders"
        assert row["partition"] == 3
        assert row["offset"] == message.offset
        assert row["key"] == message.key
        assert row["payload"] == message.payload
        assert (row["key_partition"] or b"") == message.key_partition
        assert (row["uid"] or b"") == message.uid
        assert row["tags"] == list(message.tags)
        assert micros(row["ts_producer"]) == spark_time(message.ts_producer)
        assert micros(row["ts_broker"]) == spark_time(ts)


def spark_time(nanoseconds: int) -> int | None:
    """Spark keeps microseconds; Broky's 0 means unset."""
    return None if nanoseconds == 0 else nanoseconds // 1000


def micros(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    return (moment - EPOCH) // timedelta(microseconds=1)


def test_schema_nullability_is_the_spark_schema() -> None:
    for field in READ_SCHEMA.fields:
        assert ARROW_SCHEMA.field(field.name).nullable == field.nullable


def test_slice_and_time_range() -> None:
    run = make_run([{"payload": bytes([i])} for i in range(10)], 100, 5_000, "k")
    part = slice_run(run, 103, 107)
    assert [message.offset for message in decode_run(part)] == [103, 104, 105, 106]
    assert [m.payload for m in decode_run(part)] == [bytes([i]) for i in range(3, 7)]
    assert list(record_batches("t", 0, [run], (0, 5_000))) == []
    assert sum(b.num_rows for b in record_batches("t", 0, [run], (5_000, 5_001))) == 10


def test_batches_are_bounded_in_rows_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [make_run([{"payload": b"x" * 1000}] * 10, 10 * index, 1, "k") for index in range(5)]
    monkeypatch.setattr(columns, "BATCH_BYTES", 15_000)  # two runs' worth
    batches = list(record_batches("t", 0, runs))
    assert [batch.num_rows for batch in batches] == [20, 20, 10]
    offsets = [offset for batch in batches for offset in batch.column("offset").to_pylist()]
    assert offsets == list(range(50))


def test_a_key_that_is_not_utf8_is_replaced_not_fatal() -> None:
    run = make_run([{"payload": b"p"}], 0, 1, "k")
    broken = Run(b"bad\xff", run.ts_broker, run.count, run.sizes, run.messages, 0, 0)
    (batch,) = record_batches("t", 0, [broken])
    assert batch.column("key").to_pylist() == ["bad\ufffd"]
