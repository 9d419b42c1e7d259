"""What ``flush_acks`` returns: the acked runs as the broker's answers hold them.

A producer publishing one message per key (order ids, device ids) gets one
acked run per message: tens of thousands per ``flush_acks``. Building an
``AckedRun`` for each as its answer arrives kept them all alive until the
call, and the cyclic garbage collector scanned them again and again while
they piled up: a quarter of such a publisher's CPU went to bookkeeping the
caller usually only counts or drops. ``AckedRuns`` keeps each answer's
columns (the frame's keys and the PublishAck's tuples, which exist anyway)
and makes an ``AckedRun`` only when one is looked at; ``messages`` counts
without making any. It is an ordinary read-only sequence otherwise, and
equal to a list or tuple of the same ``AckedRun`` items.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import overload

from broky.client.durable import AckedRun
from broky.protocol.frames import PublishAck


class AckedRuns(Sequence[AckedRun]):
    """Acked runs, oldest first, over the answers' columns (module docstring)."""

    __slots__ = ("_answers", "_ends")

    def __init__(self, answers: Sequence[tuple[Sequence[str], PublishAck]] = ()) -> None:
        #: (the frame's key per run, the broker's answer), in answer order.
        self._answers = tuple(answers)
        #: Runs up to and including each answer, for indexing.
        self._ends = list(accumulate(len(ack.runs) for _, ack in self._answers))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[AckedRun]:
        for keys, ack in self._answers:
            for run, partition, first, last in zip(
                ack.runs, ack.partitions, ack.first_offsets, ack.last_offsets, strict=True
            ):
                yield AckedRun(keys[run] if run < len(keys) else "", partition, first, last)

    @overload
    def __getitem__(self, index: int) -> AckedRun: ...

    @overload
    def __getitem__(self, index: slice) -> list[AckedRun]: ...

    def __getitem__(self, index: int | slice) -> AckedRun | list[AckedRun]:
        if isinstance(index, slice):
            return list(self)[index]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("acked run index out of range")
        which = bisect_right(self._ends, index)
        keys, ack = self._answers[which]
        i = index - (self._ends[which - 1] if which else 0)
        run = ack.runs[i]
        key = keys[run] if run < len(keys) else ""
        return AckedRun(key, ack.partitions[i], ack.first_offsets[i], ack.last_offsets[i])

    @property
    def messages(self) -> int:
        """Messages acked in all: each run's ``last_offset - first_offset + 1``."""
        return sum(
            sum(map(operator.sub, ack.last_offsets, ack.first_offsets)) + len(ack.runs)
            for _, ack in self._answers
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AckedRuns | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __add__(self, other: object) -> AckedRuns | list[AckedRun]:
        """``acked += await client.flush_acks()`` keeps working as on lists
        (two AckedRuns stay lazy)."""
        if isinstance(other, AckedRuns):
            return AckedRuns(self._answers + other._answers)
        if isinstance(other, list | tuple):
            return [*self, *other]
        return NotImplemented

    def __radd__(self, other: object) -> list[AckedRun]:
        if isinstance(other, list | tuple):
            return [*other, *self]
        return NotImplemented

    def __repr__(self) -> str:
        return f"AckedRuns({list(self)!r})"
