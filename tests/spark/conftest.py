"""Fixtures of the Spark tests: one local[2] SparkSession and one broker
process for the whole session (a session start costs ~5 s, so tests share
it and use durable topics of their own).

The broker runs as a ``python -m broky serve`` subprocess on 127.0.0.1; the
tests talk to it with synchronous helpers that wrap the trio client.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from broky import Message, connect

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")

from pyspark.sql import SparkSession  # noqa: E402 - after the importorskip guard

from broky.spark import register  # noqa: E402

#: Durable topics of the test broker: (name, pattern, partitions).
TOPICS = [
    ("batch", "batch.>", 3),
    ("stream", "stream.>", 2),
    ("sinkin", "sinkin.>", 2),
    ("sinkout", "sinkout.>", 2),
    ("writes", "writes.>", 2),
    ("resume", "resume.>", 2),
    ("exin", "exin.>", 2),
    ("exout", "exout.>", 1),
    ("pushdown", "pushdown.>", 3),
]
#: Small segments, so that offline reads span several segments per partition.
SEGMENT_BYTES = 64 * 1024


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class BrokerProcess:
    """A ``broky serve`` subprocess with a data directory and the TOPICS."""

    def __init__(self, directory: Path, extra_config: str = "") -> None:
        self.data_dir = directory / "data"
        self.address = f"127.0.0.1:{free_port()}"
        config = directory / "broky.toml"
        tables = "".join(
            f'[[durable]]\nname = "{name}"\npattern = "{pattern}"\npartitions = {partitions}\n'
            f'segment_bytes = {SEGMENT_BYTES}\nfsync = "never"\n'
            for name, pattern, partitions in TOPICS
        )
        config.write_text(
            f'host = "127.0.0.1"\nport = {self.address.rsplit(":", 1)[1]}\nworkers = 1\n'
            f'log_level = "error"\ndata_dir = "{self.data_dir}"\nsystem_events = false\n'
            f"system_metrics_interval = 0\n{extra_config}\n{tables}"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "broky", "serve", "--config", str(config)]
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(
                    ("127.0.0.1", int(self.address.rsplit(":", 1)[1])), 1
                ):
                    break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def publish(self, items: list[tuple[str, bytes]], **fields: object) -> None:
        """Publish ``(key, payload)`` pairs with acks (stored when this returns)."""

        async def main() -> None:
            async with connect(self.address) as client:
                for key, payload in items:
                    await client.publish(key, payload, ack=True, **fields)  # type: ignore[arg-type]
                await client.flush_acks()

        trio.run(main)

    def read_topic(self, topic: str) -> list[Message]:
        """Every message a durable topic holds, partition by partition."""

        async def main() -> list[Message]:
            found: list[Message] = []
            async with connect(self.address) as client:
                for info in await client.partitions(topic):
                    offset = info.start_offset
                    while offset < info.end_offset:
                        batch = await client.fetch(topic, info.partition, offset)
                        found.extend(batch)
                        offset = batch[-1].offset + 1
            return found

        return trio.run(main)


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("broker"))
    yield process
    process.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The session's one SparkSession; the workers' environment is fixed at start."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("broky-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
