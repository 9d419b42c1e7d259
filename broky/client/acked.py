"""The client's acked Publish frames: numbering, answers, and what to resend.

Sans-IO bookkeeping owned by the publisher (``publishing.py``): frames go in
as they are sent, the broker's answers (a PublishAck or an Error in its
place, always in frame order) come in, and it says which frames to send
again. Nothing here awaits or touches the socket.

Idempotence (``docs/protocol.md``): the client draws a random 64-bit
producer id once and numbers its acked messages from 1; every acked frame
carries the id and the sequence of its first message, and keeps them when
it is sent again, so the partitions' owners store it once whatever the
number of sends. A frame answered with the retriable ``OwnerUnavailable``,
or left unanswered by a lost connection, is resent as it was, oldest first,
once every frame in flight has been answered (so that nothing of the
producer's is stored past a frame still to be resent). Without idempotence
(``producer_id`` 0) a retriable error is reported like any other. A frame
refused with ``NotLeader`` or ``NotEnoughReplicas`` makes the partition hold
the producer's later frames back (``SequenceGap``) until it is resent, which
this client does not do: the producer continues under a new id.

A batch's frames (``BatchAnswers``, from ``Publisher.publish_batch``) are
answered to the batch instead, never resent here: their caller
(broky.client.cluster) retries them itself, elsewhere if need be.
"""

from __future__ import annotations

import secrets
from collections import deque
from typing import Final

import attrs

from broky.client.acked_runs import AckedRuns
from broky.client.errors import AckTimeout, BrokyError, ConnectionClosed
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import PublishAck

#: Messages a producer keeps unacknowledged before ``publish`` waits for
#: acks: half the window each partition remembers per producer
#: (``broky.durable.producers.WINDOW_SEQUENCES``), the other half leaving
#: room for the frame being filled, so every resend falls inside the window.
MAX_UNACKED_MESSAGES: Final = 32_768
#: Errors in an acked frame's place that a resend may cure.
RETRIABLE: Final = frozenset({ErrorCode.OWNER_UNAVAILABLE})
#: Refusals after which the partition holds the producer's later frames
#: back until the refused one is resent (broky.durable.producers).
HOLDING: Final = frozenset({ErrorCode.NOT_LEADER, ErrorCode.NOT_ENOUGH_REPLICAS})
#: Keys an AckTimeout message names (all are in ``AckTimeout.keys``).
_SHOWN_KEYS: Final = 5


@attrs.define(slots=True, eq=False)
class BatchAnswers:
    """The answers to one batch's acked frames (``Publisher.publish_batch``):
    complete once each of its ``frames`` is answered or lost."""

    frames: int = 0
    answered: int = 0
    #: Each acked frame's keys per run and its PublishAck, in frame order.
    acks: list[tuple[list[str], PublishAck]] = attrs.field(factory=list)
    #: The first error in place of one of its frames (None: none yet).
    error: BrokyError | None = None

    @property
    def complete(self) -> bool:
        return self.answered >= self.frames

    def answer(self, keys: list[str], ack: PublishAck | BrokyError) -> None:
        self.answered += 1
        if isinstance(ack, BrokyError):
            self.error = self.error or ack
        else:
            self.acks.append((keys, ack))


@attrs.define(slots=True, eq=False)
class SentFrame:
    """One acked frame: its bytes as sent (resent unchanged), the key of
    each of its runs, and its messages' first sequence and count."""

    data: bytes
    keys: list[str]
    first_sequence: int
    count: int
    #: When it was last queued for sending (``AckedFrames.sent``).
    sent_at: float = 0.0
    #: The batch it belongs to (None: answered through ``take_acked``).
    batch: BatchAnswers | None = None


