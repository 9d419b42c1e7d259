"""Fetch and Fetched, the messages of every replication round, in binary.

A follower sends a Fetch and gets a Fetched per round of each partition it
follows, so their headers are fixed struct layouts rather than JSON
(broky.replication.wire keeps JSON for the rare messages): encoding and
decoding a round's pair costs a few struct calls instead of a JSON document
per run. The first byte of a header tells the two apart from a JSON one
(which starts with ``{``).

Fetch header: ``FETCH_HEAD`` (kind 1, topic and node lengths, partition,
epoch, node epoch, offset, durable, state epoch and version), then the
topic and the node id in UTF-8.

Fetched header: ``FETCHED_HEAD`` (kind 2, run count, epoch, high
watermark, length of the subscription state), then ``RUN_ENTRY`` per run
(epoch, base offset, count, key length, ts_broker, sizes and messages
lengths, producer and sequence: (0, 0) for none), then the keys back to
back, then the subscription state as JSON (absent: length 0). The frame's
payload holds each run's size table and messages, as stored, in order.
"""

from __future__ import annotations

import json
import struct
from typing import Final

from broky.protocol.chunks import sum_u32
from broky.protocol.frames import Buffer
from broky.replication.wire import (
    Fetch,
    Fetched,
    ReplicatedRun,
    ReplicationProtocolError,
    state_from,
    state_header,
)

#: First byte of a binary Fetch / Fetched header.
FETCH_KIND: Final = 1
FETCHED_KIND: Final = 2
FETCH_HEAD: Final = struct.Struct("<BBHIqqqqqq")
FETCHED_HEAD: Final = struct.Struct("<BxxxIqqI")
RUN_ENTRY: Final = struct.Struct("<qqIIqIIQQ")


def encode_fetch(fetch: Fetch) -> bytes:
    """A Fetch's binary header (it has no payload)."""
    topic, node = fetch.topic.encode(), fetch.node.encode()
    if len(topic) > 0xFFFF or len(node) > 0xFF:
        raise ValueError(f"topic or node id too long for a Fetch: {fetch.topic!r:.40}")
    return (
        FETCH_HEAD.pack(
            FETCH_KIND,
            len(node),
            len(topic),
            fetch.partition,
            fetch.epoch,
            fetch.node_epoch,
            fetch.offset,
            fetch.durable,
            fetch.state_epoch,
            fetch.state_version,
        )
        + topic
        + node
    )


def decode_fetch(header: memoryview) -> Fetch:
    if len(header) < FETCH_HEAD.size:
        raise ReplicationProtocolError("a Fetch header is too short")
    (
        _kind,
        node_length,
        topic_length,
        partition,
        epoch,
        node_epoch,
        offset,
        durable,
        state_epoch,
        state_version,
    ) = FETCH_HEAD.unpack_from(header)
    topic_end = FETCH_HEAD.size + topic_length
    if topic_end + node_length != len(header):
        raise ReplicationProtocolError("a Fetch header's lengths do not add up")
    try:
        topic = bytes(header[FETCH_HEAD.size : topic_end]).decode()
        node = bytes(header[topic_end:]).decode()
    except UnicodeDecodeError as exc:
        raise ReplicationProtocolError(f"a Fetch names are not UTF-8: {exc}") from exc
    return Fetch(
        topic, partition, epoch, node, node_epoch, offset, durable, state_epoch, state_version
    )


def encode_fetched(fetched: Fetched) -> tuple[bytes, list[Buffer]]:
    """A Fetched's binary header and its payload's parts (no copy of them)."""
    runs = fetched.runs
    state = (
        b""
        if fetched.state is None
        else json.dumps(state_header(fetched.state), separators=(",", ":")).encode()
    )
    parts = [
        FETCHED_HEAD.pack(
            FETCHED_KIND, len(runs), fetched.epoch, fetched.high_watermark, len(state)
        )
    ]
    parts.extend(
        RUN_ENTRY.pack(
            r.epoch,
            r.base_offset,
            r.count,
            len(r.key),
            r.ts_broker,
            len(r.sizes),
            len(r.messages),
            r.producer,
            r.sequence,
        )
        for r in runs
    )
    parts.extend(r.key for r in runs)
    parts.append(state)
    payload = [part for r in runs for part in (r.sizes, r.messages)]
    return b"".join(parts), payload


def decode_fetched(header: memoryview, payload: memoryview) -> Fetched:
    """Checks every length against what is there, and each run's size table
    against its messages; ReplicationProtocolError otherwise."""
    if len(header) < FETCHED_HEAD.size:
        raise ReplicationProtocolError("a Fetched header is too short")
    _kind, run_count, epoch, high_watermark, state_length = FETCHED_HEAD.unpack_from(header)
    table_end = FETCHED_HEAD.size + RUN_ENTRY.size * run_count
    if table_end > len(header):
        raise ReplicationProtocolError("a Fetched run table runs past its header")
    key_position = table_end
    position = 0
    payload_length = len(payload)
    header_length = len(header)
    runs = []
    for (
        epoch_,
        base,
        count,
        key_length,
        ts_broker,
        sizes_length,
        messages_length,
        producer,
        sequence,
    ) in RUN_ENTRY.iter_unpack(header[FETCHED_HEAD.size : table_end]):
        sizes_end = position + sizes_length
        messages_end = sizes_end + messages_length
        key_end = key_position + key_length
        if (
            count < 1
            or sizes_length != 4 * count
            or messages_end > payload_length
            or key_end > header_length
            or (producer == 0 and sequence != 0)
        ):
            raise ReplicationProtocolError("a run's bytes do not match its header")
        # Views of the frame, not copies (see ReplicatedRun); the size table
        # summed in place (``check_sizes`` without its wrapping, per run).
        sizes = payload[position:sizes_end]
        if sum_u32(sizes) != messages_length:
            raise ReplicationProtocolError("a run's sizes do not add up to its messages")
        runs.append(
            ReplicatedRun(
                epoch_,
                base,
                count,
                bytes(header[key_position:key_end]),
                ts_broker,
                sizes,
                payload[sizes_end:messages_end],
                producer,
                sequence,
            )
        )
        key_position, position = key_end, messages_end
    if position != len(payload) or key_position + state_length != len(header):
        raise ReplicationProtocolError("bytes left over after the runs")
    state = None
    if state_length:
        try:
            state = state_from(json.loads(bytes(header[key_position:])))
        except (ValueError, TypeError, KeyError) as exc:
            raise ReplicationProtocolError(f"malformed subscription state: {exc}") from exc
    return Fetched(epoch, high_watermark, tuple(runs), state)
