"""The benchmark's load shapes and byte-stream counters (sans-IO)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broky.loadtest.load import (
    MESSAGE_MARK,
    Load,
    MarkCounter,
    Stamper,
    StampScanner,
    broky_sends,
    matches,
    stamped_payload,
)
from broky.protocol.codec import decode_frame
from broky.protocol.frames import Publish
from broky.protocol.framing import FrameReader


def test_many_keys_cycle_every_key_in_runs_of_one() -> None:
    load = Load(keys=1000, run=1, frame=100)
    sends = load.sends()
    keys = [key for send in sends for key in send]
    assert keys == [f"bench.k{n}" for n in range(1000)]
    assert all(len(send) == 100 for send in sends)


def test_broky_sends_decode_to_the_load() -> None:
    for load in (Load(keys=7, run=3, frame=10), Load(run=1, frame=1), Load()):
        reader = FrameReader(1 << 20)
        views = [view for data in broky_sends(load) for view in reader.feed(data)]
        frames = [frame for frame in map(decode_frame, views) if isinstance(frame, Publish)]
        assert len(frames) == len(views)
        runs = [run for frame in frames for run in frame.runs]
        assert [run.key.decode() for run in runs for _ in range(run.count)] == [
            key for send in load.sends() for key in send
        ]
        assert all(sum(run.count for run in frame.runs) <= load.frame for frame in frames)


@given(st.lists(st.integers(0, 200), max_size=20))
def test_marks_split_anywhere_are_counted_once(cuts: list[int]) -> None:
    stream = b"".join(MESSAGE_MARK + b"x" * 100 for _ in range(10))
    counter = MarkCounter(MESSAGE_MARK)
    position, total = 0, 0
    for cut in [*cuts, len(stream)]:
        end = min(position + cut, len(stream))
        total += counter.feed(stream[position:end])
        position = end
    assert total == 10


@given(st.lists(st.integers(1, 60), max_size=30))
def test_stamps_split_anywhere_are_timed_once(cuts: list[int]) -> None:
    stamper = Stamper(b"head" + stamped_payload(100) + b"tail")
    stream = b"".join(stamper.stamp(due) for due in range(1000, 1005))
    latencies: list[int] = []
    scanner = StampScanner(latencies.append)
    position = 0
    for cut in [*cuts, len(stream)]:
        scanner.feed(stream[position : position + cut], 2000)
        position += cut
    scanner.feed(stream[position:], 2000)
    assert sorted(latencies) == [996, 997, 998, 999, 1000]


def test_matches_follows_broky_wildcards() -> None:
    assert matches("bench.>", "bench.k1")
    assert not matches("bench.>", "bench")
    assert matches("bench.*", "bench.data")
    assert not matches("x.y", "bench.data")
