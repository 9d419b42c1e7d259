"""register's check of the workers' interpreter, mostly without Spark.

The fake interpreters are shell scripts around this Python: ``-I -S``
ignores PYTHONPATH, the working directory and site-packages, so it cannot
import broky, like a system ``python3`` next to a virtualenv.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from broky.spark import WorkerPythonError, register
from broky.spark.workers import check_worker_python


def script(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def bare_python(tmp_path: Path) -> Path:
    """An interpreter that runs but cannot import broky."""
    return script(tmp_path, "python3", f'exec {sys.executable} -I -S "$@"')


def test_an_interpreter_without_broky_is_refused_with_what_to_set(bare_python: Path) -> None:
    with pytest.raises(WorkerPythonError) as caught:
        check_worker_python("local[2]", str(bare_python))
    message = str(caught.value)
    assert str(bare_python) in message
    assert "No module named 'broky'" in message
    assert f"PYSPARK_PYTHON={sys.executable}" in message
    assert 'os.environ["PYSPARK_PYTHON"] = sys.executable' in message


def test_a_bare_name_is_looked_up_on_the_path_as_spark_does(
    bare_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(bare_python.parent))
    with pytest.raises(WorkerPythonError, match="cannot import broky"):
        check_worker_python("local", "python3")


def test_a_missing_interpreter_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkerPythonError, match="not an executable on the PATH"):
        check_worker_python("local[*]", str(tmp_path / "nowhere" / "python3"))


def test_another_interpreter_that_imports_broky_passes(tmp_path: Path) -> None:
    # Not sys.executable itself, so the probe really runs.
    wrapper = script(tmp_path, "python-wrapper", f'exec {sys.executable} "$@"')
    check_worker_python("local[2]", str(wrapper))
    check_worker_python("local[2]", sys.executable)


def test_cluster_masters_are_not_guessed_about(bare_python: Path) -> None:
    for master in ("spark://host:7077", "yarn", "k8s://https://host:6443", None):
        check_worker_python(master, str(bare_python))


def test_a_probe_that_hangs_does_not_block_registering(tmp_path: Path) -> None:
    sleeper = script(tmp_path, "python-sleeps", "exec sleep 30")
    check_worker_python("local[2]", str(sleeper), timeout=0.5)


@pytest.mark.spark
def test_register_checks_the_sessions_worker_interpreter(
    spark: SparkSession, bare_python: Path
) -> None:
    # The shared session's workers run sys.executable; pretend they were
    # started with the default python3 of a system without broky.
    context = spark.sparkContext
    configured = context.pythonExec
    context.pythonExec = str(bare_python)
    try:
        with pytest.raises(WorkerPythonError, match="cannot import broky"):
            register(spark)
    finally:
        context.pythonExec = configured
    register(spark)
