"""Check, at ``register`` time, that Spark's Python workers can import broky.

Spark unpickles the data source in separate Python worker processes, run
by the interpreter ``SparkContext.pythonExec`` names: ``PYSPARK_PYTHON`` as
it was when the SparkContext started, else a bare ``python3`` looked up on
the PATH. In a virtualenv that ``python3`` is often another interpreter,
and the first read then fails deep in a worker traceback with
``No module named 'broky'``. Checking once when the source is registered
turns that into an error that says what to set.

Only local masters are checked: their workers run on this machine, with
this process's environment. On a cluster the executors' interpreter lives
elsewhere, so guessing would be wrong either way.

Spark (4.x) reads the ``spark.pyspark.python`` conf only when spark-submit
launches the driver; set on ``SparkSession.builder`` in a running Python
process it changes nothing, so the advice is the environment variable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

#: How long the probe interpreter may take to import broky. A cold start
#: takes well under a second, but the check must not fail a healthy setup
#: on a loaded machine; past this the check gives up silently (the read
#: itself will then tell).
IMPORT_CHECK_SECONDS = 20.0


class WorkerPythonError(RuntimeError):
    """Spark's Python workers would run an interpreter that cannot import broky.

    The user's setup is at fault; the message names the interpreter, why it
    failed and what to set before the SparkSession starts.
    """


def is_local_master(master: str | None) -> bool:
    """Whether the workers of ``master`` run on this machine (``local``, ``local[4]``, ...).

    ``None`` (pyspark types ``SparkContext.master`` as optional) is not known to be local.
    """
    return master is not None and (
        master == "local" or master.startswith(("local[", "local-cluster["))
    )


def check_worker_python(
    master: str | None, python_exec: str, timeout: float = IMPORT_CHECK_SECONDS
) -> None:
    """Raise WorkerPythonError if ``python_exec`` cannot import broky.

    ``python_exec`` is what the workers will run (``SparkContext.pythonExec``),
    resolved on the PATH like Spark does. The probe inherits this process's
    environment and working directory, as local workers do. Costs one
    interpreter start unless ``python_exec`` is this very interpreter.
    """
    if not is_local_master(master):
        return
    found = shutil.which(python_exec)
    if found is None:
        raise WorkerPythonError(_advice(python_exec, "it is not an executable on the PATH"))
    if os.path.abspath(found) == os.path.abspath(sys.executable):
        return
    try:
        probe = subprocess.run(
            [found, "-c", "import broky"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return
    except OSError as error:
        raise WorkerPythonError(_advice(found, f"it does not run ({error})")) from error
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"]
        raise WorkerPythonError(_advice(found, f"it cannot import broky: {lines[-1]}"))


def _advice(interpreter: str, reason: str) -> str:
    return (
        f"Spark's Python workers would run {interpreter!r} (PYSPARK_PYTHON when the "
        f"SparkContext started, else python3 on the PATH), but {reason}. This driver "
        f"runs {sys.executable!r}. Stop this SparkSession and start the next one after "
        f'os.environ["PYSPARK_PYTHON"] = sys.executable (or export '
        f"PYSPARK_PYTHON={sys.executable} in the shell; with spark-submit, "
        f"--conf spark.pyspark.python={sys.executable}). Setting spark.pyspark.python "
        f"on SparkSession.builder does not reach the workers."
    )
