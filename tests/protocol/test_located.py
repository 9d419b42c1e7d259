"""The located-chunk reader (the runs of a durable Deliver) agrees with the generic decoder.

``read_located_run`` and its compiled twin inside ``read_chunk_runs``
recognise the layout ``encode_located_chunk`` writes. On our frames they read
every run, and read it as the vtable walk does; on mutated bytes they either
step aside (None) or still agree with the vtable walk; the pure and the
compiled readers give the same answer whatever the bytes, and the compiled
encoder writes exactly the pure one's bytes.
"""

from __future__ import annotations

import contextlib
import struct

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol import codec
from broky.protocol.chunk_reading import RUNS_FRAME_RUNS_AT
from broky.protocol.chunks import encode_located_chunk, runs_frame_parts
from broky.protocol.codec import _decode_run, decode_frame
from broky.protocol.constants import BodyType
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Deliver, Run
from broky.protocol.located import (
    encode_located_compiled,
    read_chunk_runs_pure,
    read_located_run,
)
from broky.protocol.message import pack_sizes
from tests.protocol.test_chunks import runs

_U32 = struct.Struct("<I")
PROPERTY = settings(max_examples=300, deadline=None)


@st.composite
def located_runs(draw: st.DrawFn) -> Run:
    """A durable run of 0-4 opaque blobs, with its partition and base offset."""
    return attrs.evolve(
        draw(runs()),
        partition=draw(st.integers(0, 2**32 - 1)),
        base_offset=draw(st.integers(0, 2**63 - 1)),
    )


def _deliver(runs: list[Run], stream: int) -> bytes:
    chunks = [
        encode_located_chunk(
            run.key, run.ts_broker, run.sizes, run.messages, run.partition, run.base_offset
        )
        for run in runs
    ]
    return b"".join(runs_frame_parts(BodyType.DELIVER, stream, chunks))


def _tables(body: bytes) -> list[int]:
    (count,) = _U32.unpack_from(body, 52)
    return [56 + 4 * index + _U32.unpack_from(body, 56 + 4 * index)[0] for index in range(count)]


@PROPERTY
@given(drawn=st.lists(located_runs(), max_size=4), stream=st.integers(0, 2**32 - 1))
def test_located_runs_take_the_fast_path_and_decode_as_written(
    drawn: list[Run], stream: int
) -> None:
    data = _deliver(drawn, stream)
    view = memoryview(data)[4:]
    fast = read_chunk_runs_pure(view, RUNS_FRAME_RUNS_AT, len(drawn))
    assert fast == drawn
    assert all(run is not None and run.chunk is None for run in fast)
    assert [_decode_run(bytes(view), table) for table in _tables(bytes(view))] == drawn
    assert decode_frame(view) == Deliver(stream, tuple(drawn))


@PROPERTY
@given(
    drawn=st.lists(located_runs(), min_size=1, max_size=4),
    edits=st.lists(st.tuples(st.integers(0, 2**12), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 2**12),
)
def test_on_mutated_bytes_the_located_readers_step_aside_or_agree(
    drawn: list[Run], edits: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(_deliver(drawn, 1))
    tables = _tables(bytes(data[4:]))
    vector_end = RUNS_FRAME_RUNS_AT + 4 + 4 * len(drawn) + 4
    for position, value in edits:  # corrupt the runs, keep the runs vector
        data[vector_end + position % (len(data) - vector_end)] = value
    body = bytes(data[4 : max(vector_end, len(data) - cut % 64)])
    for table in tables:
        fast = read_located_run(memoryview(body), table)
        if fast is not None:
            assert fast == _decode_run(body, table)
    compiled = codec.read_chunk_runs_compiled
    if compiled is not None:
        view = memoryview(body)
        assert compiled(view, RUNS_FRAME_RUNS_AT, len(drawn)) == read_chunk_runs_pure(
            view, RUNS_FRAME_RUNS_AT, len(drawn)
        )
    with contextlib.suppress(RemoteProtocolError):  # anything else escaping is the bug
        decode_frame(body)


def test_the_compiled_reader_reads_located_runs() -> None:
    compiled = codec.read_chunk_runs_compiled
    if compiled is None:
        pytest.skip("the compiled reader is not in use (BROKY_PURE=1)")
    run = Run(b"orders.eu", 7, 2, pack_sizes([3, 4]), b"abcdefg", 5, 1234)
    view = memoryview(_deliver([run], 9))[4:]
    (read,) = compiled(view, RUNS_FRAME_RUNS_AT, 1)
    assert read == run
    assert (read.partition, read.base_offset, read.chunk) == (5, 1234, None)


@PROPERTY
@given(run=located_runs(), ts_broker=st.integers(-(2**63), 2**63 - 1))
def test_the_compiled_encoder_writes_the_pure_ones_bytes(run: Run, ts_broker: int) -> None:
    if encode_located_compiled is None:
        pytest.skip("the compiled encoder is not in use (BROKY_PURE=1)")
    fields = (run.key, ts_broker, run.sizes, run.messages, run.partition, run.base_offset)
    assert encode_located_compiled(*fields) == encode_located_chunk(*fields)
    viewed = (run.key, ts_broker, memoryview(run.sizes), memoryview(run.messages))
    assert encode_located_compiled(*viewed, run.partition, run.base_offset) == encode_located_chunk(
        *viewed, run.partition, run.base_offset
    )
