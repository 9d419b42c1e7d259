"""The NATS client protocol, sans-IO: just enough to drive JetStream at full speed.

Why our own and not nats-py: the JetStream comparison must measure the
server, not a client library. nats-py's ``js.publish`` awaits each ack
before the next publish (one round trip per message) and its pull
subscriber builds several Python objects per message, so a Python client
would cap JetStream far below what nats-server does. The benchmark instead
pipelines raw ``PUB`` lines with reply subjects and counts the acks as they
come, exactly as it drives Broky (windows of acked publishes), and acks
pulled messages by publishing ``+ACK`` to their reply subjects in batches.

``NatsParser`` turns received bytes into events; ``pub`` encodes a publish.
The protocol (https://docs.nats.io/reference/reference-protocols/nats-protocol):
``INFO {json}``, ``MSG <subject> <sid> [reply] <bytes>``, ``HMSG <subject>
<sid> [reply] <header bytes> <total bytes>``, ``PING``, ``PONG``, ``+OK``,
``-ERR '<text>'``, every control line ending in CRLF, payloads followed by CRLF.
"""

from __future__ import annotations

from typing import Final, NamedTuple

#: Longest control line accepted: NATS's own default (``max_control_line``).
MAX_CONTROL_LINE: Final = 4096


class NatsProtocolError(Exception):
    """The server sent something this parser does not understand."""


class Msg(NamedTuple):
    """A ``MSG`` (or ``HMSG``: ``headers`` holds its raw header block)."""

    subject: bytes
    sid: bytes
    reply: bytes
    payload: bytes
    headers: bytes = b""


class Info(NamedTuple):
    payload: bytes


class Ping(NamedTuple):
    pass


class Pong(NamedTuple):
    pass


class Ok(NamedTuple):
    pass


class Err(NamedTuple):
    text: str


Event = Msg | Info | Ping | Pong | Ok | Err


class NatsParser:
    """Bytes in (``feed``), events out; keeps the partial tail between feeds."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._position = 0

    def feed(self, data: bytes) -> list[Event]:
        """Every whole event in what was received so far."""
        buffer = self._buffer
        buffer += data
        events: list[Event] = []
        position = self._position
        end = len(buffer)
        while position < end:
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                if end - position > MAX_CONTROL_LINE:
                    raise NatsProtocolError("control line too long")
                break
            line = bytes(buffer[position:line_end])
            op, _, rest = line.partition(b" ")
            op = op.upper()
            if op in (b"MSG", b"HMSG"):
                parts = rest.split()
                headered = op == b"HMSG"
                if len(parts) not in ((4, 5) if headered else (3, 4)):
                    raise NatsProtocolError(f"malformed {op.decode()} line: {line!r}")
                total = int(parts[-1])
                header_size = int(parts[-2]) if headered else 0
                reply = parts[2] if len(parts) == (5 if headered else 4) else b""
                body_at = line_end + 2
                if body_at + total + 2 > end:
                    break  # the payload is not all here yet
                if buffer[body_at + total : body_at + total + 2] != b"\r\n":
                    raise NatsProtocolError("payload not followed by CRLF")
                body = bytes(buffer[body_at : body_at + total])
                events.append(
                    Msg(parts[0], parts[1], reply, body[header_size:], body[:header_size])
                )
                position = body_at + total + 2
                continue
            position = line_end + 2
            if op == b"PING":
                events.append(Ping())
            elif op == b"PONG":
                events.append(Pong())
            elif op == b"+OK":
                events.append(Ok())
            elif op == b"-ERR":
                events.append(Err(rest.decode(errors="replace").strip("' ")))
            elif op == b"INFO":
                events.append(Info(rest))
            else:
                raise NatsProtocolError(f"unknown operation {line[:40]!r}")
        if position >= end:
            buffer.clear()
            position = 0
        elif position > 1 << 20:
            del buffer[:position]
            position = 0
        self._position = position
        return events


def pub(subject: bytes, payload: bytes, reply: bytes = b"") -> bytes:
    """One ``PUB`` (with ``reply`` when given)."""
    if reply:
        return b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(payload), payload)
    return b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload)


def sub(subject: bytes, sid: int) -> bytes:
    """One ``SUB``."""
    return b"SUB %s %d\r\n" % (subject, sid)


#: What a client says first: no +OK per operation, headers on (pull
#: requests' status messages arrive as HMSG), no echo of its own publishes.
CONNECT: Final = (
    b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
    b'"echo":false,"lang":"python","version":"broky-bench","protocol":1}\r\nPING\r\n'
)
