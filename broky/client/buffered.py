"""The iteration both receivers share: buffered runs in, items out, credit back.

A ``Subscription`` hands out ``Message`` objects and a durable-subscription
``Consumer`` hands out ``Delivery`` objects, but both buffer the runs the
client's reader task gives them, convert runs only when iteration reaches
them (``_convert``), iterate per item or per batch on one shared position,
and grant flow-control credit back as runs are taken. That machinery lives
here once; each subclass says how a run becomes items.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from typing import Final, Generic, Protocol, TypeVar

import trio

from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Flow, Frame, LocatedDeliver, Run
from broky.protocol.located import read_located_run

log = logging.getLogger("broky.client")
_U32: Final = struct.Struct("<I")

#: Items the per-item iterator converts at once, in whole runs: one trio
#: checkpoint per this many (see ``BufferedRuns._decoded``).
ITERATION_MESSAGES: Final = 256
#: Default ``max_messages`` of ``batches``: big enough that the checkpoint
#: per batch costs nothing per message, small enough that a batch's items
#: stay in the CPU cache (4096 measured 30-40% slower per message).
BATCH_MESSAGES: Final = 512

Item = TypeVar("Item")


class FrameRuns:
    """The runs of a ``LocatedDeliver`` not taken yet, left in its frame:
    the next run's uoffset is at ``slot`` of ``buffer``, ``runs`` of them
    remain. A consumer's compiled builder reads them in place
    (``delivery.convert_located``); ``take_run`` reads the next one as a Run
    for every other path. Owned by one stream's buffer, not shared."""

    __slots__ = ("buffer", "runs", "slot")

    def __init__(self, frame: LocatedDeliver) -> None:
        self.buffer = frame.buffer
        self.slot = frame.runs_at
        self.runs = frame.runs

    def take_run(self) -> Run:
        """The next run (a located chunk: ``count_located`` checked it when
        the frame arrived)."""
        view = memoryview(self.buffer)
        slot = self.slot
        run = read_located_run(view, slot + _U32.unpack_from(view, slot)[0])
        if run is None:
            raise RemoteProtocolError("a checked located chunk no longer reads as one")
        self.slot = slot + 4
        self.runs -= 1
        return run


class CreditOwner(Protocol):
    """What the iteration needs of its client: a way to send ``Flow``."""

    @property
    def closed(self) -> bool: ...

    def _send_control(self, frame: Frame) -> None: ...


