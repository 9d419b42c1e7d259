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

__all__ = [
    "READ_SCHEMA",
    "BrokyDataSource",
    "BrokyOptionError",
    "NotDurableError",
    "OffsetsError",
    "register",
]


def register(spark: SparkSession) -> None:
    """Make ``format("broky")`` available in ``spark``."""
    spark.dataSource.register(BrokyDataSource)
