"""Whole frames through the credit gate: a part's Deliver that fits the
client's window goes on as it came, only its stream changed; one that does
not is taken apart into its runs and split where the window ends; a lost
owner's frames are dropped like its runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.durable.consumer_gate import CreditGate, WaitingFrame, waiting_frame
from broky.durable.consumer_parts import DeliveryReader
from broky.durable.owner import located_chunk
from broky.protocol.chunks import encode_run_chunk, runs_frame_parts
from broky.protocol.codec import count_located, decode_frame, encode_frame
from broky.protocol.constants import BodyType
from broky.protocol.frames import Deliver, Redelivered
from broky.protocol.located import count_located_pure
from tests.durable.test_consumer_gate import received, run_of, waiting

#: The stream the owner's frames come on (the part's), and the client's.
PART_STREAM = 77
CLIENT_STREAM = 5


def deliver_frame(partition: int, base: int, runs: int, per_run: int = 1) -> bytes:
    """A Deliver as an owner sends it: ``runs`` located runs of ``per_run``."""
    chunks = [
        located_chunk(run_of(partition, offset, per_run), partition, offset)
        for offset in range(base, base + runs * per_run, per_run)
    ]
    return b"".join(runs_frame_parts(BodyType.DELIVER, PART_STREAM, chunks))


def frame_entry(partition: int, base: int, runs: int, per_run: int = 1) -> WaitingFrame:
    entry = waiting_frame(
        memoryview(deliver_frame(partition, base, runs, per_run))[4:], CLIENT_STREAM, [], ""
    )
    assert entry is not None
    return entry


def test_a_frame_that_fits_goes_on_whole_with_the_clients_stream() -> None:
    data = deliver_frame(1, 10, 4)
    reader = DeliveryReader(CLIENT_STREAM)
    [entry] = reader.deliver(memoryview(data)[4:])
    assert isinstance(entry, WaitingFrame)
    assert (entry.count, entry.runs) == (4, 4)
    gate = CreditGate(CLIENT_STREAM, [0, 1], 1 << 20)
    gate.grant(10)
    gate.arrive(1, [entry])
    frames = gate.take()
    # Named once (the stream had heard no topic), then the owner's bytes.
    assert isinstance(decode_frame(memoryview(frames[0])[4:]), Redelivered)
    assert frames[1][:44] == data[:44]
    assert frames[1][48:] == data[48:]
    frame = decode_frame(memoryview(frames[1])[4:])
    assert isinstance(frame, Deliver)
    assert frame.stream == CLIENT_STREAM
    assert received(frames)[0] == [(1, offset) for offset in range(10, 14)]
    assert (gate.window, gate.sent, gate.waiting_messages) == (6, 4, 0)


def test_a_frame_larger_than_the_window_is_split_where_it_ends() -> None:
    reader = DeliveryReader(CLIENT_STREAM)
    reader.redelivered(Redelivered(PART_STREAM, (1,), (12,), (3,), topic="orders"))
    entries = reader.deliver(memoryview(deliver_frame(1, 10, 3, per_run=2))[4:])
    gate = CreditGate(CLIENT_STREAM, [1], 1 << 20)
    gate.grant(3)
    gate.arrive(1, entries)
    first, counts = received(gate.take())
    assert first == [(1, 10), (1, 11), (1, 12)]
    assert counts == {(1, 12): 3}  # the count goes with its message
    assert gate.waiting_messages == 3
    gate.grant(10)
    rest, counts = received(gate.take())
    assert rest == [(1, 13), (1, 14), (1, 15)]
    assert counts == {}


def test_a_frame_over_the_frame_bytes_is_sent_as_smaller_frames() -> None:
    data = deliver_frame(0, 0, 20, per_run=5)
    gate = CreditGate(CLIENT_STREAM, [0], 600)
    gate.grant(1000)
    gate.arrive(0, [frame_entry(0, 0, 20, per_run=5)])
    frames = gate.take()
    assert received(frames)[0] == [(0, offset) for offset in range(100)]
    delivers = [data for data in frames if isinstance(decode_frame(memoryview(data)[4:]), Deliver)]
    assert len(delivers) > 1
    assert all(len(frame) < len(data) for frame in delivers)


def test_runs_and_frames_keep_their_order_and_topics() -> None:
    gate = CreditGate(CLIENT_STREAM, [0, 1], 1 << 20)
    run = waiting(0, 0, 2)
    run.topic = "eu"
    gate.arrive(0, [run])
    gate.arrive(0, [frame_entry(0, 2, 3)])  # topic "": named again
    gate.arrive(1, [frame_entry(1, 0, 2)])
    gate.grant(100)
    frames = gate.take()
    topics = []
    for data in frames:
        frame = decode_frame(memoryview(data)[4:])
        if isinstance(frame, Redelivered):
            topics.append(frame.topic)
    assert topics == ["eu", ""]
    assert received(frames)[0] == [(0, n) for n in range(5)] + [(1, 0), (1, 1)]


def test_a_lost_owner_loses_its_waiting_frames() -> None:
    gate = CreditGate(CLIENT_STREAM, [0, 1], 1 << 20)
    gate.arrive(0, [frame_entry(0, 0, 2)])
    gate.arrive(1, [frame_entry(1, 0, 3), waiting(1, 3, 1)])
    gate.arrive(0, [frame_entry(0, 2, 1)])
    gate.drop(1)
    assert gate.waiting_messages == 3
    gate.grant(10)
    assert received(gate.take())[0] == [(0, 0), (0, 1), (0, 2)]


def test_a_frame_of_other_runs_is_read_run_by_run() -> None:
    """Runs that are not located chunks are not counted in place: the
    frame is decoded (the gate's run path) instead."""
    chunk = encode_run_chunk(b"k", 1, b"\x01\x00\x00\x00", b"x")
    data = b"".join(runs_frame_parts(BodyType.DELIVER, PART_STREAM, [chunk]))
    assert waiting_frame(memoryview(data)[4:], CLIENT_STREAM, [], "") is None
    assert waiting_frame(memoryview(encode_frame(Redelivered(1)))[4:], 1, [], "") is None


@pytest.mark.skipif(count_located is None, reason="the compiled chunk reader is not built")
@settings(max_examples=100, deadline=None)
@given(runs=st.integers(0, 6), per_run=st.integers(1, 4), cut=st.integers(0, 400))
def test_the_pure_count_agrees_with_the_compiled_one(runs: int, per_run: int, cut: int) -> None:
    data = bytearray(deliver_frame(2, 7, runs, per_run))
    if runs and cut < len(data) - 60:
        data[60 + cut] ^= 0xFF  # a damaged frame: both say the same
    view = memoryview(bytes(data))[4:]
    assert count_located is not None
    assert count_located_pure(view, 56, runs) == count_located(view, 56, runs)
