"""Publish frames read for forwarding agree with decoding them in full.

A broker's ProtocolMachine hands over unacked, unstamped Publish frames laid
out as our encoder lays them out as ForwardPublish (runs kept as chunks,
consecutive frames of one stream merged, consecutive runs of one key and
ts_broker coalesced). These properties hold that path to the generic
decoder: same messages, same order, chunks byte-identical to encoding the
(coalesced) runs; frames that do not qualify come out decoded; on mutated
bytes the fast reader either steps aside or agrees; and the compiled reader
is the pure one's twin.
"""

from __future__ import annotations

import contextlib
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol import codec, forward
from broky.protocol.chunk_reading import (
    RUNS_FRAME_RUNS_AT,
    read_chunk_run,
    read_forwardable,
    read_runs_frame,
)
from broky.protocol.chunks import CHUNK_TABLE_OFFSET, chunk_offsets_compiled, chunk_offsets_pure
from broky.protocol.codec import decode_frame, encode_frame, encode_run_chunk
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.forward import MAX_COALESCED_BYTES, MAX_COALESCED_MESSAGES
from broky.protocol.frames import (
    Deliver,
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
    Subscribed,
    Welcome,
)
from broky.protocol.framing import encode_preamble
from broky.protocol.located import read_chunk_runs_pure
from broky.protocol.message import pack_sizes

PROPERTY = settings(max_examples=300, deadline=None)
_U32 = struct.Struct("<I")


@st.composite
def runs(draw: st.DrawFn) -> Run:
    """A run of 0-4 opaque message blobs; keys and timestamps often repeat,
    so that consecutive runs coalesce."""
    blobs = draw(st.lists(st.binary(max_size=40), max_size=4))
    key = draw(st.sampled_from([b"k", b"j"]) | st.binary(min_size=1, max_size=24))
    ts = draw(st.sampled_from([0, 7]) | st.integers(-(2**63), 2**63 - 1))
    return Run(key, ts, len(blobs), pack_sizes([len(blob) for blob in blobs]), b"".join(blobs))


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


def _encoded(run: Run) -> EncodedRun:
    return EncodedRun(
        run.key, run.count, encode_run_chunk(run.key, run.ts_broker, run.sizes, run.messages)
    )


def _coalesced(runs: list[Run]) -> list[EncodedRun]:
    """The rule of forward.walk, from decoded runs: consecutive runs of one
    key and ts_broker as one, within the coalescing bounds."""
    groups: list[list[Run]] = []
    for run in runs:
        group = groups[-1] if groups else None
        if (
            group is not None
            and run.key == group[0].key
            and run.ts_broker == group[0].ts_broker
            and sum(len(r.messages) for r in group) + len(run.messages) <= MAX_COALESCED_BYTES
            and sum(r.count for r in group) + run.count <= MAX_COALESCED_MESSAGES
            and len(group) < MAX_COALESCED_MESSAGES
        ):
            group.append(run)
        else:
            groups.append([run])
    return [
        _encoded(group[0])
        if len(group) == 1
        else _encoded(
            Run(
                group[0].key,
                group[0].ts_broker,
                sum(r.count for r in group),
                b"".join(bytes(r.sizes) for r in group),
                b"".join(bytes(r.messages) for r in group),
            )
        )
        for group in groups
    ]


def _expected(frames: list[Publish | Subscribe | Ping], limit: int) -> list[Received]:
    """What one receive_forwarding of all the frames should return."""
    expected: list[Received | list[Run]] = []
    streams: list[int] = []
    for frame in frames:
        forwardable = (
            isinstance(frame, Publish)
            and not frame.ack
            and not frame.stamp_ts_broker
            and not (limit and any(len(run.messages) > limit for run in frame.runs))
        )
        if not forwardable:
            expected.append(frame)
            streams.append(-1)
            continue
        assert isinstance(frame, Publish)
        last = expected[-1] if expected else None
        if isinstance(last, list) and streams[-1] == frame.stream:
            last.extend(frame.runs)
        else:
            expected.append(list(frame.runs))
            streams.append(frame.stream)
    return [
        ForwardPublish(stream, _coalesced(item)) if isinstance(item, list) else item
        for item, stream in zip(expected, streams, strict=True)
    ]


def _open_machine(limit: int) -> ProtocolMachine:
    machine = ProtocolMachine(Role.SERVER, 1 << 20)
    machine.max_message_bytes = limit
    assert machine.receive_data(encode_preamble() + encode_frame(Hello())) == [Hello()]
    return machine


def _run_value(run: Run | None) -> object:
    """A run compared by value, its chunk and offsets included (None stays None)."""
    if run is None:
        return None
    chunk = None if run.chunk is None else bytes(run.chunk)
    return (
        run.key,
        run.ts_broker,
        run.count,
        bytes(run.sizes),
        bytes(run.messages),
        run.partition,
        run.base_offset,
        chunk,
    )


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


