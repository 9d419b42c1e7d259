"""A PublishAck from its shape's template is byte for byte the builder's
(broky.protocol.storage_codec ``_encode_ack``), and decodes back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broky.protocol import storage_codec
from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import PublishAck

U32 = st.integers(0, 2**32 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def acks(draw: st.DrawFn) -> PublishAck:
    count = draw(st.integers(0, storage_codec.ACK_TEMPLATE_MAX_ENTRIES + 2))
    column = st.lists(U32, min_size=count, max_size=count).map(tuple)
    offsets = st.lists(I64, min_size=count, max_size=count).map(tuple)
    return PublishAck(
        stream=draw(st.one_of(st.just(0), U32)),
        sequence=draw(st.one_of(st.just(0), st.integers(0, 2**64 - 1))),
        runs=draw(column),
        partitions=draw(column),
        first_offsets=draw(offsets),
        last_offsets=draw(offsets),
    )


@given(acks())
def test_template_matches_the_builder(ack: PublishAck) -> None:
    assert storage_codec.encode_storage_frame(ack) == storage_codec._build_storage_frame(ack)


def test_a_template_ack_decodes_back() -> None:
    ack = PublishAck(7, 42, (0, 1), (3, 1), (1000, 5), (1099, 9))
    assert decode_frame(encode_frame(ack)[4:]) == ack


def test_refusals_and_uneven_columns_use_the_builder() -> None:
    refused = PublishAck(1, 1, (0,), (0,), (1,), (1,), (1,), (ErrorCode.INTERNAL,), ("full",))
    assert storage_codec._encode_ack(refused) is None
    uneven = PublishAck(1, 1, (0, 1), (0,), (1,), (1,))
    assert storage_codec._encode_ack(uneven) is None


def test_every_template_shape_matches_the_builder() -> None:
    """Each of the cached shapes once, so a template whose sentinels are not
    unique (an AssertionError at its first use) cannot hide from the sample."""
    for count in range(storage_codec.ACK_TEMPLATE_MAX_ENTRIES + 1):
        for stream in (0, 5):
            for sequence in (0, 2**64 - 1):
                ack = PublishAck(
                    stream, sequence, tuple(range(count)), tuple(range(count, 0, -1)),
                    tuple(range(-count, 0)), tuple(range(2**63 - 1 - count, 2**63 - 1)),
                )  # fmt: skip
                assert storage_codec.encode_storage_frame(ack) == (
                    storage_codec._build_storage_frame(ack)
                ), (count, stream, sequence)
