"""The fast readers of run chunks and runs frames agree with the generic decoder.

``read_chunk_run`` and ``read_runs_frame`` recognise the layout our encoder
writes; everything else goes through the vtable walk. These properties hold
them to it: on our frames they decode what flatc's generated readers decode,
on flatc's frames they step aside, on mutated bytes they either step aside or
agree with the vtable walk, and a run they accept forwards exactly the chunk
that encoding it again would produce.
"""

from __future__ import annotations

import contextlib
import struct
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.chunk_reading import read_chunk_run, read_runs_frame
from broky.protocol.chunks import (
    encode_run_chunk_from_compiled,
    encode_run_chunk_from_pure,
    forward_chunk,
)
from broky.protocol.codec import (
    _decode_run,
    decode_frame,
    encode_frame,
    encode_run_chunk,
    table_fields,
    vector,
)
from broky.protocol.constants import BodyType
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Deliver, Publish, Run
from broky.protocol.message import pack_sizes
from broky.router.router import Router
from tests.protocol.test_flatbuffers_compat import (
    _plain,
    build_with_generated,
    read_with_generated,
)

_U32 = struct.Struct("<I")
#: Hypothesis settings shared by the properties; the flatc fixture is session-scoped.
PROPERTY = settings(max_examples=300, deadline=None)


@st.composite
def runs(draw: st.DrawFn) -> Run:
    """A run of 0-4 opaque message blobs (the codec never looks inside them)."""
    blobs = draw(st.lists(st.binary(max_size=40), max_size=4))
    return Run(
        draw(st.binary(min_size=1, max_size=24)),
        draw(st.integers(-(2**63), 2**63 - 1)),
        len(blobs),
        pack_sizes([len(blob) for blob in blobs]),
        b"".join(blobs),
    )


