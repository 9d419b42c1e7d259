"""Forwarded acked publishes of one owner channel, as plain bookkeeping.

Sans-IO: runs go in (``add``), Publish frames come out (``take_frame``),
owner acks and errors go in (``acked``, ``refused``) and complete the client
tickets; nothing here awaits or touches a socket. The channel
(broky.durable.forwarding) owns one and does the I/O.

Request ids: the owner answers a connection's acked frames in order,
counting them from 1, so the n-th PublishAck answers the n-th outstanding
frame; its ``sequence`` is checked, and a new connection starts from 1 again
(``fail_all`` resets the count).

Joining: consecutive pieces of one client run bound for this owner
(``partition_run`` splits a run whose messages land in several partitions)
travel as one run, which the owner splits again; its ack may then have fewer
entries than there were pieces (pieces that were apart here meet there), and
the ticket is settled for the rest. Pieces of an idempotent producer's run
are never joined: each carries the sequence of its own first message, and
pieces that were apart in the run have sequences that are apart too.

Producers: a frame holding any idempotent producer's run carries each run's
producer and sequence (``run_producers``, ``run_sequences``; 0 for the
others), so the owner deduplicates exactly as for a client's own frame.

Outcomes per run: a frame gathers runs of several clients and producers, so
the owner answers it run by run (broky.durable.acks, ``per_run``): the ack
holds the stored runs' offsets and the refused runs' own codes
(``PublishAck.refused_runs``), and ``acked`` hands each to its run's ticket.
One producer's OutOfOrderSequence, or one partition's failed fsync, fails
only the clients whose runs it concerns; a client never hears an error for
a run that was stored. A frame-level Error (``refused``) still fails every
run of the frame: the owner stored none of it.
"""

from __future__ import annotations

from collections import deque
from typing import Final

import attrs

from broky.durable.acks import AckQueue, AckTicket
from broky.durable.producers import Identity
from broky.protocol.chunks import encode_run_chunk, forward_chunk, runs_frame_parts
from broky.protocol.codec import RUN_CHUNK_OVERHEAD
from broky.protocol.constants import BodyType, ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import PublishAck, Run
from broky.protocol.producer_frames import producer_frame_parts

#: The channel stream that carries forwarded publishes (others: requests).
PUBLISH_STREAM: Final = 1


@attrs.define(slots=True, eq=False)
class _Part:
    """One run of a forwarded frame: whose ticket it completes, and how many
    pieces of that client run it joins."""

    ticket: AckTicket | None
    acks: AckQueue | None
    run_index: int
    pieces: int = 1

    def settle(self, reason: str, code: ErrorCode, answered: int = 0) -> AckQueue | None:
        """Fail the pieces not ``answered`` yet; the queue to release (None:
        not acked). The client run fails (its ticket's ``failed``) whatever
        was stored of its other pieces: a client's frame is acked whole."""
        if self.ticket is None or self.acks is None:
            return None
        self.ticket.remaining -= self.pieces - answered - 1
        self.ticket.failed(reason, code, (self.run_index,))
        return self.acks


@attrs.define(slots=True, eq=False)
class _Forwarded:
    """One forwarded Publish frame awaiting its ack."""

    sequence: int
    parts: list[_Part]
    nbytes: int
    sent_at: float


