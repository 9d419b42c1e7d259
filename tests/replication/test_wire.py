"""The replication wire: round trips, and garbage only ever raises our error."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.replication.frames import (
    MAX_FRAME_BYTES,
    FetchTemplate,
    FrameReader,
    encode,
    encode_fetch_many,
)
from broky.replication.wire import (
    EpochEnd,
    EpochEnded,
    Fetch,
    Fetched,
    FetchedMany,
    FetchMany,
    Message,
    PartitionProgress,
    Progress,
    ProgressRequest,
    RefusalReason,
    Refused,
    ReplicatedRun,
    ReplicationProtocolError,
    StateEntry,
    StateUpdate,
)

runs = st.builds(
    lambda epoch, base, sizes, key, ts, producer, sequence: ReplicatedRun(
        epoch,
        base,
        len(sizes),
        key,
        ts,
        b"".join(s.to_bytes(4, "little") for s in sizes),
        b"m" * sum(sizes),
        producer,
        sequence if producer else 0,
    ),
    st.integers(0, 2**31),
    st.integers(0, 2**40),
    st.lists(st.integers(0, 50), min_size=1, max_size=5),
    st.binary(min_size=1, max_size=20),
    st.integers(0, 2**62),
    st.sampled_from([0, 1, 2**64 - 1]),
    st.integers(0, 2**64 - 1),
)
states = st.builds(
    StateUpdate,
    st.integers(0, 99),
    st.integers(0, 2**40),
    st.none() | st.lists(st.text(max_size=8), max_size=3).map(tuple),
    st.lists(
        st.builds(
            StateEntry,
            st.integers(1, 2**40),
            st.text(max_size=8),
            st.text(max_size=20),
            st.binary(max_size=20),
        ),
        max_size=3,
    ).map(tuple),
)
fetches = st.builds(
    Fetch,
    st.text(max_size=10),
    st.integers(0, 99),
    st.integers(0, 99),
    st.text(max_size=5),
    st.integers(0, 99),
    st.integers(0, 2**40),
    st.integers(0, 2**40),
    st.integers(-1, 99),
    st.integers(-1, 2**40),
)
refusals = st.builds(
    Refused,
    st.sampled_from(RefusalReason),
    st.integers(0, 99),
    st.text(max_size=30),
    st.integers(0, 2**40),
)
fetcheds = st.builds(
    Fetched,
    st.integers(0, 99),
    st.integers(0, 2**40),
    st.lists(runs, max_size=4).map(tuple),
    st.none() | states,
)
messages = st.one_of(
    fetches,
    st.builds(
        EpochEnd, st.text(max_size=10), st.integers(0, 99), st.integers(0, 99), st.integers(-1, 99)
    ),
    st.builds(
        EpochEnded,
        st.integers(0, 99),
        st.none() | st.tuples(st.integers(0, 99), st.integers(0, 2**40)),
    ),
    refusals,
    fetcheds,
    st.builds(FetchMany, st.lists(fetches, max_size=3).map(tuple)),
    st.builds(FetchedMany, st.lists(fetcheds | refusals, max_size=3).map(tuple)),
    st.just(ProgressRequest()),
    st.builds(
        Progress,
        st.text(max_size=5),
        st.integers(0, 99),
        st.lists(
            st.builds(
                PartitionProgress,
                st.text(max_size=10),
                st.integers(0, 99),
                st.sampled_from(("leader", "follower", "none")),
                st.integers(0, 99),
                st.integers(0, 2**40),
                st.integers(0, 2**40),
                st.lists(st.tuples(st.text(max_size=5), st.integers(0, 2**40)), max_size=3).map(
                    tuple
                ),
            ),
            max_size=4,
        ).map(tuple),
    ),
)


@given(st.lists(messages, min_size=1, max_size=4), st.integers(1, 64))
def test_messages_round_trip_whole_or_in_pieces(batch: list[Message], step: int) -> None:
    data = b"".join(encode(message) for message in batch)
    reader = FrameReader()
    decoded: list[Message] = []
    for start in range(0, len(data), step):
        decoded.extend(reader.feed(data[start : start + step]))
    assert decoded == batch


@given(st.lists(fetches, max_size=4))
def test_templates_frame_fetches_as_encode_does(batch: list[Fetch]) -> None:
    """A follower's FetchTemplate, and a FetchMany of its frames, are byte
    for byte what ``encode`` makes of the objects (the leader decodes them)."""
    frames = []
    for f in batch:
        template = FetchTemplate(f.topic, f.partition, f.epoch, f.node, f.node_epoch)
        frame = template.frame(f.offset, f.durable, f.state_epoch, f.state_version)
        assert frame == encode(f)
        frames.append(frame)
    assert encode_fetch_many(frames) == encode(FetchMany(tuple(batch)))


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=7) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
_fields = st.sampled_from(
    [
        "t",
        "topic",
        "partition",
        "epoch",
        "node",
        "node_epoch",
        "offset",
        "durable",
        "last_epoch",
        "found",
        "reason",
        "message",
        "hw",
        "runs",
    ]
)
_types = st.sampled_from(["fetch", "epochend", "epoch_ended", "refused", "fetched", "other"])


def _frame(header: dict[str, object], payload: bytes) -> bytes:
    return _frame_bytes(json.dumps(header).encode(), payload)


def _frame_bytes(encoded: bytes, payload: bytes) -> bytes:
    return (
        (4 + len(encoded) + len(payload)).to_bytes(4, "little")
        + len(encoded).to_bytes(4, "little")
        + encoded
        + payload
    )


def _binary_frame(kind: int, header: bytes, payload: bytes) -> bytes:
    return _frame_bytes(bytes([kind]) + header, payload)


def _mutated(message: Message, position: int, byte: int) -> bytes:
    data = bytearray(encode(message))
    data[8 + position % max(len(data) - 8, 1)] = byte
    return bytes(data)


@given(
    st.one_of(
        st.binary(max_size=200),
        st.builds(
            _binary_frame,
            st.sampled_from([1, 2, 3, 4]),
            st.binary(max_size=120),
            st.binary(max_size=40),
        ),
        st.builds(_mutated, messages, st.integers(0, 2**16), st.integers(0, 255)),
        st.builds(
            _frame,
            st.builds(
                lambda t, rest: {"t": t, **rest},
                _types,
                st.dictionaries(_fields, _json, max_size=8),
            ),
            st.binary(max_size=40),
        ),
    )
)
def test_garbage_parses_or_raises_our_error(data: bytes) -> None:
    """Any bytes (also well-framed JSON headers of any shape, binary Fetch and
    Fetched headers of any content, valid frames with a byte changed) decode
    or raise ReplicationProtocolError, never a stray exception."""
    with contextlib.suppress(ReplicationProtocolError):
        FrameReader().feed(data)


def test_an_oversize_length_is_refused_before_buffering() -> None:
    with pytest.raises(ReplicationProtocolError):
        FrameReader().feed((MAX_FRAME_BYTES + 1).to_bytes(4, "little"))


def test_a_fetch_many_holds_only_fetches() -> None:
    """A FetchMany carrying an answer, or another FetchMany, is garbage."""
    fetch = Fetch("orders", 0, 3, "n2", 1, 5, 5)
    for inner in (Refused(RefusalReason.NOT_LEADER, 0), FetchMany((fetch,))):
        frame = encode(FetchMany((fetch,)))
        # Swap the nested frame for ``inner``'s, fixing the outer length.
        head = frame[:16]
        nested = encode(inner)
        body = head[8:16] + nested
        bad = (4 + len(body)).to_bytes(4, "little") + (8).to_bytes(4, "little") + body
        with pytest.raises(ReplicationProtocolError):
            FrameReader().feed(bad)


def test_a_run_whose_sizes_do_not_add_up_is_refused() -> None:
    """A follower keeps a run's sizes and messages as views of the frame
    (no copies), so the size table is checked at decode: a table that does
    not sum to the run's message bytes is garbage, and so is a run whose
    bytes run past the payload."""
    run = ReplicatedRun(3, 10, 2, b"k", 7, (2).to_bytes(4, "little") * 2, b"abcd")
    frame = encode(Fetched(3, 12, (run,)))
    (decoded,) = FrameReader().feed(frame)
    assert isinstance(decoded, Fetched)
    assert decoded.runs == (run,)
    table = (2).to_bytes(4, "little") * 2 + b"abcd"
    assert frame.count(table) == 1
    bad_sizes = (2).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abcd"
    with pytest.raises(ReplicationProtocolError, match="sizes"):
        FrameReader().feed(frame.replace(table, bad_sizes))
    # One message byte short, the frame's length fixed to match.
    short = frame[4:-1]
    with pytest.raises(ReplicationProtocolError, match="do not match"):
        FrameReader().feed(len(short).to_bytes(4, "little") + short)
