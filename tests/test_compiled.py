"""Finding a compiled twin (broky.compiled): a missing one, for whatever
reason, means the pure version runs, never an import error; and the twins
of the durable publish path are built where a compiler is."""

from __future__ import annotations

import os

import pytest

from broky.compiled import compiled_twin
from broky.durable import acks
from broky.storage import batch


def test_a_twin_missing_from_its_module_is_none() -> None:
    """An extension built from older sources (a stale editable build) lacks
    newer functions: their pure versions run instead of the import failing."""
    assert compiled_twin("broky.storage._batch", "not_a_function_there") is None
    assert compiled_twin("broky.no_such_extension", "encode_runs") is None


@pytest.mark.parametrize(
    ("found", "name"),
    [
        (batch.encode_runs_compiled, "broky.storage._batch"),
        (batch.stored_byte_ends_compiled, "broky.storage._batch"),
        (acks.ack_columns_compiled, "broky.protocol._columns"),
    ],
)
def test_the_durable_path_twins_are_built(found: object, name: str) -> None:
    """``make`` builds them; a silent fallback would leave the slow path on."""
    if os.environ.get("BROKY_PURE") == "1":
        assert found is None
        return
    assert found is not None, f"{name} not built"
