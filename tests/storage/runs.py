"""Helpers for storage tests: build runs and read back what a log holds."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from broky.protocol.frames import Run
from broky.protocol.message import decode_run, encode_message, pack_sizes
from broky.storage.batch import StoredBatch
from broky.storage.log import PartitionLog


def make_run(
    key: bytes, payloads: Sequence[bytes], ts_broker: int = 0, key_partitions: Sequence[bytes] = ()
) -> Run:
    """A run of real message FlatBuffers, as the router would hand it over."""
    partitions = list(key_partitions) or [b""] * len(payloads)
    messages = [
        encode_message(payload, key_partition=kp)
        for payload, kp in zip(payloads, partitions, strict=True)
    ]
    return Run(
        key, ts_broker, len(messages), pack_sizes([len(m) for m in messages]), b"".join(messages)
    )


def flatten(batches: Iterable[StoredBatch]) -> list[tuple[int, bytes, bytes]]:
    """``(offset, key, payload)`` of every message in the batches."""
    out = []
    for batch in batches:
        messages = decode_run(batch.run)
        for index, message in enumerate(messages):
            out.append((batch.base_offset + index, batch.key, message.payload))
    return out


def read_all(
    log: PartitionLog, start: int | None = None, max_bytes: int = 4096
) -> list[tuple[int, bytes, bytes]]:
    """Everything from ``start`` (default: the log's start) in small reads,
    checking that consecutive reads join without gap or overlap."""
    offset = log.start_offset if start is None else start
    out: list[tuple[int, bytes, bytes]] = []
    while offset < log.end_offset:
        batches = log.read(offset, max_bytes)
        assert batches, f"no progress at {offset}"
        assert batches[0].base_offset == offset
        out.extend(flatten(batches))
        offset = batches[-1].next_offset
    return out


def append_rounds(log: PartitionLog, rounds: list[list[int]]) -> None:
    """One append per round, each of runs of the given sizes, keys cycling
    over three and payloads ``m<offset>``."""
    counter = 0
    for round_sizes in rounds:
        runs = []
        for size in round_sizes:
            runs.append(
                make_run(b"k.%d" % (counter % 3), [b"m%d" % (counter + i) for i in range(size)])
            )
            counter += size
        log.append(runs)
