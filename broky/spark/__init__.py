"""Spark connector (``pip install 'broky[spark]'``): the ``broky`` data source.

Register it once per SparkSession, then use ``format("broky")``::

    from broky.spark import register
    register(spark)
    spark.read.format("broky").load("/var/lib/broky")          # offline
    spark.readStream.format("broky").option("broker", "host:7722")
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from broky.spark.columns import READ_SCHEMA
from broky.spark.logs import NotDurableError
from broky.spark.options import BrokyOptionError
from broky.spark.planning import OffsetsError
from broky.spark.source import BrokyDataSource
from broky.spark.workers import WorkerPythonError, check_worker_python

__all__ = [
    "READ_SCHEMA",
    "BrokyDataSource",
    "BrokyOptionError",
    "NotDurableError",
    "OffsetsError",
    "WorkerPythonError",
    "register",
]


def register(spark: SparkSession) -> None:
    """Make ``format("broky")`` available in ``spark``.

    With a local master, first checks that the Python workers' interpreter
    can import broky, and raises WorkerPythonError saying what to set if it
    cannot (see broky.spark.workers); other masters are not checked.
    """
    context = spark.sparkContext
    check_worker_python(context.master, context.pythonExec)
    spark.dataSource.register(BrokyDataSource)
