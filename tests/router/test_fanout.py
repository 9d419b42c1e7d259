"""The compiled fan-out loop is the pure one's twin, and both batch as documented."""

from __future__ import annotations

import os
from array import array
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.frames import EncodedRun
from broky.router import fanout, sweep


class Recorder:
    """Stands in for a Subscription: records what push_many hands it."""

    def __init__(self, name: str, log: list[tuple[str, list[bytes], int, int]]) -> None:
        self.name = name
        self.log = log

    def push_many(self, runs: list[EncodedRun], messages: int, size: int) -> None:
        self.log.append((self.name, [run.key for run in runs], messages, size))


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[EncodedRun], dict[bytes, int], dict[bytes, int], int, int]:
    keys = [b"a", b"b", b"c", b"d", b"e"]
    runs = [
        EncodedRun(key, draw(st.integers(0, 5)), bytes(draw(st.integers(0, 64))))
        for key in draw(st.lists(st.sampled_from(keys), max_size=30))
    ]
    # key -> route number (routes 0-2; 3: no subscribers); absent keys miss.
    routes = draw(st.dictionaries(st.sampled_from(keys), st.integers(0, 3)))
    topics = draw(st.dictionaries(st.sampled_from(keys), st.integers(0, 100)))
    # Untracked runs passed before: near ADMIT_EVERY, so admissions happen.
    passed = draw(st.integers(fanout.ADMIT_EVERY - 8, fanout.ADMIT_EVERY - 1))
    return runs, routes, topics, draw(st.integers(0, 30)), passed


def _run(
    implementation: Any, case: tuple[list[EncodedRun], dict[bytes, int], dict[bytes, int], int, int]
) -> tuple[object, ...]:
    runs, route_numbers, topic_counts, start, passed_before = case
    log: list[tuple[str, list[bytes], int, int]] = []
    a, b = Recorder("a", log), Recorder("b", log)
    shared = ((a,), (a, b), (b,), ())  # interned route tuples, as the router keeps them
    routes = {key: shared[number] for key, number in route_numbers.items()}
    topics = {key: array("q", (count, 0)) for key, count in topic_counts.items()}
    passed = [passed_before]
    result = implementation(runs, min(start, len(runs)), routes, topics, passed)
    without_topics = implementation(runs, min(start, len(runs)), routes, None, [0])
    return result, without_topics, log, topics, passed


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_compiled_and_pure_fan_out_agree(
    case: tuple[list[EncodedRun], dict[bytes, int], dict[bytes, int], int, int],
) -> None:
    compiled = fanout.fan_out_compiled
    if compiled is None:
        assert os.environ.get("BROKY_PURE") == "1", "broky.router._fanout was not built"
        pytest.skip("the compiled fan-out is not in use (BROKY_PURE=1)")
    assert _run(compiled, case) == _run(fanout.fan_out_pure, case)


def test_consecutive_runs_of_one_route_go_as_one_batch_and_a_miss_stops() -> None:
    log: list[tuple[str, list[bytes], int, int]] = []
    a = Recorder("a", log)
    route = (a,)
    runs = [EncodedRun(key, 1, b"xx") for key in (b"k1", b"k2", b"k3", b"new", b"k1")]
    routes: Any = {b"k1": route, b"k2": route, b"k3": route}
    topics = {key: array("q", (0, 0)) for key in (b"k1", b"k2", b"k3", b"new")}
    assert fanout.fan_out(runs, 0, routes, topics, [0]) == (3, 3, 3, 0)
    assert log == [("a", [b"k1", b"k2", b"k3"], 3, 6)]
    assert topics[b"k1"].tolist() == [1, 2]
    assert topics[b"new"].tolist() == [0, 0]  # not walked: its route is not cached


@pytest.mark.parametrize("implementation", ["pure", "compiled"])
def test_untracked_keys_are_passed_and_one_in_admit_every_stops_for_admission(
    implementation: str,
) -> None:
    fan_out = fanout.fan_out_pure if implementation == "pure" else fanout.fan_out_compiled
    if fan_out is None:
        pytest.skip("the compiled fan-out is not in use (BROKY_PURE=1)")
    log: list[tuple[str, list[bytes], int, int]] = []
    route = (Recorder("a", log),)
    runs = [EncodedRun(b"k%d" % n, 1, b"x") for n in range(200)]
    routes: Any = {run.key: route for run in runs}
    topics = {b"k0": array("q", (0, 0))}
    passed = [0]
    # k0 is counted; k1..k63 pass uncounted; k64, the 64th untracked, stops
    # (the router admits it and carries on from k65).
    assert fanout.ADMIT_EVERY == 64
    assert fan_out(runs, 0, routes, topics, passed) == (64, 64, 64, 0)
    assert (topics[b"k0"].tolist(), passed) == ([1, 1], [0])
    assert fan_out(runs, 65, routes, topics, passed) == (128, 63, 63, 0)
    assert passed == [0]
    assert sum(messages for _, _, messages, _ in log) == 64 + 63


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40)), max_size=20),
    budget=st.integers(0, 300),
    frame_room=st.integers(0, 400),
)
def test_compiled_and_pure_sweep_agree(
    sizes: list[tuple[int, int]], budget: int, frame_room: int
) -> None:
    compiled = sweep.sweep_compiled
    if compiled is None:
        assert os.environ.get("BROKY_PURE") == "1", "broky.router._fanout was not built"
        pytest.skip("the compiled sweep is not in use (BROKY_PURE=1)")
    runs = [EncodedRun(b"k%d" % n, count, bytes(size)) for n, (count, size) in enumerate(sizes)]
    left_compiled, left_pure = deque(runs), deque(runs)
    assert compiled(left_compiled, budget, frame_room) == sweep.sweep_pure(
        left_pure, budget, frame_room
    )
    assert left_compiled == left_pure


def test_sweep_takes_the_front_that_fits_the_budget_or_nothing() -> None:
    runs = deque(EncodedRun(b"k", 2, bytes(10)) for _ in range(5))
    assert sweep.sweep(runs, 25, 1_000) == ([bytes(10)] * 3, 30, 6)  # the last overshoots
    assert len(runs) == 2
    assert sweep.sweep(runs, 25, 20) is None  # 2 runs, 20 bytes + 8 of offsets: no frame
    assert len(runs) == 2
    assert sweep.sweep(runs, 1_000, 1_000) == ([bytes(10)] * 2, 20, 4)
    assert not runs
