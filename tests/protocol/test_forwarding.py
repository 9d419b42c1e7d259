"""Publish frames read for forwarding agree with decoding them in full.

A broker's ProtocolMachine hands over unacked, unstamped Publish frames laid
out as our encoder lays them out as ForwardPublish (runs kept as chunks,
consecutive frames of one stream merged). These properties hold that path
to the generic decoder: same runs, same order, chunks byte-identical to
encoding each run again; frames that do not qualify come out decoded; on
mutated bytes the fast reader either steps aside or agrees.
"""

from __future__ import annotations

import contextlib
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol import forward
from broky.protocol.chunks import (
    chunk_offsets_compiled,
    chunk_offsets_pure,
    read_forwardable_runs,
    read_runs_frame,
)
from broky.protocol.codec import decode_frame, encode_frame, encode_run_chunk
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import (
    EncodedRun,
    Error,
    ForwardPublish,
    Frame,
    Hello,
    Ping,
    Publish,
    Received,
    Run,
    Subscribe,
)
from broky.protocol.framing import encode_preamble
from tests.protocol.test_chunks import runs

PROPERTY = settings(max_examples=300, deadline=None)
_U32 = struct.Struct("<I")


def _encoded(run: Run) -> EncodedRun:
    return EncodedRun(
        run.key, run.count, encode_run_chunk(run.key, run.ts_broker, run.sizes, run.messages)
    )


@st.composite
def traffic(draw: st.DrawFn) -> list[Publish | Subscribe | Ping]:
    """Publish frames on a few streams, some acked or stamped, between
    other frames: what a client's connection carries."""
    frames: list[Publish | Subscribe | Ping] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.integers(0, 9))
        if kind == 0:
            frames.append(Ping(draw(st.integers(0, 2**64 - 1))))
        elif kind == 1:
            frames.append(Subscribe(draw(st.integers(1, 3)), b"a.>"))
        else:
            frames.append(
                Publish(
                    draw(st.integers(0, 2)),
                    tuple(draw(st.lists(runs(), max_size=4))),
                    stamp_ts_broker=draw(st.integers(0, 5)) == 0,
                    ack=draw(st.integers(0, 5)) == 0,
                )
            )
    return frames


def _expected(frames: list[Publish | Subscribe | Ping], limit: int) -> list[Received]:
    """What receive_forwarding should return, built from the frames themselves."""
    expected: list[Received] = []
    for frame in frames:
        forwardable = (
            isinstance(frame, Publish)
            and not frame.ack
            and not frame.stamp_ts_broker
            and not (limit and any(len(run.messages) > limit for run in frame.runs))
        )
        if not forwardable:
            expected.append(frame)
            continue
        assert isinstance(frame, Publish)
        runs = [_encoded(run) for run in frame.runs]
        last = expected[-1] if expected else None
        if isinstance(last, ForwardPublish) and last.stream == frame.stream:
            last.runs.extend(runs)
        else:
            expected.append(ForwardPublish(frame.stream, runs))
    return expected


def _open_machine(limit: int) -> ProtocolMachine:
    machine = ProtocolMachine(Role.SERVER, 1 << 20)
    machine.max_message_bytes = limit
    assert machine.receive_data(encode_preamble() + encode_frame(Hello())) == [Hello()]
    return machine


def _plain(frame: Received) -> object:
    """Frames compared by value (decoded runs hold views, chunks are bytes)."""
    if isinstance(frame, Publish):
        return (
            "publish",
            frame.stream,
            frame.stamp_ts_broker,
            frame.ack,
            [
                (run.key, run.ts_broker, run.count, bytes(run.sizes), bytes(run.messages))
                for run in frame.runs
            ],
        )
    return frame


@PROPERTY
@given(frames=traffic(), limit=st.sampled_from([0, 1, 40, 200]), split=st.integers(0, 2**16))
def test_forwarding_reads_what_decoding_reads(
    frames: list[Publish | Subscribe | Ping], limit: int, split: int
) -> None:
    data = b"".join(encode_frame(frame) for frame in frames)
    machine = _open_machine(limit)
    cut = split % (len(data) + 1)
    received = machine.receive_forwarding(data[:cut]) + machine.receive_forwarding(data[cut:])
    # Frames completed by different reads are not merged: compare per read.
    merged: list[Received] = []
    for frame in received:
        last = merged[-1] if merged else None
        if (
            isinstance(frame, ForwardPublish)
            and isinstance(last, ForwardPublish)
            and last.stream == frame.stream
        ):
            merged[-1] = ForwardPublish(last.stream, last.runs + frame.runs)
        else:
            merged.append(frame)
    assert [_plain(frame) for frame in merged] == [
        _plain(frame) for frame in _expected(frames, limit)
    ]


def test_frames_before_the_hello_is_admitted_are_decoded_in_full() -> None:
    machine = ProtocolMachine(Role.SERVER, 1 << 20)
    publish = Publish(1, (Run(b"k", 0, 0, b"", b""),))
    frames = machine.receive_forwarding(
        encode_preamble() + encode_frame(Hello()) + encode_frame(publish)
    )
    assert frames[0] == Hello()
    assert isinstance(frames[1], Publish)