def _messages(frames: list[Received]) -> list[object]:
    """Frames as the messages they carry: forwarded ones message by message
    (run boundaries are not part of what is published), adjacent forwarded
    frames of one stream as one."""
    out: list[object] = []
    for frame in frames:
        if not isinstance(frame, ForwardPublish):
            out.append(_plain(frame))
            continue
        messages = []
        for encoded in frame.runs:
            run = read_chunk_run(memoryview(encoded.chunk), CHUNK_TABLE_OFFSET)
            assert run is not None
            assert (run.count, run.key) == (encoded.count, encoded.key)
            sizes = struct.unpack(f"<{run.count}I", run.sizes)
            at = 0
            for size in sizes:
                messages.append((run.key, run.ts_broker, bytes(run.messages[at : at + size])))
                at += size
        last = out[-1] if out else None
        if isinstance(last, tuple) and last[:2] == ("forward", frame.stream):
            last[2].extend(messages)
        else:
            out.append(("forward", frame.stream, messages))
    return out


@PROPERTY
@given(frames=traffic(), limit=st.sampled_from([0, 1, 40, 200]))
def test_forwarding_reads_what_decoding_reads(
    frames: list[Publish | Subscribe | Ping], limit: int
) -> None:
    data = b"".join(encode_frame(frame) for frame in frames)
    received = _open_machine(limit).receive_forwarding(data)
    assert [_plain(frame) for frame in received] == [
        _plain(frame) for frame in _expected(frames, limit)
    ]


@PROPERTY
@given(frames=traffic(), limit=st.sampled_from([0, 40]), split=st.integers(0, 2**16))
def test_frames_split_across_reads_carry_the_same_messages(
    frames: list[Publish | Subscribe | Ping], limit: int, split: int
) -> None:
    data = b"".join(encode_frame(frame) for frame in frames)
    machine = _open_machine(limit)
    cut = split % (len(data) + 1)
    received = machine.receive_forwarding(data[:cut]) + machine.receive_forwarding(data[cut:])
    assert _messages(received) == _messages(_expected(frames, limit))


def test_frames_before_the_hello_is_admitted_are_decoded_in_full() -> None:
    machine = ProtocolMachine(Role.SERVER, 1 << 20)
    publish = Publish(1, (Run(b"k", 0, 0, b"", b""),))
    frames = machine.receive_forwarding(
        encode_preamble() + encode_frame(Hello()) + encode_frame(publish)
    )
    assert frames[0] == Hello()
    assert isinstance(frames[1], Publish)


def test_one_message_frames_of_one_key_coalesce_into_one_run() -> None:
    messages = [bytes([n]) * (n + 1) for n in range(50)]
    frames = [Publish(3, (Run(b"k", 0, 1, _U32.pack(len(m)), m),)) for m in messages]
    (received,) = _open_machine(0).receive_forwarding(b"".join(map(encode_frame, frames)))
    assert isinstance(received, ForwardPublish)
    sizes = b"".join(_U32.pack(len(m)) for m in messages)
    assert received.runs == [_encoded(Run(b"k", 0, 50, sizes, b"".join(messages)))]


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
    body = memoryview(bytes(data[4 : max(5, len(data) - cut % 64)]))
    header = read_runs_frame(body)
    forwarded = read_forwardable(body, header[4], 0) if header is not None else None
    if forwarded is None:
        with contextlib.suppress(RemoteProtocolError):  # anything else escaping is the bug
            decode_frame(body)
        return
    decoded = decode_frame(body)
    assert isinstance(decoded, Publish)
    assert [(k, ts, n, bytes(s), bytes(m)) for k, ts, n, s, m, _ in forwarded] == [
        (r.key, r.ts_broker, r.count, bytes(r.sizes), bytes(r.messages)) for r in decoded.runs
    ]
    for parts, run in zip(forwarded, decoded.runs, strict=True):
        assert bytes(parts[5]) == _encoded(run).chunk


# --- the compiled readers are the pure ones' twins -----------------------------


def test_the_compiled_readers_are_built() -> None:
    """``make`` builds the C extensions (a compiler is part of the setup); a
    build that silently fell back would leave the broker on the slow path."""
    if os.environ.get("BROKY_PURE") == "1":
        assert forward.IMPLEMENTATION == "pure"
        assert chunk_offsets_compiled is None
        assert codec.read_chunk_runs_compiled is None
        return
    assert forward.walk_compiled is not None, "broky.protocol._forward was not built"
    assert codec.read_chunk_runs_compiled is not None
    assert chunk_offsets_compiled is not None, "broky.protocol._vectors was not built"
    assert forward.IMPLEMENTATION == "compiled"


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
def test_compiled_and_pure_walks_agree(
    frames: list[Publish | Subscribe | Ping],
    limit: int,
    edits: list[tuple[int, int]],
    truncate: int,
    max_frame_bytes: int,
) -> None:
    compiled = forward.walk_compiled
    if compiled is None:
        pytest.skip("the compiled reader is not in use (BROKY_PURE=1)")
    encoded = [bytearray(encode_frame(frame)) for frame in frames]
    if encoded:
        for position, value in edits:  # corrupt frame bodies, keep the framing
            frame = encoded[position % len(encoded)]
            if len(frame) > 4:
                frame[4 + position % (len(frame) - 4)] = value
    data = b"".join(encoded)
    cut = memoryview(data)[: len(data) - truncate % 300]
    fast_frames, fast_end = compiled(cut, max_frame_bytes, limit, _decode_or_mark)
    pure_frames, pure_end = forward.walk_pure(cut, max_frame_bytes, limit, _decode_or_mark)
    assert fast_end == pure_end
    assert [_plain(f) for f in fast_frames] == [_plain(f) for f in pure_frames]


