"""Finding the compiled twin of a pure-Python function (the storage side's
Cython extensions, ``setup.py``): the twin when it is built and wanted,
None when it is not built (no compiler at install) or ``BROKY_PURE=1`` asks
for the pure versions (CI runs the suites both ways)."""

from __future__ import annotations

import importlib
import os
from typing import Any


def compiled_twin(module: str, name: str) -> Any:
    """``module.name`` when the extension ``module`` is built and
    ``BROKY_PURE`` is not ``1``; None otherwise."""
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        return None
