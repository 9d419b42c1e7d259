"""The decoder fuzz invariant, shared by the CI test and ``scripts/fuzz_long.py``.

One invariant (h11's afl harness, nats-server's parser fuzz test): a server
``ProtocolMachine`` that has accepted a valid preamble and Hello, fed any
bytes, returns frames or raises ``RemoteProtocolError`` -- nothing else -- and
feeding the bytes whole or split at arbitrary points gives the same outcome.

Inputs are generated from one integer seed with ``random.Random``: hypothesis
only draws the seed, which keeps an example cheap enough to run 100k of them
per CI run. A failing seed reproduces with ``check_seed(seed)``.
"""

from __future__ import annotations

import itertools
import random
import struct
from typing import Final

from broky.protocol.codec import encode_frame
from broky.protocol.connection import ProtocolMachine, Role, State
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES, ErrorCode, SlowConsumerPolicy
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import (
    Error,
    Fetch,
    Flow,
    Frame,
    Hello,
    ListPartitions,
    Ping,
    Pong,
    Publish,
    Run,
    Subscribe,
    Unsubscribe,
)
from broky.protocol.framing import encode_preamble
from broky.protocol.message import encode_message, pack_sizes

#: What a client sends before anything the fuzzer makes up: credentials
#: included, so that mutations reach their decoding (the fuzzed broker has no
#: users, so it accepts any).
HANDSHAKE: Final = encode_preamble() + encode_frame(
    Hello(client_name="fuzz", user="fuzzer", password="pw")
)


def _run(key: bytes, payloads: list[bytes]) -> Run:
    blobs = [
        encode_message(payload, key_partition=b"kp", ts_producer=7, tags=(("t", "v"),))
        for payload in payloads
    ]
    return Run(key, 0, len(blobs), pack_sizes([len(blob) for blob in blobs]), b"".join(blobs))


#: Every frame a client may send once the connection is open, encoded with its size prefix.
VALID_FRAMES: Final[tuple[bytes, ...]] = tuple(
    encode_frame(frame)
    for frame in (
        Publish(1, (_run(b"orders.eu", [b"a", b"payload" * 3]), _run(b"x", [b""])), True),
        Publish(2, (), ack=True),
        Subscribe(3, b"orders.*", SlowConsumerPolicy.DISCONNECT, 5),
        Subscribe(4, b">", SlowConsumerPolicy.DROP, 0, start_offsets=(1, 2)),
        Flow(3, 10),
        Unsubscribe(3),
        Ping(1),
        Pong(2),
        Error(ErrorCode.INVALID_KEY, "bad", 1),
        ListPartitions(5, "orders"),
        Fetch(6, "orders", 0, 12, 4096),
    )
)
INTERESTING_U32: Final = (0, 1, 3, 4, 8, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFC, 0xFFFF_FFFF)


def _mutate(rng: random.Random, data: bytearray) -> None:
    """A few bit flips, word overwrites, truncations, insertions, deletions."""
    for _ in range(rng.randint(1, 4)):
        if not data:
            return
        index = rng.randrange(len(data))
        kind = rng.randrange(6)
        if kind == 0:
            data[index] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data[index] = rng.randrange(256)
        elif kind == 2:
            word = rng.choice(INTERESTING_U32) if rng.random() < 0.5 else rng.getrandbits(32)
            data[index : index + 4] = struct.pack("<I", word)
        elif kind == 3:
            del data[index:]
        elif kind == 4:
            data[index:index] = rng.randbytes(rng.randint(1, 8))
        else:
            del data[index : index + rng.randint(1, 8)]


def _tamper_size(rng: random.Random, frame: bytearray) -> None:
    """Rewrite a frame's size prefix: off by a little, zero, or huge."""
    (size,) = struct.unpack_from("<I", frame)
    choice = rng.randrange(4)
    if choice == 0:
        size = max(0, size + rng.randint(-8, 8))
    elif choice == 1:
        size = rng.choice(INTERESTING_U32)
    elif choice == 2:
        size = DEFAULT_MAX_FRAME_BYTES + rng.randint(0, 1)
    else:
        size = rng.randrange(size + 64)
    struct.pack_into("<I", frame, 0, size)


def make_input(rng: random.Random) -> bytes:
    """Bytes a client might send after its Hello: valid, mutated or random frames."""
    parts: list[bytes] = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(5)
        if kind == 0:
            parts.append(rng.choice(VALID_FRAMES))
            continue
        if kind == 4:
            body = rng.randbytes(rng.randint(0, 64))
            parts.append(struct.pack("<I", len(body)) + body)
            continue
        frame = bytearray(rng.choice(VALID_FRAMES))
        if kind in (1, 3):
            mutated_body = frame[4:]
            _mutate(rng, mutated_body)
            frame[4:] = mutated_body
            struct.pack_into("<I", frame, 0, len(mutated_body))
        if kind in (2, 3):
            _tamper_size(rng, frame)
        parts.append(bytes(frame))
    if rng.random() < 0.1:
        parts.append(rng.randbytes(rng.randint(1, 16)))
    return b"".join(parts)


def split(rng: random.Random, data: bytes) -> list[bytes]:
    """``data`` cut at up to 8 random points (empty pieces included)."""
    cuts = sorted(rng.randint(0, len(data)) for _ in range(rng.randint(1, 8)))
    bounds = [0, *cuts, len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


def outcome(chunks: list[bytes]) -> list[Frame] | None:
    """The frames a fresh, handshaken server machine yields, or None if it rejects.

    Anything but RemoteProtocolError propagates: that is the bug the fuzzer hunts.
    """
    machine = ProtocolMachine(Role.SERVER, DEFAULT_MAX_FRAME_BYTES)
    assert len(machine.receive_data(HANDSHAKE)) == 1
    frames: list[Frame] = []
    rejected: RemoteProtocolError | None = None
    for chunk in chunks:
        try:
            frames += machine.receive_data(chunk)
        except RemoteProtocolError as error:
            rejected = error
            break
    if rejected is None:
        return frames
    assert isinstance(rejected.code, ErrorCode)
    assert machine.state is State.CLOSED
    return None


def check_seed(seed: int) -> None:
    """Generate one input from ``seed``; whole and split feeding agree, and only
    RemoteProtocolError escapes."""
    rng = random.Random(seed)
    data = make_input(rng)
    assert outcome([data]) == outcome(split(rng, data))
