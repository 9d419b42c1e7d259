"""The control frames of a connection's steady state, written without the builder.

Which frames: ``Flow`` (a grant per half window), ``Subscribed`` and
``Unsubscribe``, ``Ping`` and ``Pong`` (liveness), and the consumer's
``Redelivered`` (before a Deliver with redeliveries or of another topic),
``Settle`` (an ack batch) and ``Settled`` (a receipt). Each is a few fields
written by broky.protocol.table_writer in a few microseconds, where
``flatbuffers.Builder`` took 30-100 (the module docstring there says why it
matters). The other control frames (a connection's greeting, a
subscription's setup, errors, deletions) are rare and keep the builder
(broky.protocol.codec, broky.protocol.consumer_codec).
"""

from __future__ import annotations

from broky.protocol.constants import BodyType
from broky.protocol.frames import (
    Flow,
    Frame,
    Ping,
    Pong,
    Redelivered,
    Settle,
    Settled,
    Subscribed,
    Unsubscribe,
)
from broky.protocol.table_writer import control_frame


def write_steady_frame(frame: Frame) -> bytes | None:
    """``frame`` encoded (size-prefixed), if it is one of this module's
    frames; None for any other frame."""
    if isinstance(frame, Flow):
        return control_frame(
            BodyType.FLOW, [(0, "I", frame.stream, 0), (1, "I", frame.credit, 0)], ()
        )
    if isinstance(frame, (Subscribed, Unsubscribe)):
        body_type = BodyType.SUBSCRIBED if isinstance(frame, Subscribed) else BodyType.UNSUBSCRIBE
        return control_frame(body_type, [(0, "I", frame.stream, 0)], ())
    if isinstance(frame, (Ping, Pong)):
        body_type = BodyType.PING if isinstance(frame, Ping) else BodyType.PONG
        return control_frame(body_type, [(0, "Q", frame.nonce, 0)], ())
    return _write_consumer_frame(frame)


def _write_consumer_frame(frame: Frame) -> bytes | None:
    """``Redelivered``, ``Settle`` and ``Settled``, written without the
    builder (broky.protocol.table_writer: a consumer's steady state sends
    them per delivery batch, ack batch and flush); None for other frames."""
    if isinstance(frame, Redelivered):
        return control_frame(
            BodyType.REDELIVERED,
            [(0, "I", frame.stream, 0)],
            [
                (1, "I", frame.partitions),
                (2, "q", frame.offsets),
                (3, "I", frame.counts),
                *([(4, "s", frame.topic.encode())] if frame.topic else []),
            ],
        )
    if isinstance(frame, Settle):
        return control_frame(
            BodyType.SETTLE,
            [
                (0, "I", frame.stream, 0),
                (1, "Q", frame.sequence, 0),
                (2, "B", frame.kind, 0),
                (6, "q", frame.delay_ms, -1),
            ],
            [
                (3, "I", frame.partitions),
                (4, "q", frame.first_offsets),
                (5, "q", frame.last_offsets),
                *([(7, "s", frame.reason.encode())] if frame.reason else []),
                *([(8, "s", frame.topic.encode())] if frame.topic else []),
            ],
        )
    if isinstance(frame, Settled):
        return control_frame(
            BodyType.SETTLED,
            [
                (0, "I", frame.stream, 0),
                (1, "Q", frame.sequence, 0),
                (2, "I", frame.stale, 0),
                (3, "I", frame.unconfirmed, 0),
            ],
            (),
        )
    return None
