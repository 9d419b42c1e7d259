"""The connector end to end: a local[2] SparkSession against a broker process."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import RDD
from pyspark.sql import DataFrame, DataFrameReader, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from broky.ksuid import new_ksuid
from examples.windowed_counts import start
from tests.spark.conftest import BrokerProcess

pytestmark = pytest.mark.spark


def rows_by_position(frame: DataFrame) -> dict[tuple[str, int, int], dict[str, Any]]:
    return {(row.topic, row.partition, row.offset): row.asDict() for row in frame.collect()}


def test_batch_read_offline_and_through_broker_in_parallel_with_pruning(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    first = [(f"batch.k{index % 40}", f"early-{index:04d}".encode() * 8) for index in range(2000)]
    broker.publish(first)
    time.sleep(0.05)
    cut = time.time_ns()
    time.sleep(0.05)
    broker.publish([("batch.tagged", b"late")], key_partition=b"kp", tags=[("a", "b")])
    uid = new_ksuid()
    broker.publish([("batch.uid", b"late-uid")], uid=uid)

    offline = spark.read.format("broky").option("topic", "batch").load(str(broker.data_dir))
    online = (
        spark.read.format("broky")
        .option("broker", broker.address)
        .option("topic", "batch")
        .option("maxRowsPerPartition", "300")
        .load()
    )
    # One task per segment offline (segments are 64 KiB here), per 300 rows online.
    assert offline.rdd.getNumPartitions() > 3
    assert online.rdd.getNumPartitions() > 3
    offline_rows = rows_by_position(offline)
    assert offline_rows == rows_by_position(online)
    assert len(offline_rows) == 2002
    assert Counter(row["payload"] for row in offline_rows.values()) == Counter(
        [payload for _, payload in first] + [b"late", b"late-uid"]
    )
    tagged = next(row for row in offline_rows.values() if row["key"] == "batch.tagged")
    assert tagged["key_partition"] == b"kp"
    assert tagged["tags"] == {"a": "b"}
    assert tagged["uid"] is None
    assert tagged["ts_broker"] is not None
    plain = next(row for row in offline_rows.values() if row["key"] == "batch.k0")
    assert plain["key_partition"] is None
    assert plain["tags"] == {}
    assert next(r for r in offline_rows.values() if r["key"] == "batch.uid")["uid"] == uid
    # Dense offsets per partition, every partition present.
    for partition in range(3):
        offsets = sorted(o for (_, p, o) in offline_rows if p == partition)
        assert offsets == list(range(len(offsets)))

    # Pruning: a partition and an offset range, offline and online alike.
    # (A DataFrameReader keeps the options it was given: one per query.)
    for location in ("dataDir", "broker"):

        def source(location: str = location) -> DataFrameReader:
            value = str(broker.data_dir) if location == "dataDir" else broker.address
            return spark.read.format("broky").option(location, value)

        pruned = (
            source()
            .option("topicPattern", "bat.*")
            .option("partitions", "1")
            .option("startingOffsets", json.dumps({"batch": {"1": 10}}))
            .option("endingOffsets", json.dumps({"batch": {"1": 25}}))
            .load()
        )
        assert pruned.rdd.getNumPartitions() == 1
        pruned_rows = pruned.collect()
        assert sorted(row.offset for row in pruned_rows) == list(range(10, 25))
        assert {row.partition for row in pruned_rows} == {1}
        by_time = source().option("topic", "batch").option("startTime", str(cut)).load()
        assert sorted(row.payload for row in by_time.collect()) == [b"late", b"late-uid"]
        assert source().option("topic", "nosuch").load().count() == 0


#: Spark refuses a reader that defines pushFilters unless this is on.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def test_pushed_filters_plan_fewer_partitions_and_change_no_row(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    broker.publish([(f"pushdown.k{index % 7}", f"p{index}".encode()) for index in range(150)])
    where = "topic IN ('pushdown', 'other') AND partition IN (0, 2) AND offset >= 5 AND offset < 20"
    never = "ts_broker > timestamp'2100-01-01' AND ts_broker < timestamp'2000-01-01'"

    def query(location: str, push: bool, condition: str = where) -> RDD[Row]:
        """The query's RDD: planned once, for both its partitions and its rows."""
        value = str(broker.data_dir) if location == "dataDir" else broker.address
        reader = spark.read.format("broky").option(location, value).option("topic", "pushdown")
        reader = reader.option("maxRowsPerPartition", "25").option("pushFilters", str(push))
        return reader.load().where(condition).rdd

    # Opt-in: with Spark's default conf, asking for pushdown fails and says why.
    with pytest.raises(Exception, match="filterPushdown"):
        query("broker", push=True).collect()
    spark.conf.set(PUSHDOWN_CONF, "true")
    try:
        for location in ("dataDir", "broker"):
            plain, pushed = query(location, push=False), query(location, push=True)
            # Offline: one range per segment, 3 -> 2; online: 25-row slices, 7 -> 2.
            assert pushed.getNumPartitions() < plain.getNumPartitions()
            rows = {(row.topic, row.partition, row.offset): row for row in pushed.collect()}
            assert rows == {(row.topic, row.partition, row.offset): row for row in plain.collect()}
            assert {partition for _, partition, _ in rows} == {0, 2}
        # Timestamps arrive as aware datetimes: no time matches, so no range
        # is planned (Spark reads one empty placeholder partition).
        assert query("broker", push=True, condition=never).getNumPartitions() == 1
    finally:
        spark.conf.unset(PUSHDOWN_CONF)


