"""The client's fast run decoder against the reference one.

``decode_delivered_run`` must give exactly what ``decode_run`` gives, for
every run: messages with all optional fields or none, of one size or many,
ephemeral or durable, and for malformed bytes it must raise
RemoteProtocolError exactly when ``decode_run`` does.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broky.client.decoding import (
    _uniform_compiled,
    decode_delivered_run,
    uniform_messages,
    uniform_messages_pure,
)
from broky.protocol.constants import UID_BYTES
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Run
from broky.protocol.message import Message, decode_run, encode_message, pack_sizes

PROPERTY = settings(max_examples=400, deadline=None)

int64s = st.integers(-(2**63), 2**63 - 1)
texts = st.text(max_size=12)
#: Encoded messages: often payload-only (the fast layout), sometimes with any
#: optional field, payload lengths drawn from a few values so that runs of
#: one size are common.
payloads = st.one_of(st.sampled_from([b"", b"x" * 3, b"y" * 100]), st.binary(max_size=120))
full_messages = st.builds(
    encode_message,
    payloads,
    key_partition=st.one_of(st.just(b""), st.binary(max_size=16)),
    ts_producer=int64s,
    uid=st.one_of(st.just(b""), st.binary(min_size=UID_BYTES, max_size=UID_BYTES)),
    tags=st.lists(st.tuples(texts, texts), max_size=3),
)
plain_messages = st.builds(encode_message, payloads, ts_producer=int64s)
encoded = st.one_of(plain_messages, full_messages)


def _run(blobs: list[bytes], key: bytes, ts_broker: int, base_offset: int) -> Run:
    return Run(
        key=key,
        ts_broker=ts_broker,
        count=len(blobs),
        sizes=memoryview(pack_sizes([len(blob) for blob in blobs])),
        messages=memoryview(b"".join(blobs)),
        partition=3,
        base_offset=base_offset,
    )


@st.composite
def runs(draw: st.DrawFn) -> Run:
    """Runs of equal messages (the bulk path), of plain messages of varied
    sizes, and of any messages at all."""
    shape = draw(st.sampled_from(["uniform", "plain", "any"]))
    if shape == "uniform":
        blob = draw(plain_messages)
        blobs = [blob] * draw(st.integers(1, 50))
    else:
        blobs = draw(st.lists(plain_messages if shape == "plain" else encoded, max_size=20))
    key = draw(st.binary(min_size=1, max_size=20))  # invalid UTF-8 too
    base_offset = draw(st.one_of(st.just(-1), st.integers(0, 2**40)))
    return _run(blobs, key, draw(int64s), base_offset)


def _decoded(decode: object, run: Run) -> list[Message] | str:
    """What ``decode(run)`` returns, or "malformed" when it raises so."""
    assert callable(decode)
    try:
        result = decode(run)
    except RemoteProtocolError:
        return "malformed"
    assert isinstance(result, list)
    return result


@PROPERTY
@given(runs())
def test_same_messages_as_decode_run(run: Run) -> None:
    decoded = decode_delivered_run(run)
    assert decoded == decode_run(run)
    assert all(type(message) is Message for message in decoded)


@PROPERTY
@given(runs(), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4))
@example(  # a payload length past the end of a run of equal messages
    _run([encode_message(b"ab")] * 3, b"k", 0, -1), [(48, 200), (48 + 56, 200)]
)
def test_corrupted_runs_decode_or_fail_alike(run: Run, flips: list[tuple[int, int]]) -> None:
    data = bytearray(run.messages)
    for position, value in flips:
        if data:
            data[position % len(data)] = value
    corrupted = Run(
        run.key, run.ts_broker, run.count, run.sizes, memoryview(bytes(data)), 3, run.base_offset
    )
    assert _decoded(decode_delivered_run, corrupted) == _decoded(decode_run, corrupted)


def test_a_durable_run_numbers_its_messages() -> None:
    run = _run([encode_message(b"p", ts_producer=n) for n in range(3)], b"k", 9, 40)
    assert decode_delivered_run(run) == [
        Message("k", b"p", ts_producer=n, ts_broker=9, partition=3, offset=40 + n) for n in range(3)
    ]


@pytest.mark.parametrize("count", [0, 1])
def test_empty_and_single_runs(count: int) -> None:
    run = _run([encode_message(b"")] * count, b"k", 0, -1)
    assert decode_delivered_run(run) == [Message("k", b"")] * count


def _uniform_run(blob: bytes, count: int, key: bytes, ts_broker: int, base_offset: int) -> Run:
    return _run([blob] * count, key, ts_broker, base_offset)


@pytest.mark.skipif(_uniform_compiled is None, reason="the compiled cutter is not built")
@PROPERTY
@given(
    plain_messages,
    st.integers(1, 40),
    st.integers(-1, 2**40),
    int64s,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
)
def test_compiled_cutter_gives_what_the_pure_one_gives(
    blob: bytes, count: int, base_offset: int, ts_broker: int, flips: list[tuple[int, int]]
) -> None:
    """Both cutters agree on every run of equal messages, intact or with
    bytes flipped (a flipped fixed byte must make both answer None)."""
    data = bytearray(blob * count)
    for position, value in flips:
        data[position % len(data)] = value
    run = _uniform_run(blob, count, b"k", ts_broker, base_offset)
    run = Run(run.key, run.ts_broker, count, run.sizes, memoryview(bytes(data)), 3, base_offset)
    compiled = uniform_messages(run, "k", len(blob))
    assert compiled == uniform_messages_pure(run, "k", len(blob))
    if compiled is not None:
        assert all(type(message) is Message for message in compiled)


@pytest.mark.skipif(_uniform_compiled is None, reason="the compiled cutter is not built")
def test_compiled_cutter_refuses_a_run_whose_bytes_do_not_match_its_count() -> None:
    blob = encode_message(b"abc", ts_producer=1)
    run = _uniform_run(blob, 3, b"k", 0, -1)
    short = Run(run.key, 0, 3, run.sizes, run.messages[: len(blob) * 2], 3, -1)
    assert uniform_messages(short, "k", len(blob)) is None
