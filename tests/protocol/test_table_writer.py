"""The control frames written front to back (broky.protocol.table_writer).

What flatc's generated code reads of them is ``test_flatbuffers_compat.py``'s;
here: any values read back as the frame written, every field and vector
element aligned to its size from the frame's first byte, and shapes cached
per field presence do not bleed into each other.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.constants import SettleKind
from broky.protocol.frames import Flow, Frame, Ping, Pong, Redelivered, Settle, Settled, Subscribed
from broky.protocol.table_writer import control_frame
from broky.protocol.tables import table_fields

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=12)


@st.composite
def settles(draw: st.DrawFn) -> Settle:
    count = draw(st.integers(0, 6))
    firsts = draw(st.lists(st.integers(0, 2**62), min_size=count, max_size=count))
    return Settle(
        draw(U32),
        sequence=draw(st.sampled_from([0, 1, 2**64 - 1]) | U64),
        kind=draw(st.sampled_from(SettleKind)),
        partitions=tuple(draw(st.lists(U32, min_size=count, max_size=count))),
        first_offsets=tuple(firsts),
        last_offsets=tuple(first + draw(st.integers(0, 2**62 - 1)) for first in firsts),
        delay_ms=draw(st.sampled_from([-1, 0]) | I64),
        reason=draw(TEXT),
        topic=draw(TEXT),
    )


@st.composite
def redelivereds(draw: st.DrawFn) -> Redelivered:
    count = draw(st.integers(0, 6))
    return Redelivered(
        draw(U32),
        partitions=tuple(draw(st.lists(U32, min_size=count, max_size=count))),
        offsets=tuple(draw(st.lists(I64, min_size=count, max_size=count))),
        counts=tuple(draw(st.lists(U32, min_size=count, max_size=count))),
        topic=draw(TEXT),
    )


FRAMES = st.one_of(
    settles(),
    redelivereds(),
    st.builds(Settled, U32, U64, U32, U32),
    st.builds(Flow, U32, U32),
    st.builds(Subscribed, U32),
    st.builds(Ping, U64),
    st.builds(Pong, U64),
)


def _check_alignment(data: bytes) -> None:
    """Every present field of the body table, and every vector's elements,
    aligned to their size counted from the frame's first byte."""
    view = memoryview(data)[4:]
    root = struct.unpack_from("<I", view, 0)[0]
    frame_type, body_field = table_fields(view, root, 2)
    assert frame_type
    assert body_field
    body = body_field + struct.unpack_from("<I", view, body_field)[0]
    assert (body + 4) % 4 == 0  # the soffset
    for field in table_fields(view, body, 16):
        if field:
            # The widest field is 8 bytes; each lies at a multiple of its size
            # or is a 4-byte offset: in every case 4-aligned at least.
            assert (field + 4) % 4 == 0


@settings(max_examples=400, deadline=None)
@given(frame=FRAMES)
def test_written_frames_read_back_as_written(frame: Frame) -> None:
    data = encode_frame(frame)
    assert struct.unpack_from("<I", data)[0] == len(data) - 4
    assert decode_frame(memoryview(data)[4:]) == frame
    _check_alignment(data)


@settings(max_examples=200, deadline=None)
@given(frames=st.lists(FRAMES, min_size=2, max_size=8))
def test_shapes_met_in_any_order_write_the_same_bytes(frames: list[Frame]) -> None:
    """A frame's bytes do not depend on the shapes written before it."""
    first = [encode_frame(frame) for frame in frames]
    again = [encode_frame(frame) for frame in reversed(frames)]
    assert first == list(reversed(again))


@given(
    count=st.integers(0, 9),
    wide=st.booleans(),
    text=st.binary(max_size=9).filter(lambda raw: b"\0" not in raw),
)
def test_vector_elements_and_scalars_are_aligned_to_their_size(
    count: int, wide: bool, text: bytes
) -> None:
    """Eight-byte scalars and elements start at multiples of 8, four-byte
    ones at multiples of 4, from the frame's first byte, however the
    blocks before them end (a string of any length, a vector of any count)."""
    code = "q" if wide else "I"
    data = control_frame(
        22,
        [(0, "B", 1, 0), (1, "Q", 5, 0), (2, "I", 7, 0)],
        [(3, "s", text), (4, code, list(range(count))), (5, "q", [9])],
    )
    view = memoryview(data)[4:]
    root = struct.unpack_from("<I", view, 0)[0]
    _, body_field = table_fields(view, root, 2)
    body = body_field + struct.unpack_from("<I", view, body_field)[0]
    fields = table_fields(view, body, 6)
    assert (fields[1] + 4) % 8 == 0
    assert (fields[2] + 4) % 4 == 0
    for slot, size in ((3, 1), (4, 8 if wide else 4), (5, 8)):
        start = fields[slot] + struct.unpack_from("<I", view, fields[slot])[0]
        assert (start + 4) % 4 == 0  # the length
        assert (start + 4 + 4) % size == 0  # the first element
    string = fields[3] + struct.unpack_from("<I", view, fields[3])[0]
    assert bytes(view[string + 4 : string + 4 + len(text) + 1]) == text + b"\0"


def test_scalars_at_their_default_are_left_out() -> None:
    """As the builder leaves them out: a Settle with every scalar at its
    default has no scalar field in its table, only its vectors."""
    data = encode_frame(Settle(0))
    view = memoryview(data)[4:]
    root = struct.unpack_from("<I", view, 0)[0]
    _, body_field = table_fields(view, root, 2)
    body = body_field + struct.unpack_from("<I", view, body_field)[0]
    present = [slot for slot, field in enumerate(table_fields(view, body, 9)) if field]
    assert present == [3, 4, 5]
