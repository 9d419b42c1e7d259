"""The protocol package imports flatbuffers without numpy (see
``broky.protocol._import_flatbuffers``), and numpy stays importable.

Each check runs in a fresh interpreter: this test process has imported
flatbuffers (and so numpy) long before."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("numpy") is None,
    reason="numpy is not installed: flatbuffers cannot import it anyway",
)


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_broker_and_cli_modules_do_not_import_numpy() -> None:
    code = (
        "import sys, broky.cli, broky.server, broky.client.tcp\n"
        "print('numpy' in sys.modules, 'flatbuffers' in sys.modules)"
    )
    assert _run(code) == "False True"


def test_numpy_stays_importable_and_the_finder_is_restored() -> None:
    code = (
        "import importlib.machinery as m, broky.protocol.codec\n"
        "import numpy\n"
        "print(type(m.PathFinder.__dict__['find_spec']).__name__, numpy.arange(3).sum())"
    )
    assert _run(code) == "classmethod 3"


def test_numpy_imported_first_is_left_alone() -> None:
    code = "import numpy, flatbuffers.number_types as n, broky.protocol.codec\nprint(n.np is numpy)"
    assert _run(code) == "True"
