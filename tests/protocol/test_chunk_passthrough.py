"""The decoder's fast path: runs laid out as run chunks are taken as they are.

Whatever path decodes a run, it must decode the same run; a run the fast
path took carries a chunk that is exactly what ``encode_run_chunk`` makes of
it, so forwarding that chunk is forwarding the run. Malformed input still
raises our RemoteProtocolError.
"""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from broky.protocol.codec import (
    CHUNK_TABLE_OFFSET,
    _decode_run,
    decode_frame,
    encode_frame,
    encode_run_chunk,
    runs_frame_parts,
)
from broky.protocol.constants import BodyType
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Deliver, Publish, Run
from broky.protocol.message import encode_message, pack_sizes

keys = st.binary(min_size=1, max_size=40)
payload_lists = st.lists(st.binary(max_size=64), min_size=1, max_size=5)
runs_specs = st.lists(st.tuples(keys, st.integers(0, 2**62), payload_lists), min_size=1, max_size=6)


def _chunks(specs: list[tuple[bytes, int, list[bytes]]]) -> list[bytes]:
    chunks = []
    for key, ts_broker, payloads in specs:
        messages = [encode_message(payload) for payload in payloads]
        sizes = pack_sizes([len(message) for message in messages])
        chunks.append(encode_run_chunk(key, ts_broker, sizes, b"".join(messages)))
    return chunks


def _same_run(run: Run, other: Run) -> bool:
    return (run.key, run.ts_broker, run.count, bytes(run.sizes), bytes(run.messages)) == (
        other.key,
        other.ts_broker,
        other.count,
        bytes(other.sizes),
        bytes(other.messages),
    )


@given(runs_specs)
def test_runs_written_as_chunks_are_taken_as_chunks(
    specs: list[tuple[bytes, int, list[bytes]]],
) -> None:
    chunks = _chunks(specs)
    frame = b"".join(runs_frame_parts(BodyType.PUBLISH, 7, chunks))
    decoded = decode_frame(memoryview(frame)[4:])
    assert isinstance(decoded, Publish)
    assert [run.chunk for run in decoded.runs] == chunks
    for run, chunk in zip(decoded.runs, chunks, strict=True):
        assert _same_run(run, _decode_run(chunk, CHUNK_TABLE_OFFSET))


@given(runs_specs)
def test_other_layouts_decode_to_the_same_runs(
    specs: list[tuple[bytes, int, list[bytes]]],
) -> None:
    # The official FlatBuffers builder (encode_frame of a Deliver whose runs
    # carry offsets goes through the durable layout) and the chunk layout
    # must agree on every field.
    chunks = _chunks(specs)
    fast = decode_frame(memoryview(b"".join(runs_frame_parts(BodyType.DELIVER, 3, chunks)))[4:])
    assert isinstance(fast, Deliver)
    durable = [
        Run(run.key, run.ts_broker, run.count, run.sizes, run.messages, 2, 10 * index)
        for index, run in enumerate(fast.runs)
    ]
    slow = decode_frame(memoryview(encode_frame(Deliver(3, tuple(durable))))[4:])
    assert isinstance(slow, Deliver)
    assert all(run.chunk is None for run in slow.runs)  # not the chunk layout
    for run, other in zip(fast.runs, slow.runs, strict=True):
        assert _same_run(run, other)


@given(runs_specs, st.data())
def test_a_mutated_frame_decodes_consistently_or_raises(
    specs: list[tuple[bytes, int, list[bytes]]], data: st.DataObject
) -> None:
    frame = bytearray(b"".join(runs_frame_parts(BodyType.PUBLISH, 1, _chunks(specs))))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(4, len(frame) - 1))
        frame[position] = data.draw(st.integers(0, 255))
    try:
        decoded = decode_frame(memoryview(bytes(frame))[4:])
    except RemoteProtocolError:
        return
    for run in getattr(decoded, "runs", ()):
        if run.chunk is not None:
            # A chunk taken by the fast path is a valid chunk of this very run.
            assert _same_run(run, _decode_run(run.chunk, CHUNK_TABLE_OFFSET))
            assert struct.unpack_from("<q", run.chunk, 16)[0] == run.ts_broker
