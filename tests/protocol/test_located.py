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
import gc
import itertools
import struct

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol import chunks as chunks_module
from broky.protocol import codec
from broky.protocol.chunk_reading import RUNS_FRAME_RUNS_AT
from broky.protocol.chunks import encode_located_chunk, runs_frame_parts, sized_runs_frame_parts
from broky.protocol.codec import _decode_run, decode_frame, encode_frame
from broky.protocol.constants import BodyType
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Deliver, Publish, Run
from broky.protocol.located import (
    encode_located_blob_compiled,
    encode_located_blob_pure,
    encode_located_compiled,
    encode_located_runs_compiled,
    encode_located_runs_pure,
    read_chunk_runs_pure,
    read_located_run,
    run_index_compiled,
    run_index_pure,
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


@st.composite
def stored_columns(draw: st.DrawFn) -> tuple[list[Run], int, int, int]:
    """Runs of 1-4 messages as one stored batch's columns hold them, the
    batch's base offset and a ``[start, stop)`` around or inside it."""
    drawn = [run for run in draw(st.lists(runs(), min_size=1, max_size=5)) if run.count] or [
        Run(b"k", 1, 1, pack_sizes([1]), b"m")
    ]
    base = draw(st.integers(0, 2**40))
    total = sum(run.count for run in drawn)
    start = base + draw(st.integers(-2, total + 1))
    return drawn, base, start, start + draw(st.integers(0, total + 2))


def _columns(drawn: list[Run]) -> tuple[list[int], list[int], list[int], bytes, bytes, bytes]:
    """``drawn`` as one stored batch's columns."""
    return (
        [run.ts_broker for run in drawn],
        [run.count for run in drawn],
        [len(run.key) for run in drawn],
        b"".join(run.key for run in drawn),
        b"".join(run.sizes for run in drawn),
        b"".join(run.messages for run in drawn),
    )


@PROPERTY
@given(case=stored_columns(), partition=st.integers(0, 2**32 - 1))
def test_located_runs_lay_out_each_stored_run_sliced_to_the_range(
    case: tuple[list[Run], int, int, int], partition: int
) -> None:
    drawn, base, start, stop = case
    columns = _columns(drawn)
    chunks = encode_located_runs_pure(*columns, base, [start, stop], partition)
    expected: list[tuple[int, bytes, int, bytes]] = []
    offset = base
    for run in drawn:
        sizes = struct.unpack(f"<{run.count}I", run.sizes)
        at = 0
        for size in sizes:
            if start <= offset < stop:
                expected.append(
                    (offset, run.key, run.ts_broker, bytes(run.messages[at : at + size]))
                )
            offset += 1
            at += size
    laid_out = []
    for chunk in chunks:
        read = read_located_run(memoryview(chunk), 12)
        assert read is not None
        assert read.partition == partition
        at = 0
        for index, size in enumerate(struct.unpack(f"<{read.count}I", read.sizes)):
            message = bytes(read.messages[at : at + size])
            laid_out.append((read.base_offset + index, read.key, read.ts_broker, message))
            at += size
    assert laid_out == expected
    if encode_located_runs_compiled is not None:
        assert encode_located_runs_compiled(*columns, base, [start, stop], partition) == chunks
        ts_brokers, counts, key_lengths, keys, stored_sizes, messages = columns
        assert (
            encode_located_runs_compiled(
                ts_brokers,
                counts,
                key_lengths,
                memoryview(keys),
                memoryview(stored_sizes),
                memoryview(messages),
                base,
                [start, stop],
                partition,
            )
            == chunks
        )


@PROPERTY
@given(
    case=stored_columns(),
    bounds=st.lists(st.integers(-2, 24), max_size=8, unique=True),
    partition=st.integers(0, 2**32 - 1),
)
def test_located_runs_over_several_ranges_are_each_ranges_chunks_in_turn(
    case: tuple[list[Run], int, int, int], bounds: list[int], partition: int
) -> None:
    """A consumer's scattered deliveries from one batch in one call: the
    chunks one call per range would give, in offset order, compiled or not."""
    drawn, base, _, _ = case
    columns = _columns(drawn)
    ranges = [base + bound for bound in sorted(bounds)[: len(bounds) // 2 * 2]]
    expected = [
        chunk
        for pair in range(0, len(ranges), 2)
        for chunk in encode_located_runs_pure(*columns, base, ranges[pair : pair + 2], partition)
    ]
    assert encode_located_runs_pure(*columns, base, ranges, partition) == expected
    if encode_located_runs_compiled is not None:
        assert encode_located_runs_compiled(*columns, base, ranges, partition) == expected


@st.composite
def many_runs(draw: st.DrawFn) -> list[Run]:
    """Up to 80 runs of 1-3 messages (keys and payloads of a few bytes):
    enough that ranges lie more than ``located.JUMP`` messages apart."""
    drawn = []
    for index in range(draw(st.integers(1, 80))):
        payloads = draw(st.lists(st.binary(max_size=3), min_size=1, max_size=3))
        drawn.append(
            Run(
                b"k%d" % draw(st.integers(0, 500)),
                index,
                len(payloads),
                pack_sizes([len(payload) for payload in payloads]),
                b"".join(payloads),
            )
        )
    return drawn


@PROPERTY
@given(
    drawn=many_runs(),
    bounds=st.lists(st.integers(-2, 250), max_size=16, unique=True),
    base=st.integers(0, 2**40),
)
def test_located_runs_jump_through_the_run_index_to_the_same_chunks(
    drawn: list[Run], bounds: list[int], base: int
) -> None:
    """Scattered ranges far apart over many runs: with the batch's run
    index (pure or compiled, the same bytes), both encoders lay out exactly
    the chunks of the walk without it (the compiled one also steps over the
    runs between near ranges by the index)."""
    columns = _columns(drawn)
    ranges = [base + bound for bound in sorted(bounds)[: len(bounds) // 2 * 2]]
    index = run_index_pure(columns[1], columns[2], columns[4])
    if run_index_compiled is not None:
        assert run_index_compiled(columns[1], columns[2], columns[4]) == index
    walked = encode_located_runs_pure(*columns, base, ranges, 0)
    encoders = [encode_located_runs_pure, encode_located_runs_compiled]
    for encode in filter(None, encoders):
        assert encode(*columns, base, ranges, 0, run_starts=index) == walked
        assert encode(*columns, base, ranges, 0, run_starts=memoryview(index)) == walked
    # The same chunks back to back, with their lengths (what a delivery
    # frame is assembled from), with the index or without.
    blob = (b"".join(walked), struct.pack(f"<{len(walked)}I", *map(len, walked)))
    for encode_blob in filter(None, [encode_located_blob_pure, encode_located_blob_compiled]):
        assert encode_blob(*columns, base, ranges, 0) == blob
        assert encode_blob(*columns, base, ranges, 0, run_starts=index) == blob


@pytest.mark.parametrize("encode", [encode_located_blob_pure, encode_located_blob_compiled])
def test_located_blobs_refuse_what_located_runs_refuse(encode: object) -> None:
    """The blob encoder checks its arguments as ``encode_located_runs`` does."""
    if encode is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    assert callable(encode)
    with pytest.raises(ValueError, match="pairs"):
        encode([1], [1], [1], b"k", pack_sizes([1]), b"a", 0, [0], 0)
    other = run_index_pure([1, 1], [1, 1], pack_sizes([1, 1]))
    with pytest.raises(ValueError, match="length"):
        encode([1], [1], [1], b"k", pack_sizes([1]), b"a", 0, [0, 1], 0, run_starts=other)
    assert encode([1], [1], [1], b"k", pack_sizes([1]), b"a", 5, [0, 5], 0) == (b"", b"")


@PROPERTY
@given(drawn=st.lists(located_runs(), min_size=1, max_size=6), cuts=st.lists(st.integers(0, 6)))
def test_a_frame_of_sized_chunks_is_the_frame_of_the_chunks(
    drawn: list[Run], cuts: list[int]
) -> None:
    """Chunks given back to back in any grouping with their lengths
    (``sized_runs_frame_parts``) make the very frame ``runs_frame_parts``
    makes of them one by one; lengths that do not add up are refused."""
    chunks = [
        encode_located_chunk(run.key, run.ts_broker, run.sizes, run.messages, 7, 100)
        for run in drawn
    ]
    lengths = struct.pack(f"<{len(chunks)}I", *map(len, chunks))
    edges = sorted({0, len(chunks), *(min(cut, len(chunks)) for cut in cuts)})
    blobs = [b"".join(chunks[low:high]) for low, high in itertools.pairwise(edges)]
    expected = b"".join(runs_frame_parts(BodyType.DELIVER, 9, chunks))
    assert b"".join(sized_runs_frame_parts(BodyType.DELIVER, 9, blobs, lengths)) == expected
    assert chunks_module.length_offsets_pure(lengths, 40) == chunks_module.chunk_offsets_pure(
        chunks, 40
    )
    if chunks_module.length_offsets_compiled is not None:
        assert chunks_module.length_offsets_compiled(lengths, 40) == (
            chunks_module.chunk_offsets_pure(chunks, 40)
        )
    with pytest.raises(ValueError, match="add up"):
        sized_runs_frame_parts(BodyType.DELIVER, 9, [*blobs, b"extra"], lengths)


@pytest.mark.parametrize("encode", [encode_located_runs_pure, encode_located_runs_compiled])
def test_located_runs_refuse_a_run_index_of_another_length(encode: object) -> None:
    if encode is None:
        pytest.skip("the compiled encoder is not in use (BROKY_PURE=1)")
    assert callable(encode)
    columns = ([1, 2], [1, 1], [1, 1], b"ab", pack_sizes([1, 1]), b"xy")
    other = run_index_pure([1], [1], pack_sizes([1]))
    with pytest.raises(ValueError, match="length"):
        encode(*columns, 0, [0, 2], 0, run_starts=other)


@pytest.mark.parametrize("encode", [encode_located_runs_pure, encode_located_runs_compiled])
def test_located_runs_refuse_ranges_that_are_not_pairs(encode: object) -> None:
    if encode is None:
        pytest.skip("the compiled encoder is not in use (BROKY_PURE=1)")
    assert callable(encode)
    with pytest.raises(ValueError, match="pairs"):
        encode([1], [1], [1], b"k", pack_sizes([1]), b"m", 0, [0, 1, 2], 0)


def test_the_compiled_located_runs_refuse_columns_past_their_buffers() -> None:
    if encode_located_runs_compiled is None:
        pytest.skip("the compiled encoder is not in use (BROKY_PURE=1)")
    sizes = pack_sizes([3])
    with pytest.raises(ValueError, match="past"):
        encode_located_runs_compiled([1], [2], [1], b"k", sizes, b"abc", 0, [0, 2], 0)
    with pytest.raises(ValueError, match="past"):
        encode_located_runs_compiled([1], [1], [1], b"k", pack_sizes([4]), b"abc", 0, [0, 1], 0)


@pytest.mark.parametrize(
    "forged",
    [
        # message starts, key starts, byte starts (one entry per run and the totals)
        ([0, 5], [0, 1], [0, 3]),  # more messages than the size table holds
        ([0, 1], [0, 9], [0, 3]),  # a key past the keys
        ([0, 1], [0, 1], [0, 8]),  # bytes past the messages
        ([0, 1], [0, 1], [2, 1]),  # a run that ends before it begins
        ([0, 1], [0, 1], [0, 1]),  # sizes that run past the run's bytes
    ],
)
def test_the_compiled_located_runs_refuse_an_index_past_the_batch(
    forged: tuple[list[int], list[int], list[int]],
) -> None:
    """The compiled walk steps by the index's columns: an index that does
    not describe the batch (its right length, wrong values) is refused, not
    read past a buffer."""
    if encode_located_runs_compiled is None:
        pytest.skip("the compiled encoder is not in use (BROKY_PURE=1)")
    index = struct.pack("<6q", *forged[0], *forged[1], *forged[2])
    columns = ([1], [1], [1], b"k", pack_sizes([3]), b"abc")
    assert encode_located_runs_compiled(
        *columns, 0, [0, 1], 0, run_starts=run_index_pure([1], [1], pack_sizes([3]))
    ) == encode_located_runs_pure(*columns, 0, [0, 1], 0)
    with pytest.raises(ValueError, match="past"):
        encode_located_runs_compiled(*columns, 0, [0, 1], 0, run_starts=index)


def test_the_compiled_reader_stores_run_fields_at_their_slots() -> None:
    """On CPython the compiled reader finds Run's eight fields as object
    slots and stores them directly (the property tests above then check
    that path); elsewhere it keeps storing them by name."""
    if codec.read_chunk_runs_compiled is None:
        pytest.skip("the compiled reader is not in use (BROKY_PURE=1)")
    from broky.protocol import _run_slots  # noqa: PLC0415

    assert _run_slots.DIRECT_SLOTS
    run = Run(b"k.slot", 7, 1, pack_sizes([3]), b"abc", 5, 9)
    frame = decode_frame(memoryview(_deliver([run], 1))[4:])
    assert isinstance(frame, Deliver)
    (read,) = frame.runs
    assert (read.key, read.ts_broker, read.count, read.partition, read.base_offset) == (
        b"k.slot",
        7,
        1,
        5,
        9,
    )
    assert bytes(read.sizes) == pack_sizes([3])
    assert bytes(read.messages) == b"abc"
    # Holding nothing that can refer back to it, it is left out of the
    # cycle collector's walks (see _run_slots).
    assert not gc.is_tracked(read)


def test_the_compiled_reader_shares_repeated_keys_and_size_tables() -> None:
    """Runs of a key met before get that key's bytes object back, and
    one-message runs of a size met before that size's table (not a new
    object per run); runs whose size tables share a cache slot (3 and
    1,027 bytes) still read as written, whether published or delivered."""
    if codec.read_chunk_runs_compiled is None:
        pytest.skip("the compiled reader is not in use (BROKY_PURE=1)")
    written = [
        Run(b"k.a", 0, 1, pack_sizes([3]), b"abc"),
        Run(b"k.b", 0, 1, pack_sizes([5]), b"defgh"),
        Run(b"k.a", 0, 1, pack_sizes([3]), b"ijk"),
        Run(b"k.c", 0, 1, pack_sizes([1027]), b"x" * 1027),
        Run(b"k.a", 0, 1, pack_sizes([3]), b"lmn"),
    ]
    published = decode_frame(memoryview(encode_frame(Publish(1, tuple(written))))[4:])
    located = [Run(run.key, 7, run.count, run.sizes, run.messages, 2, 10) for run in written]
    delivered = decode_frame(memoryview(_deliver(located, 1))[4:])
    for frame in (published, delivered):
        assert isinstance(frame, Publish | Deliver)
        runs = frame.runs
        assert [(run.key, bytes(run.sizes), bytes(run.messages)) for run in runs] == [
            (run.key, bytes(run.sizes), bytes(run.messages)) for run in written
        ]
        assert runs[0].key is runs[2].key
        assert runs[0].sizes is runs[2].sizes
