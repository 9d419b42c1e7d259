"""Broky's wire protocol, sans-IO: bytes in, typed frames out, and back.

Nothing in this package performs I/O or imports trio; the server, the client and
the tests all drive the same code.

Importing the package imports the FlatBuffers runtime first, without the
numpy it probes for (:func:`_import_flatbuffers`).
"""

from __future__ import annotations

import importlib.machinery
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType


def _import_flatbuffers() -> None:
    """Import the FlatBuffers runtime with numpy hidden from its probe.

    Why: flatbuffers imports numpy at its own import whenever numpy is
    installed (``flatbuffers.compat.import_numpy``), for vector helpers Broky
    never calls. The Spark extra installs numpy, and then every broker
    process (the supervisor and each worker) and every ``broky pub`` paid for
    it: ~0.1 s of start-up and ~15 MB of memory each (``import broky.cli``:
    60.5 MB -> 45 MB resident). While flatbuffers loads, its probe
    (``PathFinder.find_spec("numpy")``) is answered "not found", so it
    records numpy as absent; numpy itself stays importable by anyone. Nothing
    is hidden when either is imported already. The probe is patched on the
    class for the length of one import: another thread importing numpy in
    that instant would be told it is missing, which only an application
    importing Broky and numpy concurrently from two threads could meet."""
    if "flatbuffers" in sys.modules or "numpy" in sys.modules:
        return
    finder = importlib.machinery.PathFinder
    original = finder.__dict__["find_spec"]
    probe = finder.find_spec

    def without_numpy(
        name: str, path: object = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        return None if name == "numpy" else probe(name, path, target)  # type: ignore[arg-type]

    setattr(finder, "find_spec", without_numpy)  # noqa: B010 - a class attribute, restored below
    try:
        import flatbuffers  # noqa: F401, PLC0415
    finally:
        setattr(finder, "find_spec", original)  # noqa: B010


_import_flatbuffers()
