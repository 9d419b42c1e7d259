"""The compiled batch encoder (``broky.storage._batch``) writes exactly the
bytes of the pure one (``encode_runs_pure``) and refuses exactly what it
refuses, with the same StorageError; so does its ``stored_byte_ends``."""

from __future__ import annotations

import struct
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.frames import Run
from broky.storage import batch
from broky.storage.batch import encode_runs_pure, run_stored_bytes, stored_byte_ends_pure
from broky.storage.errors import StorageError
from tests.storage.runs import make_run

compiled = batch.encode_runs_compiled
compiled_ends = batch.stored_byte_ends_compiled
needs_compiled = pytest.mark.skipif(
    compiled is None or compiled_ends is None, reason="the compiled batch encoder is not built"
)

#: (key, ts_broker, payloads, producer id, sequence) of one valid run.
run_specs = st.tuples(
    st.sampled_from([b"a", b"k.1", b"orders.eu.long-key-name", b"x" * 300]),
    st.integers(-(2**63), 2**63 - 1),
    st.lists(st.binary(max_size=40), min_size=1, max_size=5),
    st.sampled_from([0, 1, 0xABCD, 2**64 - 1]),
    st.integers(0, 2**64 - 1),
)


def build(specs: list[tuple[bytes, int, list[bytes], int, int]], views: bool) -> list[Run]:
    """The runs of ``specs``; with ``views``, their sizes and messages as
    memoryviews (what the frame reader and the log's reads hand over)."""
    runs = [make_run(key, payloads, ts) for key, ts, payloads, _, _ in specs]
    if not views:
        return runs
    return [
        Run(run.key, run.ts_broker, run.count, memoryview(run.sizes), memoryview(run.messages))
        for run in runs
    ]


def outcome(encode: Any, *args: Any) -> bytes | str:
    """What ``encode`` returns, or the message of the StorageError it raises."""
    try:
        return bytes(encode(*args))
    except StorageError as exc:
        return f"StorageError: {exc}"


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(
    specs=st.lists(run_specs, min_size=1, max_size=12),
    base=st.integers(0, 2**62),
    log_time=st.integers(0, 2**62),
    stamped=st.booleans(),
    with_producers=st.booleans(),
    views=st.booleans(),
)
def test_compiled_encoder_writes_the_pure_bytes(
    specs: list[tuple[bytes, int, list[bytes], int, int]],
    base: int,
    log_time: int,
    stamped: bool,
    with_producers: bool,
    views: bool,
) -> None:
    runs = build(specs, views)
    stamps = [ts ^ 0x5A5A for _, ts, _, _, _ in specs] if stamped else None
    producers = [(p, s) for _, _, _, p, s in specs] if with_producers else None
    expected = encode_runs_pure(base, log_time, runs, stamps, producers)
    assert compiled is not None
    assert compiled(base, log_time, runs, stamps, producers) == expected
    assert compiled(base, log_time, tuple(runs), stamps, producers) == expected
    assert compiled_ends is not None
    assert compiled_ends(runs) == stored_byte_ends_pure(runs)


#: How a run may be broken: its count, its size table or its key.
breakages = st.sampled_from(
    ["none", "zero_count", "short_table", "sizes_disagree", "long_key", "count_too_big"]
)


def broken(run: Run, how: str) -> Run:
    if how == "zero_count":
        return Run(run.key, run.ts_broker, 0, b"", b"")
    if how == "short_table":
        return Run(run.key, run.ts_broker, run.count, bytes(run.sizes)[:-1], run.messages)
    if how == "sizes_disagree":
        return Run(run.key, run.ts_broker, run.count, run.sizes, bytes(run.messages) + b"!")
    if how == "long_key":
        return Run(b"k" * 0x10000, run.ts_broker, run.count, run.sizes, run.messages)
    if how == "count_too_big":
        return Run(run.key, run.ts_broker, run.count + 1, run.sizes, run.messages)
    return run


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(
    specs=st.lists(st.tuples(run_specs, breakages), max_size=6),
    producer_entries=st.one_of(st.none(), st.integers(0, 7)),
)
def test_compiled_encoder_refuses_what_the_pure_one_refuses(
    specs: list[tuple[tuple[bytes, int, list[bytes], int, int], str]],
    producer_entries: int | None,
) -> None:
    runs = [
        broken(run, how)
        for run, (_, how) in zip(build([spec for spec, _ in specs], False), specs, strict=True)
    ]
    producers = None if producer_entries is None else [(1, 1)] * producer_entries
    assert compiled is not None
    assert outcome(compiled, 0, 0, runs, None, producers) == outcome(
        encode_runs_pure, 0, 0, runs, None, producers
    )


def test_wrong_number_of_stamps_is_refused_by_both() -> None:
    runs = [make_run(b"a", [b"1"]), make_run(b"b", [b"2"])]
    for encode in (encode_runs_pure, compiled):
        if encode is None:
            continue
        with pytest.raises(StorageError, match="1 ts_broker stamps for 2 runs"):
            encode(0, 0, runs, [7])


def test_stored_byte_ends_are_the_running_total_of_run_stored_bytes() -> None:
    runs = [make_run(b"a", [b"1"]), make_run(b"orders.x", [b"22", b"333"])]
    sizes = [run_stored_bytes(run) for run in runs]
    assert stored_byte_ends_pure(runs) == [sizes[0], sizes[0] + sizes[1]]
    assert batch.stored_byte_ends(runs) == stored_byte_ends_pure(runs)
    assert batch.stored_byte_ends([]) == []


def test_batch_count_is_in_the_header_where_the_log_reads_it() -> None:
    runs = [make_run(b"a", [b"1", b"2"]), make_run(b"b", [b"3"])]
    assert struct.unpack_from("<I", batch.encode_runs(0, 0, runs), 16) == (3,)


@attrs.frozen
class LookalikeRun:
    """Not a ``Run``, with its fields: read by name, not at Run's slots."""

    key: bytes
    ts_broker: int
    count: int
    sizes: bytes
    messages: bytes


@needs_compiled
def test_runs_of_another_type_are_read_by_name() -> None:
    runs = [make_run(b"a", [b"1", b"22"], 5), make_run(b"orders.x", [b"333"], 6)]
    lookalikes = [
        LookalikeRun(run.key, run.ts_broker, run.count, bytes(run.sizes), bytes(run.messages))
        for run in runs
    ]
    assert compiled is not None
    assert compiled_ends is not None
    assert compiled(1, 2, lookalikes) == encode_runs_pure(1, 2, runs)  # type: ignore[arg-type]
    assert compiled_ends(lookalikes) == stored_byte_ends_pure(runs)  # type: ignore[arg-type]
