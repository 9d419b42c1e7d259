"""``encode_message``'s fast paths (no optional field; a key_partition
alone) lay a message out byte for byte as the general, field-by-field
encoder does, and it decodes back to what was encoded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broky.protocol.message import (
    Message,
    decode_message,
    encode_message,
    encode_message_fields,
    pack_sizes,
)


@given(
    payload=st.binary(max_size=70),
    key_partition=st.binary(max_size=40),
    ts_producer=st.integers(-(2**63), 2**63 - 1),
)
def test_fast_paths_lay_messages_out_as_the_general_encoder(
    payload: bytes, key_partition: bytes, ts_producer: int
) -> None:
    data = encode_message(payload, key_partition, ts_producer)
    assert data == encode_message_fields(payload, key_partition, ts_producer)
    assert len(data) % 8 == 0
    assert decode_message(memoryview(data), "k", 5) == Message(
        "k", payload, key_partition, ts_producer, 5
    )


@given(sizes=st.lists(st.integers(0, 2**32 - 1), max_size=5))
def test_pack_sizes_is_the_little_endian_size_table(sizes: list[int]) -> None:
    assert pack_sizes(sizes) == b"".join(size.to_bytes(4, "little") for size in sizes)