@PROPERTY
@given(
    frame=st.builds(Publish, st.integers(0, 2**32 - 1), st.lists(runs(), max_size=4).map(tuple)),
    edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 2**16),
)
def test_on_mutated_bytes_forwarding_steps_aside_or_agrees(
    frame: Publish, edits: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(encode_frame(frame))
    for position, value in edits:
        data[4 + position % (len(data) - 4)] = value
    body = bytes(data[4 : max(5, len(data) - cut % 64)])
    header = read_runs_frame(body)
    forwarded = read_forwardable_runs(body, header[4], 0) if header is not None else None
    if forwarded is None:
        with contextlib.suppress(RemoteProtocolError):  # anything else escaping is the bug
            decode_frame(body)
        return
    decoded = decode_frame(body)
    assert isinstance(decoded, Publish)
    assert forwarded == [_encoded(run) for run in decoded.runs]


def test_a_run_over_the_message_bound_is_decoded_in_full() -> None:
    """The broker words the limit error from a decoded frame: a run whose
    messages exceed max_message_bytes in all is not forwarded as is."""
    machine = _open_machine(40)
    at_bound = Publish(1, (Run(b"k", 0, 1, _U32.pack(40), b"m" * 40),))
    over = Publish(1, (Run(b"k", 0, 1, _U32.pack(41), b"m" * 41),))
    first, second = machine.receive_forwarding(encode_frame(at_bound) + encode_frame(over))
    assert isinstance(first, ForwardPublish)
    assert first.runs == [_encoded(at_bound.runs[0])]
    assert isinstance(second, Publish)


# --- the compiled reader is the pure one's twin --------------------------------


def test_the_compiled_reader_is_built() -> None:
    """``make`` builds the C extension (a compiler is part of the setup);
    a build that silently fell back would leave the broker on the slow path."""
    if os.environ.get("BROKY_PURE") == "1":
        assert forward.IMPLEMENTATION == "pure"
        return
    assert forward.forwardable_compiled is not None, "broky.protocol._forward was not built"
    assert forward.IMPLEMENTATION == "compiled"


def _views(data: bytes) -> list[memoryview]:
    """Split size-prefixed frames as FrameReader does (data is well framed)."""
    views, position, view = [], 0, memoryview(data)
    while position + 4 <= len(data):
        (size,) = _U32.unpack_from(data, position)
        views.append(view[position + 4 : position + 4 + size])
        position += 4 + size
    return views


def _decode_or_mark(view: memoryview) -> Frame:
    try:
        return decode_frame(view)
    except RemoteProtocolError as exc:
        return Error(ErrorCode.MALFORMED_FRAME, str(exc))


@PROPERTY
@given(
    frames=traffic(),
    limit=st.sampled_from([0, 1, 40, 200]),
    edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=4),
    truncate=st.integers(0, 2**16),
    max_frame_bytes=st.sampled_from([64, 200, 1 << 20]),
)
def test_compiled_and_pure_readers_agree(
    frames: list[Publish | Subscribe | Ping],
    limit: int,
    edits: list[tuple[int, int]],
    truncate: int,
    max_frame_bytes: int,
) -> None:
    compiled = forward.forwardable_compiled
    if compiled is None:
        pytest.skip("the compiled reader is not built (BROKY_PURE=1)")
    encoded = [bytearray(encode_frame(frame)) for frame in frames]
    if encoded:
        for position, value in edits:  # corrupt frame bodies, keep the framing
            frame = encoded[position % len(encoded)]
            if len(frame) > 4:
                frame[4 + position % (len(frame) - 4)] = value
    data = b"".join(encoded)
    views = _views(data)
    assert [_plain(f) for f in compiled(views, limit, _decode_or_mark)] == [
        _plain(f) for f in forward.forwardable_pure(views, limit, _decode_or_mark)
    ]
    walk_compiled = forward.walk_compiled
    assert walk_compiled is not None
    cut = memoryview(data)[: len(data) - truncate % 300]
    fast_frames, fast_end = walk_compiled(cut, max_frame_bytes, limit, _decode_or_mark)
    pure_frames, pure_end = forward.walk_pure(cut, max_frame_bytes, limit, _decode_or_mark)
    assert fast_end == pure_end
    assert [_plain(f) for f in fast_frames] == [_plain(f) for f in pure_frames]


@PROPERTY
@given(
    chunks=st.lists(st.binary(min_size=4, max_size=64), max_size=20),
    position=st.integers(0, 2**20),
)
def test_compiled_and_pure_offsets_agree(chunks: list[bytes], position: int) -> None:
    compiled = chunk_offsets_compiled
    if compiled is None:
        assert os.environ.get("BROKY_PURE") == "1", "broky.protocol._vectors was not built"
        pytest.skip("the compiled vector builder is not in use (BROKY_PURE=1)")
    expected = chunk_offsets_pure(chunks, position)
    assert compiled(chunks, position) == expected
    assert compiled(tuple(chunks), position) == expected