@st.composite
def runs_frames(draw: st.DrawFn) -> Publish | Deliver:
    drawn = tuple(draw(st.lists(runs(), max_size=4)))
    stream = draw(st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        return Deliver(stream, drawn)
    return Publish(stream, drawn, draw(st.booleans()), draw(st.booleans()))


def _run_tables(data: bytes) -> list[int]:
    """Where each run's table sits in a frame (after its size prefix)."""
    body = data[4:]
    (count,) = _U32.unpack_from(body, 52)
    return [56 + 4 * index + _U32.unpack_from(body, 56 + 4 * index)[0] for index in range(count)]


def _assert_forwarded_as_encoded(run: Run) -> None:
    assert run.chunk is not None
    expected = encode_run_chunk(run.key, run.ts_broker, run.sizes, run.messages)
    assert bytes(run.chunk) == expected
    assert forward_chunk(run) == expected
    assert forward_chunk(run, 42) == encode_run_chunk(run.key, 42, run.sizes, run.messages)


@PROPERTY
@given(frame=runs_frames())
def test_our_frames_take_the_fast_path_and_decode_as_flatc_reads_them(
    generated: SimpleNamespace, frame: Publish | Deliver
) -> None:
    data = encode_frame(frame)
    assert read_runs_frame(memoryview(data)[4:]) is not None
    decoded = decode_frame(memoryview(data)[4:])
    assert _plain(decoded) == read_with_generated(generated, data) == _plain(frame)
    assert isinstance(decoded, (Publish, Deliver))
    for run in decoded.runs:
        _assert_forwarded_as_encoded(run)


@PROPERTY
@given(frame=runs_frames())
def test_flatc_frames_fall_back_to_the_vtable_walk(
    generated: SimpleNamespace, frame: Publish | Deliver
) -> None:
    data = build_with_generated(generated, frame)
    decoded = decode_frame(memoryview(data)[4:])
    assert _plain(decoded) == _plain(frame)
    assert isinstance(decoded, (Publish, Deliver))
    for run in decoded.runs:
        if run.chunk is not None:  # flatc happened to lay it out as we do
            _assert_forwarded_as_encoded(run)


def _header_by_vtables(buf: bytes) -> tuple[int, int, bool, bool, int] | None:
    """What the generic decoder reads from a runs frame's header (None: it
    raises), in read_runs_frame's shape."""
    try:
        body_type_field, body_field = table_fields(buf, _U32.unpack_from(buf, 0)[0], 2)
        body_type = buf[body_type_field]
        table = body_field + _U32.unpack_from(buf, body_field)[0]
        if body_type == BodyType.PUBLISH:
            stream, stamp, runs_field, ack = table_fields(buf, table, 4)
        else:
            stream, runs_field = table_fields(buf, table, 2)
            stamp = ack = 0
        count = vector(buf, runs_field, 4)[1]
    except (RemoteProtocolError, struct.error):
        return None
    return (
        body_type,
        _U32.unpack_from(buf, stream)[0] if stream else 0,
        bool(stamp and buf[stamp]),
        bool(ack and buf[ack]),
        count,
    )


@PROPERTY
@given(
    frame=runs_frames(),
    edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 2**16),
)
def test_on_mutated_bytes_the_fast_readers_step_aside_or_agree(
    frame: Publish | Deliver, edits: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(encode_frame(frame))
    tables = _run_tables(bytes(data))
    for position, value in edits:
        data[4 + position % (len(data) - 4)] = value
    body = bytes(data[4 : max(5, len(data) - cut % 64)])
    header = read_runs_frame(body)
    if header is not None:
        assert header == _header_by_vtables(body)
    for table in tables:
        fast = read_chunk_run(memoryview(body), table)
        if fast is not None:
            assert fast == _decode_run(body, table)
            _assert_forwarded_as_encoded(fast)
    with contextlib.suppress(RemoteProtocolError):  # anything else escaping is the bug
        decode_frame(body)


def test_a_decoded_run_keeps_its_chunk_and_the_router_forwards_a_copy() -> None:
    blob = b"m" * 16
    run = Run(b"orders.eu", 7, 2, pack_sizes([16, 16]), blob * 2)
    data = encode_frame(Publish(1, (run,), stamp_ts_broker=True))
    decoded = decode_frame(memoryview(data)[4:])
    assert isinstance(decoded, Publish)
    (received,) = decoded.runs
    assert received.chunk is not None
    router = Router(clock=lambda: 99)
    (plain,) = router.encode(decoded.runs, stamp_ts_broker=False)
    (stamped,) = router.encode(decoded.runs, stamp_ts_broker=True)
    assert type(plain.chunk) is bytes
    assert plain.chunk == encode_run_chunk(run.key, 7, run.sizes, run.messages)
    assert stamped.chunk == encode_run_chunk(run.key, 99, run.sizes, run.messages)
    assert (plain.key, plain.count) == (b"orders.eu", 2)


@pytest.mark.parametrize("garbage_at", ["pad_word", "messages_pad", "key_nul"])
def test_nonzero_padding_is_re_encoded_not_forwarded(garbage_at: str) -> None:
    """A chunk with garbage in its padding or without the key's NUL decodes
    through the vtable walk and is re-encoded (C++ verifiers reject a string
    without its NUL, so the broker must not forward one)."""
    run = Run(b"k.e.y", 0, 1, pack_sizes([8]), b"12345678")
    data = bytearray(encode_frame(Publish(1, (run,))))
    (table,) = _run_tables(bytes(data))
    chunk_at = 4 + table - 12
    offsets = {"pad_word": 36, "messages_pad": 48, "key_nul": 68 + len(run.key)}
    data[chunk_at + offsets[garbage_at]] = 1
    decoded = decode_frame(memoryview(bytes(data))[4:])
    assert isinstance(decoded, Publish)
    (received,) = decoded.runs
    assert received == run
    assert received.chunk is None
    (encoded,) = Router().encode(decoded.runs, stamp_ts_broker=False)
    assert encoded.chunk == encode_run_chunk(run.key, 0, run.sizes, run.messages)


@given(
    key=st.binary(max_size=40),
    messages=st.lists(st.binary(max_size=60), max_size=8),
)
def test_the_run_chunk_of_a_publishers_open_run_is_the_same_compiled_or_pure(
    key: bytes, messages: list[bytes]
) -> None:
    """A publisher closes its open run (sizes and buffers) with the compiled
    encoder when it is built; it writes the pure one's bytes, which decode
    to the run that was open."""
    sizes = [len(message) for message in messages]
    pure = encode_run_chunk_from_pure(key, sizes, messages)
    assert pure == encode_run_chunk(key, 0, pack_sizes(sizes), b"".join(messages))
    if encode_run_chunk_from_compiled is not None:
        assert encode_run_chunk_from_compiled(key, sizes, messages) == pure
        if messages:
            wrong = [*sizes[:-1], sizes[-1] + 1]
            with pytest.raises(ValueError, match="disagrees"):
                encode_run_chunk_from_compiled(key, wrong, messages)
            with pytest.raises(ValueError, match="differ in number"):
                encode_run_chunk_from_compiled(key, sizes, messages[:-1])
    if messages:
        with pytest.raises(ValueError, match="disagree"):
            encode_run_chunk_from_pure(key, [*sizes[:-1], sizes[-1] + 1], messages)
