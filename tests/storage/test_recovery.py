"""Recovery: torn tails are cut, flipped bits are caught, indexes are rebuilt,
and no corrupt byte is ever served."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broky.storage.config import LogConfig
from broky.storage.errors import CorruptRecordError
from broky.storage.log import PartitionLog
from tests.storage.runs import flatten, make_run, read_all

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=128)
#: Runs written to the reference log: (key, payloads), offsets follow.
RUNS = [(b"k.%d" % (i % 3), [b"m%d-%d" % (i, j) for j in range(1 + i % 4)]) for i in range(40)]
EXPECTED = [
    (offset, key, payload)
    for offset, (key, payload) in enumerate(
        (key, payload) for key, payloads in RUNS for payload in payloads
    )
]
_examples = itertools.count()


def write_reference(directory: Path, *, close: bool) -> None:
    log = PartitionLog.open(str(directory), CONFIG)
    for key, payloads in RUNS:
        log.append([make_run(key, payloads)])
    if close:
        log.close()
    else:
        log.abandon()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log as a crashed broker leaves it: no index for the active segment."""
    directory = tmp_path_factory.mktemp("reference")
    write_reference(directory, close=False)
    return directory


def copy_of(reference: Path, tmp_path: Path) -> Path:
    target = tmp_path / f"example-{next(_examples)}"
    shutil.copytree(reference, target)
    return target


def logs(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def test_a_clean_reopen_scans_nothing(tmp_path: Path) -> None:
    write_reference(tmp_path, close=True)
    with PartitionLog.open(str(tmp_path), CONFIG) as log:
        assert log.recovery.clean
        assert log.recovery.segments_scanned == 0
        assert read_all(log) == EXPECTED


def test_after_a_crash_only_the_active_segment_is_scanned(reference: Path, tmp_path: Path) -> None:
    directory = copy_of(reference, tmp_path)
    with PartitionLog.open(str(directory), CONFIG) as log:
        assert log.recovery.clean
        assert log.recovery.segments_scanned == 1
        assert read_all(log) == EXPECTED


@pytest.mark.parametrize("damage", ["missing", "garbage", "stale"])
def test_a_bad_index_is_rebuilt(reference: Path, tmp_path: Path, damage: str) -> None:
    directory = copy_of(reference, tmp_path)
    index = sorted(directory.glob("*.index"))[0]
    if damage == "missing":
        index.unlink()
    elif damage == "garbage":
        index.write_bytes(b"\xff" * 100)
    else:  # describes another log size: the .log grew after it was written
        with open(logs(directory)[0], "ab") as file:
            file.write(b"")
        data = bytearray(index.read_bytes())
        data[24] ^= 1  # log_bytes
        index.write_bytes(bytes(data))
    with PartitionLog.open(str(directory), CONFIG) as log:
        assert log.recovery.indexes_rebuilt == 2  # that one and the active segment's
        assert log.recovery.clean
        assert read_all(log) == EXPECTED
    with PartitionLog.open(str(directory), CONFIG) as log:
        assert log.recovery.segments_scanned == 0, "the rebuilt index was written"


def test_orphan_index_files_are_removed(reference: Path, tmp_path: Path) -> None:
    directory = copy_of(reference, tmp_path)
    (directory / f"{10**9:020d}.index").write_bytes(b"left over")
    with PartitionLog.open(str(directory), CONFIG) as log:
        assert log.recovery.orphans_removed == 1
    assert not (directory / f"{10**9:020d}.index").exists()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.integers(min_value=0))
def test_a_torn_tail_is_truncated_to_the_last_whole_batch(
    reference: Path, tmp_path: Path, cut: int
) -> None:
    directory = copy_of(reference, tmp_path)
    active = logs(directory)[-1]
    size = active.stat().st_size
    cut %= size
    os.truncate(active, cut)
    with PartitionLog.open(str(directory), CONFIG) as log:
        held = read_all(log)
        assert held == EXPECTED[: len(held)], "a prefix of what was written, nothing else"
        assert log.end_offset == len(held)
        assert active.stat().st_size <= cut
        assert log.recovery.truncated_bytes == cut - active.stat().st_size
        assert log.append([make_run(b"after", [b"x"])]).first_offset == len(held)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_flipped_bit_in_the_active_segment_is_cut_off(
    reference: Path, tmp_path: Path, data: st.DataObject
) -> None:
    directory = copy_of(reference, tmp_path)
    active = logs(directory)[-1]
    contents = bytearray(active.read_bytes())
    bit = data.draw(st.integers(0, 8 * len(contents) - 1))
    contents[bit // 8] ^= 1 << (bit % 8)
    active.write_bytes(bytes(contents))
    with PartitionLog.open(str(directory), CONFIG) as log:
        assert log.recovery.truncated_bytes > 0
        held = read_all(log)
        assert held == EXPECTED[: len(held)]
        assert active.stat().st_size <= bit // 8, "cut at or before the damaged byte"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_flipped_bit_in_a_sealed_segment_is_never_served(
    reference: Path, tmp_path: Path, data: st.DataObject
) -> None:
    directory = copy_of(reference, tmp_path)
    sealed = data.draw(st.sampled_from(logs(directory)[:-1]))
    # With its index, the segment is trusted on open and the damage is found
    # by the read's CRC check; without, recovery's scan finds it first.
    rescan = data.draw(st.booleans())
    if rescan:
        sealed.with_suffix(".index").unlink()
    contents = bytearray(sealed.read_bytes())
    bit = data.draw(st.integers(0, 8 * len(contents) - 1))
    contents[bit // 8] ^= 1 << (bit % 8)
    sealed.write_bytes(bytes(contents))
    with PartitionLog.open(str(directory), CONFIG) as log:
        assert log.recovery.corrupt_segments == ((int(sealed.stem),) if rescan else ())
        assert os.path.getsize(sealed) == len(contents), "a sealed segment is never cut"
        served = []
        offset = log.start_offset
        while offset < log.end_offset:
            try:
                batches = log.read(offset, 1)
            except CorruptRecordError:
                offset += 1  # step over the damage one offset at a time
                continue
            served.extend(flatten(batches))
            offset = batches[-1].next_offset
    assert len(served) < len(EXPECTED), "the damaged batch is not served"
    for record in served:
        assert EXPECTED[record[0]] == record