class BufferedRuns(Generic[Item]):
    """Runs buffered for one stream, iterated as items with ``async for``
    (``batches`` for lists), credit granted back half a window at a time.

    Subclasses implement ``_convert`` (one run to its items; raise
    RemoteProtocolError to skip an undecodable run, which is logged).
    """

    def __init__(self, client: CreditOwner, stream: int, credit: int) -> None:
        self._client = client
        self.stream = stream
        self._credit = credit
        self._runs: deque[Run | FrameRuns] = deque()
        self._buffered = 0
        self._batch: list[Item] = []
        self._position = 0
        self._ready = trio.Event()
        self._confirmed = trio.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._paused = False
        self._ungranted = 0
        self.received = 0
        self.dropped_by_broker = 0

    def _convert(self, run: Run) -> list[Item]:
        raise NotImplementedError

    # called by the client's reader task --------------------------------------

    def _deliver(self, runs: tuple[Run, ...]) -> None:
        self._runs.extend(runs)
        self._buffered += sum(run.count for run in runs)
        self._ready.set()

    def _deliver_located(self, frame: LocatedDeliver) -> None:
        """Buffer ``frame``'s runs where they are: each is read when taken."""
        if frame.runs:
            self._runs.append(FrameRuns(frame))
            self._buffered += frame.count
            self._ready.set()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._confirmed.set()
        self._ready.set()

    # the application's side ----------------------------------------------------

    def __aiter__(self) -> BufferedRuns[Item]:
        return self

    async def __anext__(self) -> Item:
        # The common case returns a converted item without any trio call.
        position = self._position
        batch = self._batch
        if position < len(batch):
            self._position = position + 1
            return batch[position]
        self._batch = batch = await self._decoded(ITERATION_MESSAGES)
        self._position = 1
        return batch[0]

    def batches(self, max_messages: int = BATCH_MESSAGES) -> Batches[Item]:
        """Iterate in lists: ``async for batch in receiver.batches()``.

        Each list holds, in order, what is buffered when it is taken: at
        least one item (it waits for one) and at most ``max_messages``.
        One trio checkpoint per batch, none per item. Per-item and batch
        iteration share one position, so they can be mixed. The list is the
        caller's to keep.
        """
        if max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, got {max_messages}")
        return Batches(self, max_messages)

    async def _next_batch(self, max_messages: int) -> list[Item]:
        position, batch = self._position, self._batch
        if position >= len(batch):
            batch, position = await self._decoded(max_messages), 0
        if not position and len(batch) <= max_messages:
            # Hand the list itself over: the iterator keeps no reference to it.
            self._batch, self._position = [], 0
            return batch
        end = min(position + max_messages, len(batch))
        self._batch, self._position = batch, end
        return batch[position:end]

    async def _decoded(self, limit: int) -> list[Item]:
        """Convert whole buffered runs up to ``limit`` items (or one run,
        however big), waiting for runs when none are buffered.

        Exactly one checkpoint per call (the wait, or ``checkpoint``), none
        per item: a consumer that never awaits anything else still lets the
        reader and the application's other tasks run every ``limit`` items,
        and the per-item cost stays that of a list index.
        """
        runs = self._runs
        while True:
            if runs:
                await trio.lowlevel.checkpoint()
            else:
                await self._wait_for_runs()
            items, taken = self._take(limit)
            self._consumed(taken)
            if items:
                return items

    def _take(self, limit: int) -> tuple[list[Item], int]:
        """Convert buffered runs, whole runs while they fit ``limit`` items
        (so a batch is sliced only when one run alone exceeds it), at least
        one; returns the items and the messages the runs held (an
        undecodable run is logged and counted, its items dropped)."""
        runs = self._runs
        items: list[Item] = []
        taken = 0
        while runs:
            run = runs[0]
            if isinstance(run, FrameRuns):
                run = self._split(run)
            if taken and taken + run.count > limit:
                break
            runs.popleft()
            taken += run.count
            items = self._convert_one(run, items)
        return items, taken

    def _split(self, frame: FrameRuns) -> Run:
        """Take ``frame``'s next run out in front of it (in its place once it
        was the last one) and return it."""
        run = frame.take_run()
        if frame.runs:
            self._runs.appendleft(run)
            self._split_off()
        else:
            self._runs[0] = run
        return run

    def _split_off(self) -> None:
        """A buffered frame became two items: a run, then the frame."""

    def _convert_one(self, run: Run, items: list[Item]) -> list[Item]:
        """``items`` followed by ``run``'s, or ``items`` alone when the run
        is undecodable (logged)."""
        try:
            converted = self._convert(run)
        except RemoteProtocolError as exc:
            log.warning("stream %d: dropped an undecodable run: %s", self.stream, exc)
            return items
        if items:
            items += converted
            return items
        return converted

    async def _wait_for_runs(self) -> None:
        """Wait until a run is buffered; raise the stream's error, or
        StopAsyncIteration once closed, when none is left."""
        while not self._runs:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            self._ready = trio.Event()
            await self._ready.wait()

    def _consumed(self, count: int) -> None:
        """Count ``count`` items as taken and return their credit in grants
        of half the window, so Flow frames stay rare."""
        self._buffered -= count
        self.received += count
        if self._credit:
            self._ungranted += count
            if not self._paused and self._ungranted * 2 >= self._credit:
                self._grant()

    def _grant(self) -> None:
        if self._ungranted and self._error is None and not self._client.closed:
            self._client._send_control(Flow(self.stream, self._ungranted))
            self._ungranted = 0

    def pause(self) -> None:
        """Stop granting credit back: the broker stops sending once what it
        may send has arrived (at most the credit window). No effect with
        credit 0 (no flow control)."""
        self._paused = True

    def resume(self) -> None:
        """Grant the credit held back since ``pause``."""
        self._paused = False
        self._grant()

    @property
    def buffered_messages(self) -> int:
        """Items received and not yet handed to the application."""
        return self._buffered + len(self._batch) - self._position


class Batches(Generic[Item]):
    """The async iterator ``batches`` returns: lists of items."""

    def __init__(self, source: BufferedRuns[Item], max_messages: int) -> None:
        self._source = source
        self._max_messages = max_messages

    def __aiter__(self) -> Batches[Item]:
        return self

    async def __anext__(self) -> list[Item]:
        return await self._source._next_batch(self._max_messages)
