"""The protocol state machine, sans-IO (the h11 pattern): bytes in, frames out.

Rules, in order of the conversation:

========== ================================ ==================================
state      client receives                  server receives
========== ================================ ==================================
PREAMBLE   8-byte preamble                  8-byte preamble
HANDSHAKE  Welcome (or Error)               Hello
OPEN       Deliver Subscribed Notice Ping   Publish Subscribe Unsubscribe Flow
           Pong Error PublishAck            Ping Pong Error ListPartitions
           Partitions Fetched               Fetch
CLOSED     nothing                          nothing
========== ================================ ==================================

Anything else raises RemoteProtocolError and moves to CLOSED. The user of this
class writes ``initiate()`` first, then whatever ``send``-side bytes it
encodes; the machine only polices what it receives.
"""

from __future__ import annotations

import enum
from typing import Final, cast

from broky.protocol.codec import decode_frame, decode_located
from broky.protocol.constants import PREAMBLE_SIZE, ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.forward import receive_forwarding
from broky.protocol.frames import (
    Consume,
    DeletedSubscription,
    DeleteSubscription,
    Deliver,
    Error,
    Fetch,
    Fetched,
    Flow,
    ForwardPublish,
    Frame,
    Hello,
    ListPartitions,
    LocatedDeliver,
    Notice,
    Partitions,
    Ping,
    Pong,
    Publish,
    PublishAck,
    Received,
    Redelivered,
    Settle,
    Settled,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Welcome,
)
from broky.protocol.framing import FrameReader, encode_preamble, parse_preamble


class Role(enum.Enum):
    """Which end of the connection this machine runs."""

    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    """Where the conversation is."""

    PREAMBLE = "preamble"
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


_OPEN_FRAMES: Final[dict[Role, tuple[type, ...]]] = {
    Role.CLIENT: (
        Deliver,
        LocatedDeliver,
        Subscribed,
        Notice,
        Ping,
        Pong,
        Error,
        PublishAck,
        Partitions,
        Fetched,
        ForwardPublish,
        Redelivered,
        Settled,
        DeletedSubscription,
    ),
    Role.SERVER: (
        Publish,
        Subscribe,
        Unsubscribe,
        Flow,
        Ping,
        Pong,
        Error,
        ListPartitions,
        Fetch,
        ForwardPublish,
        Consume,
        Settle,
        DeleteSubscription,
    ),
}
_HANDSHAKE_FRAME: Final[dict[Role, type]] = {Role.CLIENT: Welcome, Role.SERVER: Hello}


class ProtocolMachine:
    """Decode and police one side's incoming bytes."""

    def __init__(self, role: Role, max_frame_bytes: int) -> None:
        self.role = role
        self.state = State.PREAMBLE
        self.reader = FrameReader(max_frame_bytes)
        self._preamble = b""
        self._allowed = _OPEN_FRAMES[role]
        #: See ``receive_forwarding`` (0: no bound).
        self.max_message_bytes = 0

    @property
    def received_preamble(self) -> bytes:
        """The peer's first bytes, up to the preamble's 8 (to answer a foreign peer)."""
        return self._preamble

    def initiate(self) -> bytes:
        """The bytes this side sends first (its preamble)."""
        return encode_preamble()

    def receive_data(self, data: bytes | bytearray) -> list[Frame]:
        """Feed received bytes; return the frames they complete, in order.

        Raises RemoteProtocolError (and moves to CLOSED) on any violation;
        frames decoded before the bad one are lost with the connection.
        """
        return cast(list[Frame], self._receive(data, forward=False))

    def receive_deliveries(self, data: bytes | bytearray) -> list[Frame | LocatedDeliver]:
        """``receive_data`` for the client's reader: a durable Deliver whose
        runs are all located chunks comes out as a ``LocatedDeliver``
        (``codec.decode_located``), its runs left in the frame."""
        return cast(list[Frame | LocatedDeliver], self._receive(data, forward=False, located=True))

    def receive_forwarding(self, data: bytes | bytearray) -> list[Received]:
        """``receive_data`` for a broker that routes Publish frames as they
        came: unacked, unstamped Publish frames whose runs are all laid out
        as chunks, none with more than ``max_message_bytes`` of messages,
        come out as ForwardPublish, consecutive ones of one stream merged
        into one (their order kept). The broker then pays per frame and per
        run only for what forwarding needs, not for decoding each run.

        On the client side (a router's link to another router), Deliver
        frames are read the same way: the runs another router forwards come
        out as ForwardPublish on the Deliver's stream."""
        return self._receive(data, forward=True)

    def _receive(
        self, data: bytes | bytearray, *, forward: bool, located: bool = False
    ) -> list[Received]:
        if self.state is State.CLOSED:
            return []
        try:
            if self.state is State.PREAMBLE:
                need = PREAMBLE_SIZE - len(self._preamble)
                self._preamble += data[:need]
                data = data[need:]
                if len(self._preamble) < PREAMBLE_SIZE:
                    return []
                parse_preamble(self._preamble)
                self.state = State.HANDSHAKE
                if not data:
                    return []
            frames: list[Received]
            if forward and self.state is State.OPEN:
                frames = receive_forwarding(
                    self.reader,
                    data,
                    self.max_message_bytes,
                    decode_frame,
                    deliveries=self.role is Role.CLIENT,
                )
            else:
                decode = decode_located if located else decode_frame
                frames = [decode(view) for view in self.reader.feed(data)]
            if self.state is State.HANDSHAKE and frames:
                self._check_handshake(frames[0])
                start = 1
            else:
                start = 0
            allowed = self._allowed
            for frame in frames[start:]:
                if not isinstance(frame, allowed):
                    raise RemoteProtocolError(
                        f"{type(frame).__name__} frames are not sent to a {self.role.value}",
                        ErrorCode.MALFORMED_FRAME,
                    )
        except RemoteProtocolError:
            self.state = State.CLOSED
            raise
        return frames

    @property
    def partial_frame_bytes(self) -> int:
        """Bytes received of a frame that is not complete yet (0: none started)."""
        return self.reader.buffered_bytes

    def close(self) -> None:
        """Stop decoding and free the buffered bytes of an unfinished frame."""
        self.state = State.CLOSED
        self.reader.clear()

    def _check_handshake(self, frame: Received) -> None:
        expected = _HANDSHAKE_FRAME[self.role]
        if isinstance(frame, Error) and self.role is Role.CLIENT:
            self.state = State.OPEN
            return
        if not isinstance(frame, expected):
            raise RemoteProtocolError(
                f"expected {expected.__name__} as the first frame, got {type(frame).__name__}",
                ErrorCode.MALFORMED_FRAME,
            )
        self.state = State.OPEN
