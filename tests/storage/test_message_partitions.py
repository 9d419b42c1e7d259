"""The partition of each message of a run: the compiled twin
(``broky.storage._partitions``) answers exactly as the pure version, on
well-formed messages and on corrupted ones (same partitions, or the same
error), and both agree with a full decode of every message."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.protocol.constants import UID_BYTES
from broky.protocol.frames import Run
from broky.protocol.message import decode_run, encode_message, pack_sizes
from broky.storage import topics
from broky.storage.topics import message_partitions_pure, partition_for

_MESSAGE = st.tuples(
    st.binary(max_size=40),
    st.one_of(st.just(b""), st.binary(min_size=1, max_size=12)),
    st.booleans(),
)


def _run_bytes(messages: list[tuple[bytes, bytes, bool]]) -> tuple[bytes, bytes]:
    encoded = [
        encode_message(payload, key_partition=partition_key, uid=b"u" * UID_BYTES if uid else b"")
        for payload, partition_key, uid in messages
    ]
    return b"".join(encoded), pack_sizes([len(message) for message in encoded])


def _answer(
    function: object, messages: bytes, sizes: bytes, partitions: int, default: int
) -> list[int] | str:
    """The partitions, or the type of the exception raised (both sides must agree)."""
    assert callable(function)
    try:
        result = function(messages, sizes, partitions, default)
    except Exception as exc:  # any error: the pair must raise the same
        return type(exc).__name__
    assert isinstance(result, list)
    return result


def test_the_compiled_twin_is_built() -> None:
    """``make`` builds it; a silent fallback would leave the slow path on."""
    if os.environ.get("BROKY_PURE") == "1":
        assert topics.message_partitions_compiled is None
        assert topics.message_partitions is message_partitions_pure
        return
    assert topics.message_partitions_compiled is not None, "broky.storage._partitions not built"


@given(
    messages=st.lists(_MESSAGE, min_size=1, max_size=12),
    partitions=st.integers(2, 1024),
    default=st.integers(0, 1023),
)
def test_each_message_goes_to_its_key_partitions_partition_or_the_default(
    messages: list[tuple[bytes, bytes, bool]], partitions: int, default: int
) -> None:
    data, sizes = _run_bytes(messages)
    expected = [
        partition_for(message.key_partition, partitions) if message.key_partition else default
        for message in decode_run(Run(b"k", 0, len(messages), sizes, data))
    ]
    assert message_partitions_pure(data, sizes, partitions, default) == expected
    assert topics.message_partitions(data, sizes, partitions, default) == expected
    assert topics.message_partitions(memoryview(data), memoryview(sizes), partitions, 0) == [
        partition if key else 0
        for partition, key in zip(expected, (m[1] for m in messages), strict=True)
    ]


@given(
    messages=st.lists(_MESSAGE, min_size=1, max_size=6),
    edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=6),
    size_edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=2),
    truncate=st.integers(0, 64),
    partitions=st.integers(2, 64),
)
def test_compiled_and_pure_agree_on_corrupted_runs(
    messages: list[tuple[bytes, bytes, bool]],
    edits: list[tuple[int, int]],
    size_edits: list[tuple[int, int]],
    truncate: int,
    partitions: int,
) -> None:
    compiled = topics.message_partitions_compiled
    if compiled is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    data, sizes = (bytearray(part) for part in _run_bytes(messages))
    for position, value in edits:
        data[position % len(data)] = value
    for position, value in size_edits:
        sizes[position % len(sizes)] = value
    cut = bytes(data[: max(len(data) - truncate, 0)])
    assert _answer(compiled, cut, bytes(sizes), partitions, 1) == _answer(
        message_partitions_pure, cut, bytes(sizes), partitions, 1
    )