class AckedFrames:
    """The acked frames of one producer (module docstring)."""

    def __init__(self, idempotent: bool = True) -> None:
        #: 0 when not idempotent.
        self.producer_id = (secrets.randbits(64) or 1) if idempotent else 0
        self.next_sequence = 1
        self._unanswered: deque[SentFrame] = deque()
        self._resend: list[SentFrame] = []
        #: Answers since the last ``take_acked``: each frame's key per run
        #: and its PublishAck, kept as columns (broky.client.acked_runs).
        self._acked: list[tuple[list[str], PublishAck]] = []
        #: The first non-retriable error since the last ``take_error``.
        self._error: BrokyError | None = None
        #: The last retriable error, reported if the retries run out.
        self.last_retriable: BrokyError | None = None
        self.unacked_messages = 0
        #: The batch whose frames are being closed (``Publisher.publish_batch``).
        self.batch: BatchAnswers | None = None

    def number(self, count: int) -> int:
        """The first sequence for a new frame of ``count`` messages."""
        first = self.next_sequence
        self.next_sequence += count
        return first

    def sent(self, frame: SentFrame, now: float) -> None:
        """``frame`` was queued for sending (first time or again) at ``now``."""
        frame.sent_at = now
        self._unanswered.append(frame)

    @property
    def oldest_sent_at(self) -> float | None:
        """When the oldest frame in flight was queued (None: none in flight)."""
        return self._unanswered[0].sent_at if self._unanswered else None

    def timed_out(self, seconds: float) -> AckTimeout:
        """The error for frames still unanswered ``seconds`` after the
        oldest was sent; they stay in flight (``AckTimeout``)."""
        frames = list(self._unanswered)
        keys = tuple(dict.fromkeys(key for frame in frames for key in frame.keys))
        shown = ", ".join(keys[:_SHOWN_KEYS]) + (", ..." if len(keys) > _SHOWN_KEYS else "")
        return AckTimeout(
            f"{len(frames)} acked frame(s) ({sum(frame.count for frame in frames)} messages, "
            f"keys {shown}) unanswered for {seconds} s on an open connection: the partitions' "
            "owner is stalled (a stuck fsync?) or stopped. They stay in flight: call "
            "flush_acks again to keep waiting, or close the client",
            len(frames),
            keys,
        )

    def opened(self, count: int) -> None:
        """A new frame of ``count`` messages (counts until acked or failed)."""
        self.unacked_messages += count

    @property
    def in_flight(self) -> bool:
        """Some frame was sent and not answered yet."""
        return bool(self._unanswered)

    @property
    def pending(self) -> bool:
        """Some frame is in flight or waiting to be resent."""
        return bool(self._unanswered or self._resend)

    def acked(self, ack: PublishAck) -> None:
        """The oldest frame in flight was acknowledged."""
        if not self._unanswered:
            return  # a broker bug must not kill the reader
        frame = self._unanswered.popleft()
        self.unacked_messages -= frame.count
        if frame.batch is not None:
            frame.batch.answer(frame.keys, ack)
            return
        self._acked.append((frame.keys, ack))  # columns checked equal by the decoder

    def failed(self, code: ErrorCode, message: str) -> None:
        """The oldest frame in flight was answered with an error."""
        if not self._unanswered:
            return
        frame = self._unanswered.popleft()
        error = BrokyError(code, message)
        if frame.batch is not None:
            self.unacked_messages -= frame.count
            frame.batch.answer(frame.keys, error)
            return
        if self.producer_id and code in RETRIABLE:
            self._resend.append(frame)
            self.last_retriable = error
            return
        self.unacked_messages -= frame.count
        if self._error is None:
            self._error = error
        if self.producer_id and code in HOLDING:
            self.producer_id = secrets.randbits(64) or 1
            self.next_sequence = 1

    def connection_lost(self) -> None:
        """Every frame in flight is unanswered for good: resend them all
        (idempotent), or count them as failed."""
        lost = [frame for frame in self._unanswered if frame.batch is None]
        for frame in self._unanswered:
            if frame.batch is not None:
                self.unacked_messages -= frame.count
                frame.batch.answer(frame.keys, ConnectionClosed("the connection was lost"))
        self._unanswered.clear()
        if self.producer_id:
            self._resend.extend(lost)
            return
        for frame in lost:
            self.unacked_messages -= frame.count

    def take_resend(self) -> list[SentFrame]:
        """The frames to send again, oldest first (call with none in flight)."""
        frames = sorted(self._resend, key=lambda frame: frame.first_sequence)
        self._resend = []
        return frames

    def abandon(self) -> int:
        """Give up the frames still to resend (retries ran out); their messages.

        The producer starts over under a new id: the broker holds back the
        old one's later frames until the abandoned ones are resent, which
        will not happen now.
        """
        lost = sum(frame.count for frame in self._resend) + sum(
            frame.count for frame in self._unanswered
        )
        self._resend = []
        self._unanswered.clear()
        self.unacked_messages = 0
        if self.producer_id:
            self.producer_id = secrets.randbits(64) or 1
            self.next_sequence = 1
        return lost

    def take_acked(self) -> AckedRuns:
        acked, self._acked = self._acked, []
        return AckedRuns(acked)

    def take_error(self) -> BrokyError | None:
        error, self._error = self._error, None
        return error
