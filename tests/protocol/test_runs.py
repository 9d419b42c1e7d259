"""The compiled run type (``broky.protocol._runs``) behaves as the pure class does."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.protocol import frames
from broky.router.durable_runs import DurableEncodedRun


def _compiled() -> type[frames.EncodedRun]:
    if frames.EncodedRun is frames.EncodedRunPure:
        assert os.environ.get("BROKY_PURE") == "1", "broky.protocol._runs was not built"
        pytest.skip("the compiled run type is not in use (BROKY_PURE=1)")
    return frames.EncodedRun


fields = st.tuples(st.binary(max_size=8), st.integers(0, 2**40), st.binary(max_size=16))


@given(a=fields, b=fields)
def test_compiled_runs_compare_and_print_as_pure_runs_do(
    a: tuple[bytes, int, bytes], b: tuple[bytes, int, bytes]
) -> None:
    compiled = _compiled()
    pure = frames.EncodedRunPure
    assert (compiled(*a) == compiled(*b)) == (pure(*a) == pure(*b))
    assert (compiled(*a) != compiled(*b)) == (pure(*a) != pure(*b))
    assert repr(compiled(*a)) == repr(pure(*a))
    run = compiled(*a)
    assert (run.key, run.count, run.chunk) == a


def test_compiled_runs_are_unhashable_and_their_fields_typed() -> None:
    compiled = _compiled()
    with pytest.raises(TypeError):
        hash(compiled(b"k", 1, b"c"))
    with pytest.raises(TypeError):
        compiled(b"k", "one", b"c")  # type: ignore[arg-type]


def test_a_durable_run_compares_all_five_fields() -> None:
    log = object()
    run = DurableEncodedRun(b"k", 2, b"chunk", log, 10)
    assert run == DurableEncodedRun(b"k", 2, b"chunk", log, 10)
    assert run != DurableEncodedRun(b"k", 2, b"chunk", log, 11)
    assert run != DurableEncodedRun(b"k", 2, b"chunk", object(), 10)
    assert run != frames.EncodedRun(b"k", 2, b"chunk")
    assert isinstance(run, frames.EncodedRun)
    assert "base_offset=10" in repr(run)
