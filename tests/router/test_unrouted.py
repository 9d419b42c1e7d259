"""Counting unrouted stored runs: the compiled loop is the pure one's twin."""

from __future__ import annotations

import os
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.chunks import durable_chunk, durable_chunk_sizes, encode_run_chunk
from broky.protocol.frames import Run
from broky.router import fanout, unrouted

KEYS = [b"a", b"bb", b"ccc.d", b"e" * 13]


@st.composite
def runs(draw: st.DrawFn) -> Run:
    """A run with or without the chunk it arrived in (pieces of a split run
    have none), of any key length and message sizes, so every padding case
    of the durable layout is measured."""
    key = draw(st.sampled_from(KEYS))
    payloads = draw(st.lists(st.binary(max_size=21), max_size=4))
    sizes = b"".join(len(payload).to_bytes(4, "little") for payload in payloads)
    messages = b"".join(payloads)
    chunk = encode_run_chunk(key, 7, sizes, messages) if draw(st.booleans()) else None
    return Run(key, 7, len(payloads), sizes, messages, chunk=chunk)


def _count(implementation: Any, batch: list[Run], tracked: dict[bytes, int], passed: int) -> Any:
    table = {key: array("q", (count, 0)) for key, count in tracked.items()}
    passed_list = [passed]
    admitted: list[tuple[bytes, int, int]] = []

    def admit(key: bytes, messages: int, size: int) -> None:
        admitted.append((key, messages, size))
        table[key] = array("q", (messages, size))  # as the topic counter admits it

    messages = implementation(batch, table, passed_list, admit)
    return messages, {key: list(figures) for key, figures in table.items()}, passed_list, admitted


@settings(max_examples=300, deadline=None)
@given(
    batch=st.lists(runs(), max_size=40),
    tracked=st.dictionaries(st.sampled_from(KEYS), st.integers(0, 100)),
    passed=st.integers(fanout.ADMIT_EVERY - 8, fanout.ADMIT_EVERY - 1),
)
def test_compiled_and_pure_count_unrouted_agree(
    batch: list[Run], tracked: dict[bytes, int], passed: int
) -> None:
    compiled = unrouted.count_unrouted_compiled
    if compiled is None:
        assert os.environ.get("BROKY_PURE") == "1", "broky.router._fanout was not built"
        pytest.skip("the compiled count is not in use (BROKY_PURE=1)")
    assert _count(compiled, batch, tracked, passed) == _count(
        unrouted.count_unrouted_pure, batch, tracked, passed
    )


@settings(max_examples=100, deadline=None)
@given(batch=st.lists(runs(), min_size=1, max_size=20))
def test_tracked_keys_count_messages_and_durable_chunk_bytes(batch: list[Run]) -> None:
    """Every key tracked: each gets its runs' messages and the lengths of
    the durable chunks they would be stored as; nothing is admitted."""
    expected: dict[bytes, list[int]] = {key: [0, 0] for key in KEYS}
    for run in batch:
        expected[run.key][0] += run.count
        expected[run.key][1] += len(durable_chunk(run, 9, 2, 40))
    messages, table, passed, admitted = _count(
        unrouted.count_unrouted, batch, dict.fromkeys(KEYS, 0), 0
    )
    assert messages == sum(run.count for run in batch)
    assert table == expected
    assert passed == [0]
    assert admitted == []
    assert durable_chunk_sizes(batch) == [len(durable_chunk(run, 9, 2, 40)) for run in batch]
