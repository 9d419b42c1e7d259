"""Spark connector throughput: 1M 100-byte messages read in batch (offline and
through a broker) and as a stream, on a local[2] SparkSession.

Run: ``.venv/bin/python -m benchmarks.bench_spark [--messages N] [--partitions P] [--repeat R]
[--keys runs|many]``.

``--keys runs`` (the default) publishes runs of 100 messages per key over 64
keys; ``--keys many`` cycles 1,000 keys message by message (``bench.k0`` ..
``bench.k999``), so every run is one message long, as with device or order
ids.

Prints one JSON line per scenario. The baseline, in the same run and over the
same data, is the offline reader (``broky.storage.reader.iter_records``)
walking every record in one Python thread, and the connector's Arrow decoder
over the same files without Spark; each Spark scenario reports its rate and
its ratio to the reader. Spark scenarios need warming up (the first Python
data source query starts workers, and the JVM compiles its hot paths over
the first few queries): each runs ``--repeat`` times, and the rate reported
is over the median of the runs after the first (the first run's rate is
reported beside it). The sink is Spark's ``noop`` format, so every row is
produced and nothing else is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio
from pyspark.sql import SparkSession

from benchmarks.interrupt import stop_children_on_signals
from broky import connect
from broky.spark import register
from broky.spark.logs import DataDirLog
from broky.spark.planning import TopicSelection
from broky.storage.reader import iter_records

PAYLOAD = b"x" * 100
PUBLISHERS = 4
#: Messages a publisher sends on one key before moving to the next (``runs``
#: mix): producers batch by key.
RUN_LENGTH = 100
#: Keys the ``many`` mix cycles through, one message each.
MANY_KEYS = 1000
KEY_MIXES = ("runs", "many")


def report(
    scenario: str, rows: int, seconds: float, baseline: float | None = None, **extra: object
) -> float:
    rate = rows / seconds
    fields: dict[str, object] = {"scenario": scenario, "rows": rows, "seconds": round(seconds, 3)}
    fields["rows_per_second"] = round(rate)
    if baseline:
        fields["ratio_to_offline_reader"] = round(rate / baseline, 2)
    print(json.dumps({**fields, **extra}), flush=True)
    return rate


def start_broker(directory: Path, partitions: int) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = directory / "broky.toml"
    config.write_text(
        f'host = "127.0.0.1"\nport = {port}\nworkers = 1\nlog_level = "error"\n'
        f'data_dir = "{directory / "data"}"\nsystem_events = false\n'
        "system_metrics_interval = 0\n[[durable]]\n"
        f'name = "bench"\npattern = "bench.>"\npartitions = {partitions}\nfsync = "never"\n'
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "broky", "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return process, f"127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.05)


async def publish(address: str, messages: int, mix: str = "runs") -> None:
    """``messages`` acked publishes from PUBLISHERS connections: 64 keys in
    runs of RUN_LENGTH messages per key, or (``many``) a new key of
    MANY_KEYS every message."""

    async def publisher(first: int) -> None:
        async with connect(address) as client:
            for index in range(first, messages, PUBLISHERS):
                if mix == "many":
                    key = f"bench.k{index % MANY_KEYS}"
                else:
                    key = f"bench.k{(index // (RUN_LENGTH * PUBLISHERS)) % 64}"
                await client.publish(key, PAYLOAD, ack=True)
                if index % 20_000 < PUBLISHERS:
                    await client.flush_acks()
            await client.flush_acks()

    async with trio.open_nursery() as nursery:
        for first in range(PUBLISHERS):
            nursery.start_soon(publisher, first)


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--repeat", type=int, default=5, help="runs per Spark scenario (the first warms the JVM)"
    )
    parser.add_argument("--keys", choices=KEY_MIXES, default="runs", help="key mix (see above)")
    args = parser.parse_args()
    stop_children_on_signals()
    rows = args.messages
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as temporary:
        directory = Path(temporary)
        data_dir = str(directory / "data")
        process, address = start_broker(directory, args.partitions)
        try:
            seconds = timed(lambda: trio.run(publish, address, rows, args.keys))
            report("publish_acked_setup", rows, seconds, keys=args.keys)

            seconds = timed(lambda: sum(1 for _ in iter_records(data_dir, "bench")))
            baseline = report("baseline_offline_reader_iter_records", rows, seconds)
            log = DataDirLog(data_dir)
            ranges = log.ranges(TopicSelection(frozenset({"bench"})), "earliest", "latest")
            seconds = timed(lambda: sum(b.num_rows for r in ranges for b in log.read_range(r)))
            report("arrow_decoder_one_thread_no_spark", rows, seconds, baseline)

            spark = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.driver.memory", "2g")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            register(spark)

            def batch(option: str, value: str) -> Callable[[], object]:
                frame = spark.read.format("broky").option(option, value).option("topic", "bench")
                return lambda: frame.load().write.format("noop").mode("overwrite").save()

            def stream(run: int) -> None:
                query = (
                    spark.readStream.format("broky")
                    .option("broker", address)
                    .option("topic", "bench")
                    .option("startingOffsets", "earliest")
                    .load()
                    .writeStream.format("noop")
                    .option("checkpointLocation", str(directory / f"checkpoint-{run}"))
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination()
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))

            runs = iter(range(1_000))
            for name, action in (
                ("spark_batch_read_data_dir", batch("dataDir", data_dir)),
                ("spark_batch_read_broker", batch("broker", address)),
                ("spark_stream_available_now_broker", lambda: stream(next(runs))),
            ):
                times = [timed(action) for _ in range(args.repeat)]
                report(
                    name,
                    rows,
                    statistics.median(times[1:]),
                    baseline,
                    spark_master="local[2]",
                    first_run_rows_per_second=round(rows / times[0]),
                    runs_seconds=[round(seconds, 3) for seconds in times],
                )
            spark.stop()
        finally:
            process.terminate()
            process.wait(10)


if __name__ == "__main__":
    main()