def test_compiled_and_pure_walks_agree_at_the_coalescing_bounds() -> None:
    compiled = forward.walk_compiled
    if compiled is None:
        pytest.skip("the compiled reader is not in use (BROKY_PURE=1)")
    big = b"b" * 1000
    cases = [
        [Run(b"k", 0, 1, _U32.pack(len(big)), big)] * 70,  # over MAX_COALESCED_BYTES
        [Run(b"k", 0, 1, _U32.pack(0), b"")] * 5000,  # over MAX_COALESCED_MESSAGES
        [Run(b"k", 0, 0, b"", b"")] * 5000,  # runs of no messages
    ]
    for case in cases:
        data = b"".join(encode_frame(Publish(1, (run,))) for run in case)
        fast = compiled(memoryview(data), 1 << 20, 0, decode_frame)
        pure = forward.walk_pure(memoryview(data), 1 << 20, 0, decode_frame)
        assert fast == pure
        (frame,), _ = pure
        assert isinstance(frame, ForwardPublish)
        assert frame.runs == _coalesced(case)


@PROPERTY
@given(
    chunks=st.lists(st.binary(min_size=4, max_size=64), max_size=20),
    position=st.integers(0, 2**20),
)
def test_compiled_and_pure_offsets_agree(chunks: list[bytes], position: int) -> None:
    compiled = chunk_offsets_compiled
    if compiled is None:
        pytest.skip("the compiled vector builder is not in use (BROKY_PURE=1)")
    expected = chunk_offsets_pure(chunks, position)
    assert compiled(chunks, position) == expected
    assert compiled(tuple(chunks), position) == expected


@PROPERTY
@given(
    frames=traffic(),
    edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=4),
)
def test_compiled_and_pure_chunk_runs_agree(
    frames: list[Publish | Subscribe | Ping], edits: list[tuple[int, int]]
) -> None:
    """The chunk reader behind every decoded runs frame: the same runs (or
    None for a run not laid out as a chunk), whatever bytes it is given."""
    compiled = codec.read_chunk_runs_compiled
    if compiled is None:
        pytest.skip("the compiled reader is not in use (BROKY_PURE=1)")
    for frame in frames:
        if not isinstance(frame, Publish) or not frame.runs:
            continue
        data = bytearray(encode_frame(frame))
        for position, value in edits:  # corrupt the runs, keep the runs vector
            at = RUNS_FRAME_RUNS_AT + 4 + 4 * len(frame.runs) + position
            if at < len(data):
                data[at] = value
        view = memoryview(bytes(data))[4:]
        count = len(frame.runs)
        fast = compiled(view, RUNS_FRAME_RUNS_AT, count)
        pure = read_chunk_runs_pure(view, RUNS_FRAME_RUNS_AT, count)
        assert [_run_value(run) for run in fast] == [_run_value(run) for run in pure]
        if not edits:
            assert None not in pure


# --- a router's link reads Deliver frames the same way ------------------------


@st.composite
def deliveries(draw: st.DrawFn) -> list[Deliver | Ping | Subscribed]:
    """What a router's link receives: Deliver frames between control frames."""
    frames: list[Deliver | Ping | Subscribed] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.integers(0, 5))
        if kind == 0:
            frames.append(Ping(draw(st.integers(0, 2**64 - 1))))
        elif kind == 1:
            frames.append(Subscribed(draw(st.integers(1, 3))))
        else:
            frames.append(
                Deliver(draw(st.integers(0, 2)), tuple(draw(st.lists(runs(), max_size=4))))
            )
    return frames


@PROPERTY
@given(frames=deliveries())
def test_a_link_reads_deliver_frames_as_forwardable_runs(
    frames: list[Deliver | Ping | Subscribed],
) -> None:
    machine = ProtocolMachine(Role.CLIENT, 1 << 20)
    assert machine.receive_data(encode_preamble() + encode_frame(Welcome())) == [Welcome()]
    received = machine.receive_forwarding(b"".join(map(encode_frame, frames)))
    as_publish = [
        Publish(frame.stream, frame.runs) if isinstance(frame, Deliver) else frame
        for frame in frames
    ]
    assert [_plain(frame) for frame in received] == [
        _plain(frame)
        for frame in _expected(as_publish, 0)  # type: ignore[arg-type]
    ]
    compiled = forward.walk_compiled
    if compiled is not None:
        data = memoryview(b"".join(map(encode_frame, frames)))
        fast = compiled(data, 1 << 20, 0, _decode_or_mark, deliveries=True)
        pure = forward.walk_pure(data, 1 << 20, 0, _decode_or_mark, deliveries=True)
        assert (fast[1], [_plain(f) for f in fast[0]]) == (pure[1], [_plain(f) for f in pure[0]])
