"""Stream a Broky topic, count messages per key in time windows, and write the
counts back to Broky and to Parquet.

Run against a broker whose config has durable topics for the input and for
the output keys (see README, "Spark")::

    python examples/windowed_counts.py --broker 127.0.0.1:7722 --topic clicks \\
        --output-prefix clicks.counts --parquet /tmp/counts --checkpoint /tmp/ck

One streaming query computes the counts in update mode (Python sinks take
append mode only, and append mode would hold each window back until the
watermark passes it); ``foreachBatch`` writes each micro-batch's updated
counts to Parquet (one directory per batch id, overwritten on replay) and
publishes them to ``<output-prefix>.<key>`` with the ``batchId`` option, so
a replayed batch is not published twice. A window's count may be written
several times as it grows; the latest (largest) one is the total.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from broky.spark import register


def windowed_counts(spark: SparkSession, broker: str, topic: str, window: str) -> DataFrame:
    """Messages per key and ``window`` of broker time, from the start of ``topic``."""
    messages = (
        spark.readStream.format("broky")
        .option("broker", broker)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    return (
        messages.withWatermark("ts_broker", "10 minutes")
        .groupBy(F.window("ts_broker", window).alias("window"), "key")
        .count()
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "key",
            "count",
        )
    )


def start(
    spark: SparkSession,
    broker: str,
    topic: str,
    output_prefix: str,
    parquet_dir: str,
    checkpoint_dir: str,
    window: str = "1 minute",
    available_now: bool = False,
) -> StreamingQuery:
    """Start the query; its checkpoint (and the sink's record of published
    batches) live under ``checkpoint_dir``."""
    counts = windowed_counts(spark, broker, topic, window)
    staging = os.path.join(checkpoint_dir, "broky-sink")

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        # Overwriting the batch's own directory makes a replayed batch idempotent.
        batch.write.mode("overwrite").parquet(os.path.join(parquet_dir, f"batch={batch_id}"))
        # batchId + stagingLocation: a replayed batch is not published again.
        (
            batch.select(
                F.concat(F.lit(output_prefix + "."), F.col("key")).alias("key"),
                F.to_json(F.struct("window_start", "window_end", "key", "count")).alias("payload"),
            )
            .write.format("broky")
            .mode("append")
            .option("broker", broker)
            .option("stagingLocation", staging)
            .option("batchId", str(batch_id))
            .save()
        )
        batch.unpersist()

    writer = (
        counts.writeStream.outputMode("update")
        .foreachBatch(write_batch)
        .option("checkpointLocation", os.path.join(checkpoint_dir, "query"))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", required=True, help="HOST:PORT of the broker")
    parser.add_argument("--topic", required=True, help="durable topic to read ([[durable]] name)")
    parser.add_argument("--output-prefix", required=True, help="key prefix of the counts")
    parser.add_argument("--parquet", required=True, help="directory of the Parquet output")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory")
    parser.add_argument("--window", default="1 minute")
    parser.add_argument(
        "--available-now", action="store_true", help="process what is there, then stop"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("broky-windowed-counts").getOrCreate()
    register(spark)
    query = start(
        spark,
        args.broker,
        args.topic,
        args.output_prefix,
        args.parquet,
        args.checkpoint,
        args.window,
        args.available_now,
    )
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