def read_stream(spark: SparkSession, broker: BrokerProcess, topic: str, max_rows: int) -> DataFrame:
    """A stream of ``topic`` from its start, ``max_rows`` per micro-batch."""
    return (
        spark.readStream.format("broky")
        .option("broker", broker.address)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRowsPerBatch", str(max_rows))
        .load()
    )


def run_stream(
    spark: SparkSession, broker: BrokerProcess, checkpoint: Path, output: Path
) -> list[int]:
    """One Trigger.AvailableNow run of stream -> parquet; returns rows per batch."""
    query = (
        read_stream(spark, broker, "stream", max_rows=250)
        .select("partition", "offset", "payload")
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(60)
    assert query.exception() is None
    return [progress["numInputRows"] for progress in query.recentProgress]


def test_stream_restarts_from_checkpoint_with_every_message_exactly_once(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    broker.publish([(f"stream.k{index % 5}", f"a{index}".encode()) for index in range(600)])
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    batches = run_stream(spark, broker, checkpoint, output)
    assert sum(batches) == 600
    assert max(batches) <= 250  # maxRowsPerBatch
    # The checkpoint holds per-partition offsets.
    last = max(int(name) for name in os.listdir(checkpoint / "offsets") if name.isdigit())
    offset_json = (checkpoint / "offsets" / str(last)).read_text().splitlines()[-1]
    assert sum(json.loads(offset_json)["stream"].values()) == 600

    broker.publish([(f"stream.k{index % 5}", f"b{index}".encode()) for index in range(300)])
    assert sum(run_stream(spark, broker, checkpoint, output)) == 300
    assert sum(run_stream(spark, broker, checkpoint, output)) == 0  # nothing new

    rows = spark.read.parquet(str(output)).collect()
    assert len(rows) == 900
    assert len({(row.partition, row.offset) for row in rows}) == 900
    expected = {f"a{i}".encode() for i in range(600)} | {f"b{i}".encode() for i in range(300)}
    assert {row.payload for row in rows} == expected


def test_stream_refuses_an_ephemeral_topic(spark: SparkSession, broker: BrokerProcess) -> None:
    query = (
        spark.readStream.format("broky")
        .option("broker", broker.address)
        .option("topic", "prices")
        .load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="no such durable topic") as raised:
        query.awaitTermination(60)
    assert "ephemeral keys are not stored" in str(raised.value)


def relay(
    spark: SparkSession, broker: BrokerProcess, checkpoint: Path, fail_marker: Path | None
) -> Any:
    """sinkin -> upper-cased payload -> sinkout; the first run fails a task
    mid-batch while ``fail_marker`` does not exist yet."""
    marker = str(fail_marker) if fail_marker else ""

    def shout(payload: bytes) -> bytes:
        if marker and not os.path.exists(marker) and payload.endswith(b"77"):
            with open(marker, "w") as file:
                file.write("failed once")
            raise RuntimeError("injected task failure")
        return payload.upper()

    return (
        read_stream(spark, broker, "sinkin", max_rows=120)
        .select(
            F.concat(F.lit("sinkout."), F.col("partition").cast("string")).alias("key"),
            F.udf(shout, BinaryType(), useArrow=False)("payload").alias("payload"),
            F.create_map(F.lit("from"), F.col("offset").cast("string")).alias("tags"),
        )
        .writeStream.format("broky")
        .option("broker", broker.address)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_sink_publishes_once_on_commit_across_failures_and_replays(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    broker.publish([(f"sinkin.k{i % 3}", f"m{i:03d}".encode()) for i in range(300)])
    checkpoint, marker = tmp_path / "checkpoint", tmp_path / "failed"

    # A task fails mid-batch: Spark aborts the batch and the query stops.
    query = relay(spark, broker, checkpoint, marker)
    with pytest.raises(Exception, match="injected task failure"):
        query.awaitTermination(60)
    assert marker.exists()
    published_before_failure = len(broker.read_topic("sinkout"))
    failed_batch = max(int(n) for n in os.listdir(checkpoint / "offsets") if n.isdigit())
    committed = checkpoint / "commits"
    assert not (committed / str(failed_batch)).exists()
    # Abort published nothing of the failed batch: only earlier batches are out.
    assert published_before_failure == 120 * failed_batch

    # Restart: the failed batch is replayed, and published once.
    query = relay(spark, broker, checkpoint, marker)
    query.awaitTermination(60)
    assert query.exception() is None
    check_relayed(broker.read_topic("sinkout"))

    # Spark lost its record of the last batch after the sink had committed it
    # (a driver crash between the two): the replay publishes nothing again.
    last = max(int(n) for n in os.listdir(committed) if n.isdigit())
    (committed / str(last)).unlink()
    (committed / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it
    query = relay(spark, broker, checkpoint, marker)
    query.awaitTermination(60)
    assert query.exception() is None
    assert sum(progress["numInputRows"] for progress in query.recentProgress) > 0
    check_relayed(broker.read_topic("sinkout"))


def check_relayed(messages: list[Any]) -> None:
    payloads = Counter(message.payload for message in messages)
    assert payloads == Counter(f"M{i:03d}".encode() for i in range(300))
    assert all(len(message.uid) == 20 for message in messages)
    assert all(dict(message.tags).keys() == {"from"} for message in messages)


def test_batch_write_publishes_on_commit_and_nothing_on_abort(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    frame = spark.createDataFrame(
        [(f"writes.k{i % 4}", f"w{i}", bytes([i % 3]) if i % 2 else None) for i in range(200)],
        "key string, payload string, key_partition binary",
    )
    staging = str(tmp_path / "staging")
    (
        frame.write.format("broky")
        .mode("append")
        .option("broker", broker.address)
        .option("stagingLocation", staging)
        .save()
    )
    stored = broker.read_topic("writes")
    assert sorted(message.payload for message in stored) == sorted(
        f"w{i}".encode() for i in range(200)
    )
    assert {message.key_partition for message in stored} == {b"", b"\x00", b"\x01", b"\x02"}

    def explode(payload: str) -> str:
        if payload == "w150":
            raise RuntimeError("injected write failure")
        return payload

    failing = frame.select(
        "key", F.udf(explode, "string", useArrow=False)("payload").alias("payload")
    )
    with pytest.raises(Exception, match="injected write failure"):
        failing.write.format("broky").mode("append").option("broker", broker.address).option(
            "stagingLocation", staging
        ).save()
    assert len(broker.read_topic("writes")) == 200
    # Nothing is left behind by either job.
    assert os.listdir(staging) == []

    append = frame.select("key").write.format("broky").mode("append")
    with pytest.raises(Exception, match="needs a payload column"):
        append.option("broker", broker.address).save()
    with pytest.raises(Exception, match="append-only"):
        frame.write.format("broky").mode("overwrite").option("broker", broker.address).save()


def test_example_pipeline_counts_per_key_into_broky_and_parquet(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    expected = Counter({"exin.a": 30, "exin.b": 12, "exin.c": 5})
    broker.publish([(key, b"click") for key, count in expected.items() for _ in range(count)])
    query = start(
        spark,
        broker.address,
        "exin",
        "exout",
        str(tmp_path / "parquet"),
        str(tmp_path / "checkpoint"),
        window="1 hour",
        available_now=True,
    )
    assert query.awaitTermination(90), "Trigger.AvailableNow did not stop the query"
    assert query.exception() is None

    # The latest count of each (window, key) is its total; windows add up per key.
    latest: dict[tuple[str, str], int] = {}
    for message in broker.read_topic("exout"):
        count = json.loads(message.payload)
        latest[count["window_start"], count["key"]] = count["count"]
    totals: Counter[str] = Counter()
    for (_, key), count in latest.items():
        totals[key] += count
    assert totals == expected

    rows = spark.read.parquet(str(tmp_path / "parquet")).collect()
    largest: dict[tuple[object, str], int] = {}
    for row in rows:
        largest[row.window_start, row.key] = max(
            largest.get((row.window_start, row.key), 0), row["count"]
        )
    parquet_totals: Counter[str] = Counter()
    for (_, key), count in largest.items():
        parquet_totals[key] += count
    assert parquet_totals == expected
