"""The router's per-run loop: runs whose route is cached, queued in batches.

``fan_out(runs, start, routes, topics, passed)`` walks ``runs`` from
``start`` while each run's key has a cached route (``routes``: key -> tuple
of receivers). Unless ``topics`` is None it also counts each run into the
busiest-keys table (``topics``: key -> array [messages, bytes], added
to in place). Consecutive runs with the same route tuple (the router interns
them, so identity tells) are handed to each of its receivers as one
``push_many``. It stops at the first run that needs the router's own
attention, having queued everything before it, and returns ``(stop, runs,
messages, unrouted messages)`` for what it walked. The router handles that
run and calls again from the next one, so cache misses (rare: new keys) cost
Python, and hits (every other run) cost only this loop.

A run needs the router for a key with no cached route, or for a key the
topic table does not track yet, to admit it; but not every time: a run of
an untracked key is passed uncounted unless it is the ``ADMIT_EVERY``-th
since the last admission (``passed[0]`` counts them, across calls). Hot keys
come round often and are admitted at once; a stream of ever-new keys
(device ids, order ids) would otherwise send every run through Python.

Two implementations do exactly the same: the C extension
``broky.router._fanout`` (Cython) and ``fan_out_pure``, which runs where it
is not built and with ``BROKY_PURE=1``; a hypothesis property holds them
equal.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from broky.protocol.frames import EncodedRun
from broky.router.queues import Receiver

Routes = Mapping[bytes, tuple[Receiver, ...]]
Topics = dict[bytes, "array[int]"]
FanOut = Callable[
    [Sequence[EncodedRun], int, Routes, "Topics | None", list[int]], tuple[int, int, int, int]
]
#: Runs of untracked keys passed uncounted per one stopped for admission.
ADMIT_EVERY: Final = 64


def tally(topics: Topics, passed: list[int], key: bytes, count: int, size: int) -> bool:
    """Add a run of ``count`` messages, ``size`` bytes, to ``key``'s figures
    if the key is tracked, else count it as passed; False when it is the
    ``ADMIT_EVERY``-th untracked run, due for admission (``passed`` reset)."""
    figures = topics.get(key)
    if figures is not None:
        figures[0] += count
        figures[1] += size
    elif passed[0] < ADMIT_EVERY - 1:
        passed[0] += 1
    else:
        passed[0] = 0
        return False
    return True


def fan_out_pure(
    runs: Sequence[EncodedRun],
    start: int,
    routes: Routes,
    topics: Topics | None,
    passed: list[int],
) -> tuple[int, int, int, int]:
    """The pure-Python implementation (see the module docstring)."""
    published_runs = published_messages = unrouted = 0
    batch: list[EncodedRun] = []
    batch_route: tuple[Receiver, ...] = ()
    batch_messages = batch_bytes = 0
    stop = len(runs)
    for position in range(start, stop):
        run = runs[position]
        key = run.key
        subscriptions = routes.get(key)
        if subscriptions is None:
            stop = position
            break
        count = run.count
        size = len(run.chunk)
        if topics is not None and not tally(topics, passed, key, count, size):
            stop = position
            break
        published_runs += 1
        published_messages += count
        if not subscriptions:
            unrouted += count
        elif subscriptions is batch_route:
            batch.append(run)
            batch_messages += count
            batch_bytes += size
        else:
            if batch:
                for subscription in batch_route:
                    subscription.push_many(batch, batch_messages, batch_bytes)
            batch = [run]
            batch_route = subscriptions
            batch_messages = count
            batch_bytes = size
    if batch:
        for subscription in batch_route:
            subscription.push_many(batch, batch_messages, batch_bytes)
    return stop, published_runs, published_messages, unrouted


def _compiled() -> FanOut | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        from broky.router import _fanout  # noqa: PLC0415
    except ImportError:
        return None
    if getattr(_fanout, "RUN_TYPE", None) is not EncodedRun:
        return None  # built from older sources (a stale editable build): not this run type
    return _fanout.fan_out


fan_out_compiled = _compiled()
#: What this process uses: the compiled loop when it is there.
fan_out: FanOut = fan_out_compiled or fan_out_pure
