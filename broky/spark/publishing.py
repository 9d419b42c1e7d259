"""The driver's half of the sink: publish a batch's staged rows exactly once.

Tasks never publish: they stage their rows (``staging.py``) and Spark hands
the driver their commit messages. ``Committer.commit`` then

1. returns at once if the batch id is recorded as committed (Spark replays
   the last batch after a restart when its own commit record was lost);
2. otherwise records a publish plan (the staged files, and where every
   durable partition ends) unless a plan from an earlier attempt exists, in
   which case it publishes that attempt's files instead of the new ones;
3. publishes every staged row with ``ack=True`` and a uid derived from
   (sink id, batch id, file, row), skipping the uids that a resumed plan
   finds already stored past the recorded ends;
4. records the batch as committed once the last ack is in, and deletes its
   staged files.

Guarantee: rows sent to durable keys land exactly once per batch id, even if
the driver dies mid-publish and the batch is replayed. Rows sent to
ephemeral keys are not stored, so a resumed publish cannot tell what went
out: they are delivered at least once, and more than once only if the
driver died during the publish itself. Abort publishes nothing.

What the guarantee rests on: the staging directory survives the crash (it
is on storage the restarted driver sees); a resumed commit publishes the
first attempt's staged rows, so a non-deterministic query cannot publish two
different versions of one batch; rows found already stored are those still
held past the recorded ends (retention deleting them between the crash and
the resume would let them be published again); and "stored" means what the
target topic's fsync policy makes of an ack.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Final

from broky.client.client import Client
from broky.spark.logs import run_client
from broky.spark.options import BrokerEndpoint
from broky.spark.staging import PublishPlan, StagedFile, StagingArea, read_staged

#: Messages published between waits for acks: bounds the client's buffer
#: while keeping many frames in flight.
ACK_EVERY: Final = 20_000
#: Bytes per Fetch when a resumed commit looks for rows that already landed.
SCAN_BYTES: Final = 4 * 1024 * 1024
#: How long a whole commit may take, as a guard against a broker that hangs.
COMMIT_TIMEOUT: Final = 600.0


def row_uid(sink_id: str, batch_id: int, file_index: int, row: int) -> bytes:
    """The deterministic 20-byte uid of one staged row (Broky uids are 20 bytes)."""
    return hashlib.blake2b(
        f"{sink_id}/{batch_id}/{file_index}/{row}".encode(), digest_size=20
    ).digest()


def staged_rows(
    files: Sequence[str],
) -> Iterator[tuple[int, int, str, bytes, bytes, list[tuple[str, str]]]]:
    """``(file index, row, key, payload, key_partition, tags)`` of every staged
    row, in publish order. Staged batches hold the sink's columns (see
    ``writing.sink_batches``)."""
    for file_index, path in enumerate(files):
        row = 0
        for batch in read_staged(path):
            columns = batch.to_pydict()
            key_partitions = columns.get("key_partition") or [None] * batch.num_rows
            tags = columns.get("tags") or [None] * batch.num_rows
            for key, payload, key_partition, row_tags in zip(
                columns["key"], columns["payload"], key_partitions, tags, strict=True
            ):
                # A null tag value (Spark maps may hold them) is sent empty.
                tag_pairs = [(name, value or "") for name, value in row_tags or []]
                yield file_index, row, key, payload, key_partition or b"", tag_pairs
                row += 1


class Committer:
    """Publishes committed batches of one sink (see the module doc)."""

    def __init__(self, broker: BrokerEndpoint, staging: StagingArea) -> None:
        self.broker = broker
        self.staging = staging

    def commit(self, batch_id: int, messages: Sequence[StagedFile | None]) -> int:
        """Publish batch ``batch_id``; returns the rows published by this call."""
        staging = self.staging
        if staging.committed(batch_id):
            staging.discard(batch_id)
            return 0
        files = sorted(message.path for message in messages if message and message.path)
        plan = staging.pending(batch_id)
        resuming = plan is not None
        if plan is None:
            plan = PublishPlan(tuple(files), self._ends())
            staging.begin(batch_id, plan)
        staging.discard(batch_id)  # other attempts' files; the plan's stay
        sink_id = staging.sink_id()
        published = run_client(
            self.broker,
            lambda client: self._publish(client, sink_id, batch_id, plan, resuming),
            timeout=COMMIT_TIMEOUT,
        )
        staging.finish(batch_id, published)
        return published

    def abort(self, batch_id: int) -> None:
        """Drop what this attempt staged; nothing was published."""
        self.staging.discard(batch_id)

    def _ends(self) -> dict[str, dict[str, int]]:
        infos = run_client(self.broker, lambda client: client.partitions(""))
        ends: dict[str, dict[str, int]] = {}
        for info in sorted(infos):
            ends.setdefault(info.topic, {})[str(info.partition)] = info.end_offset
        return ends

    async def _publish(
        self, client: Client, sink_id: str, batch_id: int, plan: PublishPlan, resuming: bool
    ) -> int:
        landed = await self._landed(client, plan) if resuming else set()
        published = 0
        for file_index, row, key, payload, key_partition, tags in staged_rows(plan.files):
            uid = row_uid(sink_id, batch_id, file_index, row)
            if uid in landed:
                continue
            await client.publish(
                key, payload, key_partition=key_partition, tags=tags, uid=uid, ack=True
            )
            published += 1
            if published % ACK_EVERY == 0:
                await client.flush_acks()
        await client.flush_acks()
        return published

    @staticmethod
    async def _landed(client: Client, plan: PublishPlan) -> set[bytes]:
        """Uids stored in durable partitions since ``plan.ends``: what an
        interrupted publish of this plan already delivered."""
        uids: set[bytes] = set()
        for info in await client.partitions(""):
            offset = int(plan.ends.get(info.topic, {}).get(str(info.partition), 0))
            offset = max(offset, info.start_offset)
            while offset < info.end_offset:
                messages = await client.fetch(info.topic, info.partition, offset, SCAN_BYTES)
                if not messages:
                    break
                uids.update(message.uid for message in messages if message.uid)
                offset = messages[-1].offset + 1
        return uids
