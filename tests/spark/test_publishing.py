"""The sink's driver-side commit against a real broker, without Spark:
a publish interrupted mid-batch resumes without duplicates."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from broky.client.client import Client
from broky.spark import publishing
from broky.spark.options import BrokerEndpoint
from broky.spark.publishing import Committer
from broky.spark.staging import StagedFile, StagingArea
from tests.spark.conftest import BrokerProcess


def stage(staging: StagingArea, batch_id: int, attempt: int, rows: int) -> list[StagedFile | None]:
    files: list[StagedFile | None] = []
    for partition in range(2):
        batch = pa.RecordBatch.from_pydict(
            {
                "key": [f"resume.k{i % 3}" for i in range(rows)],
                "payload": [f"p{partition}-{i}".encode() for i in range(rows)],
            }
        )
        files.append(staging.stage(batch_id, partition, attempt, [batch]))
    return files


def test_a_commit_that_died_mid_publish_resumes_without_duplicates(
    broker: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging = StagingArea(str(tmp_path / "staging"))
    committer = Committer(BrokerEndpoint(broker.address), staging)
    first_attempt = stage(staging, 7, attempt=1, rows=150)

    # The driver dies after 120 of 300 rows were published (and acked in 40s).
    monkeypatch.setattr(publishing, "ACK_EVERY", 40)
    real_publish = Client.publish
    sent = 0

    async def dying_publish(self: Client, *args: Any, **kwargs: Any) -> None:
        nonlocal sent
        if sent == 120:
            raise ConnectionError("driver died")
        sent += 1
        await real_publish(self, *args, **kwargs)

    monkeypatch.setattr(Client, "publish", dying_publish)
    with pytest.raises(ConnectionError):
        committer.commit(7, first_attempt)
    monkeypatch.setattr(Client, "publish", real_publish)
    assert len(broker.read_topic("resume")) == 120
    assert not staging.committed(7)

    # Spark replays the batch: new task attempts stage the rows again, and the
    # commit resumes the first attempt's plan, publishing only what is missing.
    second_attempt = stage(staging, 7, attempt=2, rows=150)
    assert committer.commit(7, second_attempt) == 180
    stored = broker.read_topic("resume")
    expected = [f"p{p}-{i}".encode() for p in range(2) for i in range(150)]
    assert Counter(message.payload for message in stored) == Counter(expected)
    assert staging.committed(7)

    # A replay after the commit finished publishes nothing and cleans up.
    assert committer.commit(7, stage(staging, 7, attempt=3, rows=150)) == 0
    assert len(broker.read_topic("resume")) == 300
    assert list((tmp_path / "staging").glob("batch-7/*")) == []


def test_abort_publishes_nothing_and_drops_the_attempt(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    staging = StagingArea(str(tmp_path / "staging"))
    before = len(broker.read_topic("resume"))
    stage(staging, 1, attempt=1, rows=10)
    Committer(BrokerEndpoint(broker.address), staging).abort(1)
    assert len(broker.read_topic("resume")) == before
    assert list((tmp_path / "staging").glob("batch-1/*")) == []


def test_old_commit_records_are_dropped_recent_ones_kept(tmp_path: Path) -> None:
    staging = StagingArea(str(tmp_path / "staging"))
    for batch_id in range(150):
        staging.finish(batch_id, 0)
    assert not staging.committed(48)
    assert all(staging.committed(batch_id) for batch_id in range(49, 150))
