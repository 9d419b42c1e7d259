"""One partition's owner: the task that alone touches its log.

``PartitionOwner.run`` serves rounds (broky.durable.store's docstring says
why: group commit, one thread call per round, arrival order). Apart from
the store, which owns the policies, the partitions' owners and the shared
backpressure bounds, because a round is a job of its own: sort the runs of
idempotent producers (broky.durable.rounds), append and fsync in a thread
(a round with no fsync whose append is one ``write()`` takes none), then,
back on the trio thread, hold the round for the replication gate
(broky.replication.gate) or settle it (fan out, acks).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final

import trio

from broky.durable.acks import AckQueue, AckTicket
from broky.durable.parts import Part, round_columns
from broky.durable.producers import RECOVERY_TAIL_BYTES, Identity, ProducerWindow
from broky.durable.replica_gate import ReplicaGate
from broky.durable.rounds import RoundPlan
from broky.durable.thread_hop import run_in_thread
from broky.protocol.chunks import durable_chunk
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import EncodedRun, Run
from broky.router.durable_runs import DurableEncodedRun
from broky.storage.config import FsyncPolicy
from broky.storage.errors import StorageError
from broky.storage.log import PartitionLog
from broky.storage.log_results import LogStatistics
from broky.storage.recovery import RecoveryReport
from broky.storage.topics import TopicPolicy

if TYPE_CHECKING:  # the store creates owners; an owner only reads its bounds
    from broky.durable.store import DurableStore

log = logging.getLogger("broky.durable")

_KEY: Final = attrgetter("key")

#: Seconds between ``tick()`` calls of a partition taking writes (interval
#: fsync, time rolls, retention): a fraction of the default 1 s fsync interval.
TICK_SECONDS: Final = 0.2
#: Longest an idle partition sleeps before it looks again whether its
#: housekeeping is due (``PartitionLog.housekeeping_delay``; this bounds a
#: wall clock step): waking every TICK_SECONDS cost an idle broker of 64
#: partitions ~3 % of a core.
IDLE_TICK_SECONDS: Final = 1.0
#: A replicated partition's refusals of a whole round that a client retries
#: (broky.client.cluster): the refused producers' later runs are held back
#: until the refused ones come again (broky.durable.producers).
HOLDING_REFUSALS: Final = frozenset({ErrorCode.NOT_LEADER, ErrorCode.NOT_ENOUGH_REPLICAS})

#: A request run by the owner on its thread; gets the log, returns anything.
LogRequest = Callable[[PartitionLog], Any]


def located_chunk(run: Run, partition: int, base_offset: int) -> bytes:
    """The chunk of ``run`` as stored from ``base_offset`` of ``partition``:
    what Deliver and Fetched carry for durable topics."""
    return durable_chunk(run, run.ts_broker, partition, base_offset)


class PartitionOwner:
    """The one task allowed to touch a partition log (see the module docstring)."""

    def __init__(
        self, store: DurableStore, topic: TopicPolicy, partition: int, partition_log: PartitionLog
    ) -> None:
        self.store = store
        self.topic = topic
        self.partition = partition
        self._log = partition_log
        self.recovery: RecoveryReport = partition_log.recovery
        #: ``PartitionLog.counters``, copied after each round (``statistics``).
        self._counters = partition_log.counters()
        #: Cached after each round, for ListPartitions without a thread hop.
        self.start_offset = partition_log.start_offset
        self.end_offset = partition_log.end_offset
        #: ``PartitionLog.rewrites``, copied likewise (subscriptions' kept batches).
        self.rewrites = partition_log.rewrites
        #: Why the log refuses writes (a failed fsync), copied after each
        #: round: publishes, retries the dedup window knows included, are
        #: then refused instead of acknowledged (PartitionLog.write_failure).
        self.write_failure: str | None = partition_log.write_failure
        #: The parts queued for the next round (broky.durable.parts): a
        #: frame's runs for this partition come as one.
        self._parts: list[Part] = []
        #: Message bytes of the queued parts (what they add to ``pending_bytes``).
        self._queued_bytes = 0
        #: The idempotent producers' runs appended here (broky.durable.producers).
        self.producers = ProducerWindow()
        self._requests: list[tuple[LogRequest, Callable[[Any], None]]] = []
        #: Whether a round has the log in a thread, or a borrower has it
        #: (``borrow``); ``_freed`` is set (and replaced) as either ends.
        self._in_round = False
        self._lent = False
        self._freed = trio.Event()
        self._wake = trio.Event()
        self._fsync_always = topic.log.fsync is FsyncPolicy.ALWAYS
        #: For the round's thread to reach the trio thread (set by ``run``).
        self._trio_token: trio.lowlevel.TrioToken | None = None
        #: Told the new end offset after each round that appended (the
        #: partition's durable subscriptions, broky.subscriptions.partition).
        self.on_append: Callable[[int], None] | None = None
        #: Set for a partition of a replicated topic (broky.replication):
        #: publishes are then taken only as its leader, fsynced whatever the
        #: policy (a replica counts only for fsynced data), and acked and
        #: delivered at the high watermark.
        self.replica: ReplicaGate | None = None

    @property
    def statistics(self) -> LogStatistics:
        """The log's counters as of the last round (metrics read them)."""
        return LogStatistics(*self._counters)

    @property
    def readable_end(self) -> int:
        """Readers (replays, Fetch) stop here: the high watermark of a
        replicated partition, so no one reads what a failover can take back."""
        replica = self.replica
        return self.end_offset if replica is None else min(replica.high_watermark, self.end_offset)

    def append(
        self,
        run: Run,
        ticket: AckTicket | None,
        acks: AckQueue | None,
        run_index: int,
        ts_broker: int | None = None,
        identity: Identity | None = None,
    ) -> None:
        """Queue one run for the next round (never waits), to be stored with
        ``ts_broker`` (default: the run's own); ``identity`` makes it
        idempotent (stored once whatever the number of retries)."""
        stamp = run.ts_broker if ts_broker is None else ts_broker
        producer, sequence = identity or (0, 0)
        part = Part(stamp, ticket, acks, producer)
        part.add(run, run_index, sequence)
        self.append_part(part)

    def append_part(self, part: Part) -> None:
        """Queue a part (a frame's runs for this partition) for the next
        round, never waiting; its ticket, if any, counts it as pending."""
        nbytes = part.nbytes
        self._parts.append(part)
        self._queued_bytes += nbytes
        store = self.store
        store.pending_bytes += nbytes
        store.pending_runs += len(part.runs)
        wake = self._wake
        if not wake.is_set():
            wake.set()

    def recover_producers(self, partition_log: PartitionLog) -> None:
        """Rebuild the producers' window from the log tail (blocking: at open)."""
        self.reload_producers(partition_log.producer_runs(RECOVERY_TAIL_BYTES))

    def reload_producers(self, runs: Iterable[tuple[int, int, int, int]]) -> None:
        """Start the producers' window afresh from ``runs`` (producer,
        sequence, count, offset) read off the log tail: at open, and when a
        replica takes the lead (broky.replication.service), so that it knows
        the runs it replicated as a follower and none a truncation removed,
        and a producer retrying after the failover is not stored twice."""
        previous, window = self.producers, ProducerWindow()
        self.producers = window
        for producer, sequence, count, offset in runs:
            if window.check(producer, sequence, count) is None:
                window.record(producer, sequence, count, offset)
        window.keep_refused(previous)

    def submit(self, request: LogRequest, done: Callable[[Any], None]) -> None:
        """Run ``request(log)`` in the next round; ``done`` gets its result or
        the exception it raised, on the trio thread."""
        self._requests.append((request, done))
        self._wake.set()

    async def call(self, request: LogRequest) -> Any:
        """``submit`` and wait: the result, or the exception re-raised."""
        finished = trio.Event()
        box: list[Any] = []

        def done(result: Any) -> None:
            box.append(result)
            finished.set()

        self.submit(request, done)
        await finished.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    async def borrow(self) -> PartitionLog:
        """The log, lent between two rounds until ``give_back``: for one
        thread call that works on several partitions' logs (a follower
        appends and fsyncs all that one leader's answer brought at once,
        broky.replication.node_link) where ``call`` would cost a thread
        hand-off per partition. Taken at once, without waking the owner or a
        checkpoint, when no round has it (an idle follower's owner has
        none); no round starts until it is back. The borrower calls
        ``refresh`` in its thread after changing the log. A borrower of
        several takes them in one order (the partitions' keys), so two never
        wait on each other. No context manager: a link borrows every round,
        and an async generator's with an ``AsyncExitStack`` per round cost
        ~3-5 % of a follower's GIL-held time."""
        while self._in_round or self._lent:
            await self._freed.wait()
        self._lent = True
        return self._log

    def give_back(self) -> None:
        """End ``borrow``: rounds may run again."""
        self._lent = False
        self._free()

    def _free(self) -> None:
        self._freed.set()
        self._freed = trio.Event()

    async def run(self) -> None:
        """Serve rounds until cancelled; a round in a thread is not interrupted."""
        self._trio_token = trio.lowlevel.current_trio_token()
        next_tick = time.monotonic()
        while True:
            if not (self._parts or self._requests):
                with trio.move_on_after(max(0.0, next_tick - time.monotonic())):
                    await self._wake.wait()
            while self._lent:
                await self._freed.wait()
            self._wake = trio.Event()
            parts, self._parts = self._parts, []
            nbytes, self._queued_bytes = self._queued_bytes, 0
            requests, self._requests = self._requests, []
            tick = time.monotonic() >= next_tick
            if not (tick or parts or requests):
                continue
            if tick:
                # The log is ours here (no round, not lent): asked on the
                # loop, a tick with nothing to do costs no thread hand-off.
                delay = self._log.housekeeping_delay()
                tick = delay == 0.0
                wait = IDLE_TICK_SECONDS if delay is None else delay
                next_tick = time.monotonic() + min(max(wait, TICK_SECONDS), IDLE_TICK_SECONDS)
                if not (tick or parts or requests):
                    continue
            if parts or requests:
                # Written data may need an interval fsync: tick soon.
                next_tick = min(next_tick, time.monotonic() + TICK_SECONDS)
            refusal = self.replica.refusal() if parts and self.replica is not None else None
            if refusal is not None and refusal[0] in HOLDING_REFUSALS:
                self._hold_back(parts)
            if refusal is None and parts and self.write_failure is not None:
                refusal = (ErrorCode.STORAGE_FAILURE, self.write_failure)
            plan: RoundPlan | None = None
            if refusal is None and parts:
                plan = RoundPlan(self.producers, self.end_offset, parts)
                parts = plan.parts
                nbytes -= plan.answered_bytes
            runs, stamps, producers, messages = round_columns(parts)
            rest = [] if refusal else runs
            # Checked per round, on this thread: once a follower's
            # truncation is queued, no client run can land after it.
            # No await from the check of ``_lent`` above to here: the log is ours.
            self._in_round = True
            try:
                appended: int | StorageError | OSError | None = None
                if (
                    rest
                    and not (self._fsync_always or self.replica is not None)
                    and self._log.append_is_quick(nbytes, messages, len(rest))
                ):
                    # A round with no fsync to wait for (``fsync = "never"``)
                    # needs no thread when its append is one ``write()``: a
                    # hand-off costs more CPU than such an append. With an
                    # fsync to hand off anyway, appending here did not pay
                    # (the write no longer overlaps the event loop's work).
                    appended = self._append(rest, stamps, producers)
                    rest = []
                hop = bool(rest or requests or tick or self._must_sync(appended))
                if hop:
                    outcome, results = await run_in_thread(
                        partial(self._round, rest, stamps, producers, requests, tick, appended),
                        started=isinstance(appended, int),
                    )
                else:  # nothing to fsync, ask or tidy: no thread for this round
                    outcome, results = appended, []
                    self.refresh(self._log)
            finally:
                self._in_round = False
                self._free()
            self._finish(parts, runs, stamps, refusal or outcome, nbytes, producers)
            if plan is not None and plan.answered:
                self._answer(plan, outcome)
            for (_, done), result in zip(requests, results, strict=True):
                done(result)
            # A cancellation the thread call did not take (``started``) is
            # raised here; a round without a thread yields here.
            if hop:
                await trio.lowlevel.checkpoint_if_cancelled()
            else:
                await trio.lowlevel.checkpoint()

    def _hold_back(self, parts: list[Part]) -> None:
        """The round was refused retriably: each producer's later runs wait
        for these to be resent (broky.durable.producers, ``Held``)."""
        for part in parts:
            if part.producer:
                self.producers.refused(part.producer, part.sequences)

    def _must_sync(self, appended: int | StorageError | OSError | None) -> bool:
        """Whether a round that appended (``appended``: its first offset) is
        fsynced before it settles (a replica counts only for fsynced data)."""
        return isinstance(appended, int) and (self._fsync_always or self.replica is not None)

    def _append(
        self, runs: list[Run], stamps: list[int], producers: list[Identity] | None
    ) -> int | StorageError | OSError:
        """Append the round's runs (one append: as few batches as fit, group
        commit for the disk and for the format); the first offset or the
        error. In the round's thread, or on the event loop for a round that
        needs no fsync (``run``)."""
        partition_log = self._log
        try:
            first = partition_log.append(runs, stamps, producers).first_offset
        except (StorageError, OSError) as exc:
            log.error("append to %s failed: %s", partition_log.directory, exc)
            return exc
        if self.replica is not None and self._trio_token is not None:
            # In the thread (a replicated round is never appended on the
            # loop): followers fetch the round while we fsync it.
            self._trio_token.run_sync_soon(self.replica.written, first, runs, stamps, producers)
        return first

    def _round(
        self,
        runs: list[Run],
        stamps: list[int],
        producers: list[Identity] | None,
        requests: list[tuple[LogRequest, Callable[[Any], None]]],
        tick: bool,
        appended: int | StorageError | OSError | None,
    ) -> tuple[int | StorageError | OSError | None, list[Any]]:
        """One round, in a worker thread: the append unless the event loop
        did it (``appended``), the fsync, requests, tick."""
        partition_log = self._log
        outcome = appended
        if runs:
            outcome = self._append(runs, stamps, producers)
        if self._must_sync(outcome):
            try:
                partition_log.sync()
            except (StorageError, OSError) as exc:
                log.error("fsync of %s failed: %s", partition_log.directory, exc)
                outcome = exc
        results: list[Any] = []
        for request, _ in requests:
            try:
                results.append(request(partition_log))
            except (StorageError, OSError) as exc:
                results.append(exc)
        if tick:
            try:
                partition_log.tick()
            except (StorageError, OSError) as exc:
                log.error("housekeeping of %s failed: %s", partition_log.directory, exc)
        self.refresh(partition_log)
        return outcome, results

    def refresh(self, partition_log: PartitionLog) -> None:
        """Copy what the trio thread reads of the log (offsets, statistics,
        a write failure): in the thread, after each round, and by whoever
        borrowed the log (``borrow``) and changed it."""
        self.start_offset = partition_log.start_offset
        self.end_offset = partition_log.end_offset
        self.rewrites = partition_log.rewrites
        self._counters = partition_log.counters()
        self.write_failure = partition_log.write_failure

    def _finish(
        self,
        parts: list[Part],
        runs: list[Run],
        stamps: list[int],
        outcome: int | Exception | tuple[ErrorCode, str] | None,
        nbytes: int,
        producers: list[Identity] | None = None,
    ) -> None:
        """Back on the trio thread: settle the round now, or, for a
        replicated partition, once the high watermark passes it
        (``ReplicaGate.hold``: until then its bytes still count against the
        pending bounds, so a lagging ISR slows publishers down). ``nbytes``:
        the runs' message bytes, counted in ``pending_bytes``."""
        if not runs:
            return
        replica = self.replica
        if replica is not None and isinstance(outcome, int):

            def fail(code: ErrorCode, reason: str) -> None:
                self._settle(parts, runs, stamps, (code, reason), nbytes)

            replica.hold(
                outcome,
                runs,
                stamps,
                partial(self._settle, parts, runs, stamps, outcome, nbytes),
                fail,
                producers,
            )
            return
        self._settle(parts, runs, stamps, outcome, nbytes)

    def _answer(self, plan: RoundPlan, outcome: int | Exception | None) -> None:
        """Answer the runs the round's plan kept out of the append (retries,
        runs out of order: ``RoundPlan.answer``); they leave the bounds."""
        store = self.store
        store.pending_bytes -= plan.answered_bytes
        store.pending_runs -= plan.answered_runs
        store.room_changed()
        where = f"{self.topic.name}/{self.partition}"
        plan.answer(outcome, self.partition, where, self.replica, self.end_offset)

    def _settle(
        self,
        parts: list[Part],
        runs: list[Run],
        stamps: list[int],
        outcome: int | Exception | tuple[ErrorCode, str] | None,
        nbytes: int,
    ) -> None:
        """Fan the appended runs out, release acks (or fail them).

        Fan-out is per run (a chunk and a router entry each); acks are per
        part (broky.durable.parts), one ticket update for all its runs.
        """
        store = self.store
        store.pending_bytes -= nbytes
        store.pending_runs -= len(runs)
        store.room_changed()
        queues: set[AckQueue] = set()
        queue: AckQueue | None
        if not isinstance(outcome, int):
            code, reason = (
                outcome
                if isinstance(outcome, tuple)
                else (
                    ErrorCode.STORAGE_FAILURE,
                    f"could not store {self.topic.name}/{self.partition}: {outcome}",
                )
            )
            for part in parts:
                queue = part.fail(reason, code)
                if queue is not None:
                    queues.add(queue)
        else:
            offset = outcome
            partition = self.partition
            router = store.router
            for part in parts:
                queue = part.settle(partition, offset)
                if queue is not None:
                    queues.add(queue)
                offset += part.messages
            keys = list(map(_KEY, runs))
            wanted = router.wanted(keys)
            if wanted is None:  # no live subscriber: no chunk to build
                router.count_unrouted(runs)
            else:
                self._fan_out(parts, wanted, outcome)
            if self.on_append is not None:
                self.on_append(offset)
        for queue in queues:
            queue.release()

    def _fan_out(self, parts: list[Part], wanted: list[bool], offset: int) -> None:
        """Publish the stored runs of ``parts`` from ``offset`` that some
        subscription wants (their chunks), count the others as unrouted."""
        partition = self.partition
        encoded: list[EncodedRun] = []
        unrouted: list[Run] = []
        position = 0
        for part in parts:
            stamp = part.stamp
            for run in part.runs:
                count = run.count
                if wanted[position]:
                    chunk = durable_chunk(run, stamp, partition, offset)
                    encoded.append(DurableEncodedRun(run.key, count, chunk, self, offset))
                else:
                    unrouted.append(run)
                offset += count
                position += 1
        router = self.store.router
        router.publish(encoded)
        if unrouted:
            router.count_unrouted(unrouted)

    def close(self) -> None:
        """Sync and close the log (the owner task has stopped)."""
        self._log.close()
