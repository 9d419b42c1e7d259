"""The ``broky`` data source: what Spark instantiates for ``format("broky")``."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from broky.spark.columns import READ_SCHEMA
from broky.spark.options import BrokyOptionError, ReadOptions, WriteOptions
from broky.spark.reading import BatchReader, FilteringBatchReader, StreamReader
from broky.spark.writing import BatchWriter, StreamWriter, check_schema


class BrokyDataSource(DataSource):
    """Read Broky logs (batch or stream) and publish to Broky (batch or stream).

    Options are parsed when Spark asks for a reader or writer, on the driver,
    so a bad option fails the query before any task runs.
    """

    @classmethod
    def name(cls) -> str:
        """The short name of ``spark.read.format("broky")``."""
        return "broky"

    def schema(self) -> StructType:
        """Rows of a read (fixed: see ``columns.READ_SCHEMA``)."""
        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """The plain reader unless option ``pushFilters`` asks for pushdown
        (see ``FilteringBatchReader`` for why that is opt-in)."""
        options = ReadOptions.parse(self.options)
        return FilteringBatchReader(options) if options.push_filters else BatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise BrokyOptionError("Broky topics are append-only: write with mode('append')")
        options = WriteOptions.parse(self.options, streaming=False)
        check_schema(schema, options)
        return BatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = WriteOptions.parse(self.options, streaming=True)
        check_schema(schema, options)
        return StreamWriter(options)
