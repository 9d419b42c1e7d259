"""Counting stored runs that no subscription takes.

A durable topic's owner (broky.durable.owner) builds a stored run's chunk
only when some subscription wants its key; the others it hands to
``Router.count_unrouted``, which must leave the counters and the
busiest-keys figures as ``publish`` would have. With no subscriber at all
(the common case of a topic written now and read later) that is every run of
every round: one message per run over many keys makes it a per-message cost,
so the loop has a compiled twin.

``count_unrouted(runs, table, passed, admit)`` adds each run's messages and
its durable chunk's length (``durable_chunk_sizes``, measured without
building it) to its key's figures in ``table`` (key -> array [messages,
bytes]); a key not tracked yet is admitted (``admit(key, messages, size)``,
the topic counter's ``count``) once in ``ADMIT_EVERY`` runs as ``fan_out``
admits it, ``passed[0]`` counting the runs passed since. It returns the
messages of ``runs``.

The C extension ``broky.router._fanout`` and ``count_unrouted_pure`` do
exactly the same; a hypothesis property holds them equal.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial

from broky.protocol.chunks import DURABLE_CHUNK_SHIFT, DURABLE_SIZES_AT, durable_chunk_sizes
from broky.protocol.frames import Run
from broky.router.fanout import Topics, tally

Admit = Callable[[bytes, int, int], None]
CountUnrouted = Callable[[Sequence[Run], Topics, list[int], Admit], int]


def count_unrouted_pure(runs: Sequence[Run], table: Topics, passed: list[int], admit: Admit) -> int:
    """The pure-Python implementation (see the module docstring)."""
    messages = 0
    for run, size in zip(runs, durable_chunk_sizes(runs), strict=True):
        count = run.count
        messages += count
        if not tally(table, passed, run.key, count, size):
            admit(run.key, count, size)
    return messages


def _compiled() -> CountUnrouted | None:
    if os.environ.get("BROKY_PURE") == "1":
        return None
    try:
        from broky.router import _fanout  # noqa: PLC0415
    except ImportError:
        return None
    compiled = getattr(_fanout, "count_unrouted", None)
    if compiled is None:
        return None  # built from older sources (a stale editable build)
    counting: CountUnrouted = partial(compiled, DURABLE_CHUNK_SHIFT, DURABLE_SIZES_AT)
    return counting


count_unrouted_compiled = _compiled()
#: What this process uses: the compiled loop when it is there.
count_unrouted: CountUnrouted = count_unrouted_compiled or count_unrouted_pure
