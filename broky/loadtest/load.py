"""What the benchmark publishers send: key mixes, frame shapes and timestamps.

A :class:`Load` says how messages are spread over keys and frames; every
target (Broky, the pump, the peers) gets the same message sequence, so a
1,000-key row compares the same work. Publishers pre-encode one period of
that sequence as a few ``sendall`` buffers and cycle them, so the load
generator costs nothing per message and the broker is the bottleneck.

Latency rows put the due time in the payload itself (``<ts:`` + 16 hex
digits + ``>``), where any protocol carries it untouched: subscribers find
the stamps by scanning the bytes they receive, with no per-protocol parser.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Final

import attrs

from broky.protocol.codec import encode_run_chunk, runs_frame_parts
from broky.protocol.constants import BodyType
from broky.protocol.message import encode_message, pack_sizes

#: Key of every one-key row (and of ``broky bench`` without ``--keys``).
BENCH_KEY: Final = "bench.data"
#: Messages per ``sendall`` at least: big writes, so that frames of one
#: message are batched by the socket (as a busy client's are), not by us.
SEND_BATCH: Final = 100
#: Where a stamped payload's due time goes.
STAMP_PREFIX: Final = b"<ts:"
_STAMP: Final = re.compile(rb"<ts:([0-9a-f]{16})>")
#: Length of a stamp: prefix, 16 hex digits, ">".
STAMP_BYTES: Final = len(STAMP_PREFIX) + 17


@attrs.frozen
class Load:
    """A message sequence: ``keys`` keys cycled in runs of ``run`` messages,
    cut into Publish frames of ``frame`` messages."""

    keys: int = 1
    run: int = 100
    frame: int = 100
    size: int = 100

    def key(self, index: int) -> str:
        """The ``index``-th key: ``bench.data`` alone, else ``bench.k<index>``."""
        return BENCH_KEY if self.keys == 1 else f"bench.k{index}"

    @property
    def pattern(self) -> str:
        """The one subscription that receives the whole sequence."""
        return BENCH_KEY if self.keys == 1 else "bench.>"

    @property
    def per_send(self) -> int:
        """Messages per ``sendall``: whole frames, at least ``SEND_BATCH``."""
        return self.frame * max(1, math.ceil(SEND_BATCH / self.frame))

    def sends(self) -> list[list[str]]:
        """One period of the sequence, as the keys of each ``sendall``."""
        period = math.lcm(self.keys * self.run, self.per_send)
        keys = [self.key(position // self.run % self.keys) for position in range(period)]
        return [keys[start : start + self.per_send] for start in range(0, period, self.per_send)]


def _runs(keys: list[str]) -> Iterator[tuple[str, int]]:
    """(key, count) for each stretch of equal consecutive keys."""
    start = 0
    for position in range(1, len(keys) + 1):
        if position == len(keys) or keys[position] != keys[start]:
            yield keys[start], position - start
            start = position


def publish_frame(runs: list[tuple[str, int]], message: bytes) -> bytes:
    """One Publish frame: a run of ``count`` copies of ``message`` per (key, count)."""
    chunks = [
        encode_run_chunk(key.encode(), 0, pack_sizes([len(message)] * count), message * count)
        for key, count in runs
    ]
    return b"".join(runs_frame_parts(BodyType.PUBLISH, 1, chunks))


def broky_sends(load: Load) -> list[bytes]:
    """The ``sendall`` buffers of one period, as Broky Publish frames."""
    message = encode_message(b"x" * load.size)
    buffers = []
    for keys in load.sends():
        frames = [keys[start : start + load.frame] for start in range(0, len(keys), load.frame)]
        buffers.append(b"".join(publish_frame(list(_runs(frame)), message) for frame in frames))
    return buffers


#: The head every bench message starts with (no timestamp, key_partition,
#: uid or tags): counting it in the received bytes counts messages.
MESSAGE_MARK: Final = encode_message(b"")[:32]


class MarkCounter:
    """Counts a marker in a byte stream, across reads: every message the
    subscriber receives starts with it, and payloads never contain it."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.tail = b""

    def feed(self, data: bytes) -> int:
        """Marks completed by ``data``: the kept tail is shorter than a
        mark, so no mark is counted twice."""
        buffer = self.tail + data
        self.tail = buffer[-(len(self.marker) - 1) :]
        return buffer.count(self.marker)


def stamped_payload(size: int) -> bytes:
    """A payload of ``size`` bytes (at least STAMP_BYTES) with a zero stamp."""
    return STAMP_PREFIX + b"0" * 16 + b">" + b"x" * max(size - STAMP_BYTES, 0)


class Stamper:
    """Copies of a one-message template (a frame or a command) with the
    stamp set: the template must hold exactly one stamped payload."""

    def __init__(self, template: bytes) -> None:
        self.template = bytearray(template)
        self.at = template.index(STAMP_PREFIX) + len(STAMP_PREFIX)

    def stamp(self, due_ns: int) -> bytes:
        self.template[self.at : self.at + 16] = b"%016x" % due_ns
        return bytes(self.template)


class StampScanner:
    """Finds the stamps in a byte stream, across reads."""

    def __init__(self, record: Callable[[int], object]) -> None:
        self.record = record
        self.tail = b""

    def feed(self, data: bytes, now_ns: int) -> int:
        """Record ``now_ns`` - stamp for each stamp completed by ``data``;
        returns how many. A stamp split across reads is found once: the
        kept tail is shorter than a stamp."""
        buffer = self.tail + data
        count = 0
        for match in _STAMP.finditer(buffer):
            self.record(now_ns - int(match[1], 16))
            count += 1
        self.tail = buffer[-(STAMP_BYTES - 1) :]
        return count


def matches(pattern: str, key: str) -> bool:
    """Broky's matching rule (``*`` one token, a final ``>`` one or more)."""
    tokens = key.split(".")
    parts = pattern.split(".")
    for index, part in enumerate(parts):
        if part == ">" and index == len(parts) - 1:
            return len(tokens) > index
        if index >= len(tokens) or part not in ("*", tokens[index]):
            return False
    return len(parts) == len(tokens)


def matching_share(load: Load, pattern: str) -> float:
    """The fraction of ``load``'s messages a subscription to ``pattern`` receives."""
    keys = [key for send in load.sends() for key in send]
    return sum(matches(pattern, key) for key in keys) / len(keys)