class ForwardedPublishes:
    """Gather runs into frames and match the owner's acks to client tickets."""

    def __init__(self, frame_bytes: int) -> None:
        #: Gathered runs past this size make a frame at once (``add``).
        self.frame_bytes = frame_bytes
        self._chunks: list[bytes] = []
        #: Each gathered chunk's producer identity ((0, 0): none); kept
        #: only once an idempotent run was gathered (``_idempotent``).
        self._identities: list[Identity] = []
        self._idempotent = False
        self._parts: list[_Part] = []
        #: The pieces of the last part, not yet joined into its chunk.
        self._group: list[Run] = []
        self._gathered_bytes = 0
        self._sequence = 0
        self._outstanding: deque[_Forwarded] = deque()
        #: Bytes of frames sent and not yet answered (the pair's credit use).
        self.in_flight_bytes = 0
        #: Messages forwarded and acked, for statistics.
        self.acked_messages = 0

    @property
    def oldest_sent_at(self) -> float | None:
        """When the oldest unanswered frame left (None: none)."""
        return self._outstanding[0].sent_at if self._outstanding else None

    def add(
        self,
        run: Run,
        ticket: AckTicket | None,
        acks: AckQueue | None,
        index: int,
        identity: Identity | None = None,
    ) -> bool:
        """Gather a run (run ``index`` of a client frame, of an idempotent
        producer with ``identity``); True once the gathered runs should leave
        as a frame (``take_frame``)."""
        parts = self._parts
        last = parts[-1] if parts else None
        if identity is not None and not self._idempotent:
            self._idempotent = True
            self._close_group()
            self._identities = [(0, 0)] * len(self._chunks)
        if (
            identity is None
            and last is not None
            and self._group
            and last.ticket is ticket
            and last.acks is acks
            and last.run_index == index
        ):
            self._group.append(run)
            last.pieces += 1
        else:
            self._close_group()
            self._group = [run]
            parts.append(_Part(ticket, acks, index))
            if self._idempotent:
                self._identities.append(identity or (0, 0))
        self._gathered_bytes += len(run.messages) + len(run.sizes) + RUN_CHUNK_OVERHEAD
        return self._gathered_bytes >= self.frame_bytes

    def _close_group(self) -> None:
        group = self._group
        if not group:
            return
        self._group = []
        if len(group) == 1:
            self._chunks.append(forward_chunk(group[0]))  # as the client sent it
            return
        sizes = b"".join(piece.sizes for piece in group)
        messages = b"".join(piece.messages for piece in group)
        self._chunks.append(encode_run_chunk(group[0].key, 0, sizes, messages))

    def take_frame(self, now: float) -> bytes | None:
        """The gathered runs as one acked Publish frame, now outstanding."""
        self._close_group()
        if not self._chunks:
            return None
        chunks, self._chunks = self._chunks, []
        parts, self._parts = self._parts, []
        self._gathered_bytes = 0
        if self._idempotent:
            identities, self._identities = self._identities, []
            self._idempotent = False
            frame = producer_frame_parts(
                PUBLISH_STREAM,
                chunks,
                run_producers=[producer for producer, _ in identities],
                run_sequences=[sequence for _, sequence in identities],
            )
        else:
            frame = runs_frame_parts(BodyType.PUBLISH, PUBLISH_STREAM, chunks, ack=True)
        data = b"".join(frame)
        self._sequence += 1
        self._outstanding.append(_Forwarded(self._sequence, parts, len(data), now))
        self.in_flight_bytes += len(data)
        return data

    def _next(self, sequence: int) -> _Forwarded:
        if not self._outstanding:
            raise RemoteProtocolError(
                "the owner acknowledged a publish that was not forwarded", ErrorCode.INTERNAL
            )
        forwarded = self._outstanding[0]
        if sequence and sequence != forwarded.sequence:
            # Left outstanding: the channel closes and ``fail_all`` fails it.
            raise RemoteProtocolError(
                f"ack {sequence} answers forwarded publish {forwarded.sequence}",
                ErrorCode.INTERNAL,
            )
        self._outstanding.popleft()
        self.in_flight_bytes -= forwarded.nbytes
        return forwarded

    def acked(self, frame: PublishAck, owner: int) -> None:
        """The owner's ack of the oldest outstanding frame: complete its
        tickets, each run with its own outcome (module docstring)."""
        width = len(self._outstanding[0].parts) if self._outstanding else 0
        if any(index >= width for index in (*frame.runs, *frame.refused_runs)):
            # Left outstanding: the channel closes and ``fail_all`` fails it.
            raise RemoteProtocolError(
                f"ack {frame.sequence} names a run the forwarded frame does not have",
                ErrorCode.INTERNAL,
            )
        parts = self._next(frame.sequence).parts
        queues: set[AckQueue] = set()
        entries = [0] * len(parts)
        refusals: dict[int, tuple[ErrorCode, str]] = {}
        for index, partition, first, last in zip(
            frame.runs, frame.partitions, frame.first_offsets, frame.last_offsets, strict=True
        ):
            part = parts[index]
            entries[index] += 1
            self.acked_messages += last - first + 1
            if part.ticket is not None and part.acks is not None:
                part.ticket.done(part.run_index, partition, first, last)
                queues.add(part.acks)
        for index, code, reason in zip(
            frame.refused_runs, frame.refused_codes, frame.refused_reasons, strict=True
        ):
            refusals.setdefault(index, (code, reason))  # the first refused piece's
        missing = (ErrorCode.STORAGE_FAILURE, f"worker {owner} did not acknowledge a forwarded run")
        for index, (part, count) in enumerate(zip(parts, entries, strict=True)):
            refusal = refusals.get(index) or (None if count else missing)
            if refusal is not None:
                code, reason = refusal
                queue = part.settle(reason, code, count)
                if queue is not None:
                    queues.add(queue)
            elif count < part.pieces and part.ticket is not None:
                part.ticket.remaining -= part.pieces - count  # pieces joined by the owner
        for queue in queues:
            queue.release()

    def refused(self, code: ErrorCode, message: str) -> None:
        """The owner answered the oldest outstanding frame with an error."""
        self._settle([self._next(0)], code, message)

    def fail_all(self, code: ErrorCode, reason: str) -> int:
        """Fail every outstanding and gathered frame (the connection is gone);
        the number of frames that were awaiting an answer."""
        outstanding, self._outstanding = list(self._outstanding), deque()
        gathered = _Forwarded(0, self._parts, 0, 0.0)
        self._sequence = 0  # the owner counts a new connection's acks from 1
        self._chunks, self._parts, self._group = [], [], []
        self._identities, self._idempotent = [], False
        self._gathered_bytes = 0
        self.in_flight_bytes = 0
        self._settle([*outstanding, gathered], code, reason)
        return len(outstanding)

    @staticmethod
    def _settle(frames: list[_Forwarded], code: ErrorCode, reason: str) -> None:
        queues = {part.settle(reason, code) for forwarded in frames for part in forwarded.parts}
        for queue in queues:
            if queue is not None:
                queue.release()
