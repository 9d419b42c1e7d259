"""Small control frames laid out front to back, without ``flatbuffers.Builder``.

Why: the Python builder makes ~250 function calls for a two-field ``Flow``:
on the 2-core benchmark machine 43 us a Flow, 32 us a ``Settled``, 80 us a
``Redelivered`` and ~100 us a ``Settle``. Those are the control frames of a
consumer's steady state (a grant per half window, a settle per ack batch, a
receipt per flush), and a spread consumer's worker re-encodes each one it
relays between the client and the other owners (broky.durable.consumer_relays):
~10 % of such a worker's GIL-held time went to the builder. Writing the
same table directly is a handful of ``struct`` calls.

The layout is FlatBuffers, though not the builder's (which writes back to
front): after the size prefix and the root offset come the ``Frame`` table's
vtable and table, then the body's vtable and table, then the body's vectors
and strings, every offset pointing forward; a vtable precedes its table (the
table's signed offset to it is positive). Scalars are aligned to their size
and vector elements to theirs, counted from the frame's first byte (its
size prefix), as flatc's verifier checks size-prefixed buffers. Scalars equal
to their schema default are left out, as the builder leaves them out.
``tests/protocol/test_flatbuffers_compat.py`` reads what is written here
through flatc's generated code; ``tests/protocol/test_table_writer.py``
reads any values back through Broky's decoder and checks the alignment.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

#: A scalar field: (slot, struct code, value, schema default).
Scalar = tuple[int, str, int, int]
#: A vector or string field: (slot, element struct code or ``"s"`` for a
#: string, the integers of a vector or the bytes of a string).
Block = tuple[int, str, "Sequence[int] | bytes"]

_HEAD = struct.Struct("<II")
#: The ``Frame`` table's vtable (4 u16: its size, the table's size, the
#: body type's and the body's positions in the table), then the table
#: (its soffset to the vtable, the body type, padding, the body's uoffset).
_ROOT = struct.Struct("<HHHHiB3xI")
#: Where the root vtable and table begin, and where the body's vtable does.
_ROOT_VTABLE_AT: Final = _HEAD.size
_ROOT_TABLE_AT: Final = _ROOT_VTABLE_AT + 8
_BODY_VTABLE_AT: Final = _ROOT_TABLE_AT + 12
_U32 = struct.Struct("<I")
_SIZES: Final = {"B": 1, "H": 2, "I": 4, "i": 4, "Q": 8, "q": 8, "s": 1}


class _Shape:
    """The frame up to the end of its body table for one shape (body type,
    which scalars are present, which blocks): its fixed bytes (root offset,
    vtables, the table's soffset) and how to pack the table's values
    (scalars, then the blocks' offsets) in one ``pack``."""

    __slots__ = ("block_fields", "head", "order", "table_end", "values")

    def __init__(
        self, body_type: int, scalars: tuple[tuple[int, str], ...], blocks: tuple[int, ...]
    ) -> None:
        # Widest first, so each lands aligned after the table's 4-byte soffset.
        fields = sorted(
            [(_SIZES[code], slot, code, -1) for slot, code in scalars]
            + [(4, slot, "I", index) for index, slot in enumerate(blocks)],
            key=lambda field: -field[0],
        )
        slots = 1 + max((field[1] for field in fields), default=-1)
        vtable_size = 4 + 2 * slots
        # The table starts 4 bytes before an 8-byte boundary: its first
        # (widest) field after the soffset is then 8-aligned.
        table_at = _BODY_VTABLE_AT + vtable_size
        table_at += (4 - table_at) % 8
        positions = [0] * slots
        layout = "<"
        at = table_at + 4
        #: For each block, in ``blocks`` order: where its uoffset lies.
        block_fields = [0] * len(blocks)
        #: Per table value, in layout order: the scalar's index in
        #: ``scalars`` or ``-1 - block`` for a block's offset.
        order: list[int] = []
        for size, slot, code, block in fields:
            padding = (-at) % size
            layout += "x" * padding
            at += padding
            positions[slot] = at - table_at
            layout += code
            if block >= 0:
                block_fields[block] = at
                order.append(-1 - block)
            else:
                order.append([s for s, _ in scalars].index(slot))
            at += size
        head = bytearray(at)
        _ROOT.pack_into(
            head,
            _ROOT_VTABLE_AT,
            8,
            12,
            4,
            8,
            _ROOT_TABLE_AT - _ROOT_VTABLE_AT,
            body_type,
            table_at - (_ROOT_TABLE_AT + 8),
        )
        struct.pack_into(
            f"<HH{slots}H", head, _BODY_VTABLE_AT, vtable_size, at - table_at, *positions
        )
        struct.pack_into("<i", head, table_at, table_at - _BODY_VTABLE_AT)
        _U32.pack_into(head, 4, _ROOT_TABLE_AT - 4)
        #: The bytes after the size prefix up to the table's values.
        self.head = bytes(head[4 : table_at + 4])
        self.table_end = at
        self.block_fields = block_fields
        self.values = struct.Struct(layout)
        self.order = order


_shapes: dict[tuple[int, tuple[tuple[int, str], ...], tuple[int, ...]], _Shape] = {}


def control_frame(body_type: int, scalars: Sequence[Scalar], blocks: Sequence[Block]) -> bytes:
    """A size-prefixed ``Frame`` whose body (of ``body_type``) has the given
    fields; a scalar equal to its default is left out. Raises
    ``struct.error`` for a value out of its type's range."""
    present = [(slot, code, value) for slot, code, value, default in scalars if value != default]
    key = (
        body_type,
        tuple((slot, code) for slot, code, _ in present),
        tuple(slot for slot, _, _ in blocks),
    )
    shape = _shapes.get(key)
    if shape is None:
        shape = _shapes[key] = _Shape(*key)
    # The blocks after the table: each one's elements aligned to their size.
    blocks_parts: list[bytes] = []
    at = shape.table_end
    starts: list[int] = []
    for _, code, items in blocks:
        padding = (-at) % 4
        padding += (-(at + padding + 4)) % _SIZES[code]
        if padding:
            blocks_parts.append(bytes(padding))
            at += padding
        starts.append(at)
        if code == "s":
            assert isinstance(items, bytes)
            data = _U32.pack(len(items)) + items + b"\0"
        else:
            data = _U32.pack(len(items)) + struct.pack(f"<{len(items)}{code}", *items)
        blocks_parts.append(data)
        at += len(data)
    fields = shape.block_fields
    values = shape.values.pack(
        *[
            present[index][2] if index >= 0 else starts[-1 - index] - fields[-1 - index]
            for index in shape.order
        ]
    )
    # One join: the size prefix, the fixed head, the table's values, the blocks.
    return b"".join((_U32.pack(at - 4), shape.head, values, *blocks_parts))
