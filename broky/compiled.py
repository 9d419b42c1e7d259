"""Finding a hot-path function's compiled (Cython) twin, if it may be used.

Every compiled module is optional (see setup.py): the pure-Python version
runs when the extension was not built, when it refuses to load (a
big-endian host), and when ``BROKY_PURE=1`` asks for the pure path, which
CI uses to run the hot-path tests on both.
"""

from __future__ import annotations

import importlib
import os
from typing import Any


def compiled_twin(module: str, attribute: str) -> Any:
    """``module.attribute`` from a compiled extension (the caller types it),
    or None when it is not built, cannot load here, lacks ``attribute``
    (built from older sources: a stale editable build), or ``BROKY_PURE=1``
    is set."""
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError):
        return None
