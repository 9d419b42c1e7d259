"""Byte compatibility with flatc's generated code, both ways.

Broky's codec is hand-written for speed, so these tests hold it to the
reference: what it writes must read back through flatc's generated Python, and
what flatc's builders write (with their own field order, alignment and omitted
defaults) must decode through Broky. A third group checks the alignment
promises the schema makes about run chunks.
"""

from __future__ import annotations

import enum
import re
import struct
from types import SimpleNamespace
from typing import Any

import attrs
import flatbuffers
import pytest

from broky.protocol.codec import (
    CHUNK_TS_OFFSET,
    RUN_CHUNK_OVERHEAD,
    decode_frame,
    encode_durable_run_chunk,
    encode_frame,
    encode_run_chunk,
    runs_frame_parts,
)
from broky.protocol.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    BodyType,
    DeletePhase,
    ErrorCode,
    LinkKind,
    NoticeKind,
    SettleKind,
    SlowConsumerPolicy,
    StartKind,
    SubscriptionKind,
)
from broky.protocol.frames import (
    Consume,
    DeletedSubscription,
    DeleteSubscription,
    Deliver,
    Error,
    Fetch,
    Fetched,
    Flow,
    Frame,
    Hello,
    ListPartitions,
    Notice,
    Partitions,
    Ping,
    Pong,
    Publish,
    PublishAck,
    Redelivered,
    Run,
    Settle,
    Settled,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Welcome,
)
from broky.protocol.message import Message, decode_message, decode_run, encode_message, pack_sizes

_U32 = struct.Struct("<I")
UID = bytes(range(1, 21))
UID_2 = bytes(range(100, 120))

#: Every control frame with every field set to a value other than its default.
CONTROL_FRAMES: list[Frame] = [
    Hello(protocol_version=7, client_name="orders-service/1.4 ✓", max_frame_bytes=123_456),
    Hello(client_name="router", link=LinkKind.CLUSTER, node="node-a ✓", workers=4),
    Hello(client_name="svc", user="alice ✓", password="s3cret", token=""),
    Hello(token="tok-" + "x" * 40),
    Welcome(
        protocol_version=3,
        server_name="broky/0.1.0",
        max_frame_bytes=DEFAULT_MAX_FRAME_BYTES,
        heartbeat_interval_ms=5_000,
        idle_timeout_ms=15_000,
        max_message_bytes=1_048_576,
        principal="alice ✓",
    ),
    Subscribe(
        stream=0xFFFF_FFFF,
        pattern=b"orders.*.eu.>",
        slow_consumer=SlowConsumerPolicy.DISCONNECT,
        credit=1_000,
    ),
    Subscribed(stream=42),
    Unsubscribe(stream=43),
    Flow(stream=44, credit=0xFFFF_FFFF),
    Ping(nonce=0xFFFF_FFFF_FFFF_FFFF),
    Pong(nonce=0x0123_4567_89AB_CDEF),
    Error(code=ErrorCode.SLOW_CONSUMER, message="subscriber 9 fell behind", stream=9),
    Error(code=ErrorCode.LIMIT_EXCEEDED, message="too many subscriptions", stream=0),
    Notice(stream=45, kind=NoticeKind.DROPPED, count=2**63 + 5),
    Subscribe(
        stream=7,
        pattern=b"orders.>",
        start=StartKind.OFFSET,
        start_time=-5,
        start_offsets=(0, 2**62, -1),
        queue=b"workers",
    ),
    PublishAck(
        stream=3,
        sequence=2**64 - 1,
        runs=(0, 0, 2),
        partitions=(1, 3, 0),
        first_offsets=(0, 10, 2**62),
        last_offsets=(4, 11, 2**62 + 9),
    ),
    PublishAck(  # an owner worker's answer to a forwarded frame
        stream=1,
        sequence=4,
        runs=(1,),
        partitions=(3,),
        first_offsets=(7,),
        last_offsets=(8,),
        refused_runs=(0, 2),
        refused_codes=(ErrorCode.OUT_OF_ORDER_SEQUENCE, ErrorCode.STORAGE_FAILURE),
        refused_reasons=("producer 0x1: sequence 5 ✗", ""),
    ),
    ListPartitions(stream=9, topic="orders ✓"),
    Partitions(
        stream=9,
        topics=("orders", "audit ✓"),
        partitions=(0, 7),
        start_offsets=(0, 5),
        end_offsets=(100, 2**62),
    ),
    Fetch(stream=10, topic="orders", partition=3, offset=2**40, max_bytes=65_536),
    Consume(
        stream=11,
        subscription="billing ✓",
        pattern=b"orders.>",
        kind=SubscriptionKind.KEY_SHARED,
        start=StartKind.EARLIEST,
        credit=5,
        max_in_flight=7,
        ack_timeout_ms=2_000,
        max_deliveries=0,
        backoff_ms=(100, 1_000, 0xFFFF_FFFF),
        priority=-3,
        start_time=-7,
        start_offsets=(0, 2**62, -1),
        dead_letter_topic="poison ✓",
        adopt_settings=5,
    ),
    Redelivered(
        stream=11, partitions=(0, 7), offsets=(5, 2**62), counts=(2, 0xFFFF_FFFF), topic="ordérs"
    ),
    Settle(
        stream=11,
        sequence=2**64 - 1,
        kind=SettleKind.NACK,
        partitions=(1, 1),
        first_offsets=(0, 9),
        last_offsets=(4, 2**62),
        delay_ms=2**40,
        reason="bad input ✓",
        topic="orders",
    ),
    Settle(stream=12, kind=SettleKind.IN_PROGRESS, delay_ms=0),
    Settled(stream=11, sequence=2**63, stale=3, unconfirmed=7),
    DeleteSubscription(stream=13, subscription="billing ✓", pattern=b"orders.>", force=True),
    DeleteSubscription(stream=14, subscription="b"),
    DeleteSubscription(stream=15, subscription="c", phase=DeletePhase.PREPARE),
    DeletedSubscription(stream=13, partitions=8, consumers=0xFFFF_FFFF),
]

#: Control frames whose fields all hold their schema defaults (omitted on the wire).
DEFAULT_CONTROL_FRAMES: list[Frame] = [
    Hello(),
    Welcome(max_frame_bytes=0),
    Subscribe(stream=0, pattern=b">"),
    Subscribed(stream=0),
    Unsubscribe(stream=0),
    Flow(stream=0, credit=0),
    Ping(nonce=0),
    Pong(nonce=0),
    Error(code=ErrorCode.INTERNAL, message=""),
    Notice(stream=0, kind=NoticeKind.DROPPED, count=0),
    PublishAck(stream=0, sequence=0),
    ListPartitions(stream=0),
    Partitions(stream=0),
    Fetch(stream=0, topic="", partition=0, offset=0),
    Consume(stream=0, subscription="s", pattern=b">"),
    Redelivered(stream=0),
    Settle(stream=0),
    Settled(stream=0, sequence=0),
    DeleteSubscription(stream=0, subscription="s"),
    DeletedSubscription(stream=0),
]

MESSAGES: list[Message] = [
    Message("", b"plain payload"),
    Message("", b""),
    Message("", b"x" * 13, ts_producer=1_700_000_000_123_456_789),
    Message("", b"neg", ts_producer=-(2**63)),
    Message("", b"kp", key_partition=b"\x00customer-17"),
    Message("", b"with uid", uid=UID, ts_producer=2**63 - 1),
    Message("", b"tags", tags=(("region", "eu-west"), ("empty", ""), ("ünï", "çødé"))),
    # Lengths that are multiples of 4 leave no room for the NUL without padding.
    Message("", b"tags", tags=(("zone", "abcd"), ("", "12345678"), ("", ""))),
    Message(
        "",
        bytes(range(256)),
        key_partition=b"k",
        ts_producer=99,
        uid=UID_2,
        tags=(("a", "b"),),
    ),
]


def _id(frame: Frame) -> str:
    return type(frame).__name__


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _encode(message: Message) -> bytes:
    return encode_message(
        message.payload,
        key_partition=message.key_partition,
        ts_producer=message.ts_producer,
        uid=message.uid,
        tags=message.tags,
    )


def _make_run(key: bytes, ts_broker: int, messages: list[Message]) -> Run:
    blobs = [_encode(message) for message in messages]
    return Run(
        key=key,
        ts_broker=ts_broker,
        count=len(blobs),
        sizes=pack_sizes([len(blob) for blob in blobs]),
        messages=b"".join(blobs),
    )


def _plain(frame: Frame) -> Frame:
    """``frame`` with its runs' buffers copied to bytes, for comparisons."""
    if isinstance(frame, (Publish, Deliver, Fetched)):
        runs = tuple(
            attrs.evolve(run, sizes=bytes(run.sizes), messages=bytes(run.messages))
            for run in frame.runs
        )
        return attrs.evolve(frame, runs=runs)
    return frame


# --- reading with generated code ---------------------------------------------


def _generated_body(gen: SimpleNamespace, data: bytes) -> tuple[BodyType, Any]:
    """The body of a size-prefixed frame, as an object of its generated class."""
    assert _U32.unpack_from(data)[0] == len(data) - 4, "size prefix must count the rest"
    root = gen.Frame.Frame.GetRootAs(data, 4)
    body_type = BodyType(root.BodyType())
    table = root.Body()
    assert table is not None
    name = _camel(body_type.name.lower())
    body = getattr(getattr(gen, name), name)()
    body.Init(table.Bytes, table.Pos)
    return body_type, body


def _check_nul_terminated(table: Any, field_id: int) -> None:
    """flatc's verifiers (C++, Rust, ...) reject a string without its NUL;
    the generated Python readers do not check, so check here."""
    tab = table._tab
    offset = tab.Offset(4 + 2 * field_id)
    if offset:
        end = tab.Vector(offset) + tab.VectorLen(offset)
        assert tab.Bytes[end] == 0, f"string field {field_id} is not NUL-terminated"


def _generated_vector(length: int, item: Any) -> bytes:
    return bytes(item(index) for index in range(length))


def _generated_run(run: Any) -> Run:
    _check_nul_terminated(run, 0)
    sizes = [run.Sizes(index) for index in range(run.SizesLength())]
    return Run(
        key=run.Key(),
        ts_broker=run.TsBroker(),
        count=len(sizes),
        sizes=pack_sizes(sizes),
        messages=_generated_vector(run.MessagesLength(), run.Messages),
        partition=run.Partition(),
        base_offset=run.BaseOffset(),
    )


def read_with_generated(gen: SimpleNamespace, data: bytes) -> Frame:  # noqa: PLR0911
    """Decode a size-prefixed frame using only flatc's generated readers."""
    body_type, body = _generated_body(gen, data)
    if body_type in (BodyType.HELLO, BodyType.WELCOME, BodyType.SUBSCRIBE, BodyType.ERROR):
        _check_nul_terminated(body, 1)  # client_name, server_name, pattern, message
    if body_type == BodyType.HELLO:
        return Hello(
            protocol_version=body.ProtocolVersion(),
            client_name=(body.ClientName() or b"").decode(),
            max_frame_bytes=body.MaxFrameBytes(),
            link=LinkKind(body.Link()),
            node=(body.Node() or b"").decode(),
            user=(body.User() or b"").decode(),
            password=(body.Password() or b"").decode(),
            token=(body.Token() or b"").decode(),
            workers=body.Workers(),
        )
    if body_type == BodyType.WELCOME:
        return Welcome(
            protocol_version=body.ProtocolVersion(),
            server_name=(body.ServerName() or b"").decode(),
            max_frame_bytes=body.MaxFrameBytes(),
            heartbeat_interval_ms=body.HeartbeatIntervalMs(),
            idle_timeout_ms=body.IdleTimeoutMs(),
            max_message_bytes=body.MaxMessageBytes(),
            principal=(body.Principal() or b"").decode(),
        )
    if body_type == BodyType.SUBSCRIBE:
        return Subscribe(
            stream=body.Stream(),
            pattern=body.Pattern(),
            slow_consumer=SlowConsumerPolicy(body.SlowConsumer()),
            credit=body.Credit(),
            start=StartKind(body.Start()),
            start_time=body.StartTime(),
            start_offsets=tuple(body.StartOffsets(i) for i in range(body.StartOffsetsLength())),
            queue=body.Queue() or b"",
        )
    if body_type == BodyType.PUBLISH_ACK:
        return PublishAck(
            stream=body.Stream(),
            sequence=body.Sequence(),
            runs=tuple(body.Runs(i) for i in range(body.RunsLength())),
            partitions=tuple(body.Partitions(i) for i in range(body.PartitionsLength())),
            first_offsets=tuple(body.FirstOffsets(i) for i in range(body.FirstOffsetsLength())),
            last_offsets=tuple(body.LastOffsets(i) for i in range(body.LastOffsetsLength())),
            refused_runs=tuple(body.RefusedRuns(i) for i in range(body.RefusedRunsLength())),
            refused_codes=tuple(
                ErrorCode(body.RefusedCodes(i)) for i in range(body.RefusedCodesLength())
            ),
            refused_reasons=tuple(
                body.RefusedReasons(i).decode() for i in range(body.RefusedReasonsLength())
            ),
        )
    if body_type == BodyType.LIST_PARTITIONS:
        return ListPartitions(stream=body.Stream(), topic=(body.Topic() or b"").decode())
    if body_type == BodyType.PARTITIONS:
        return Partitions(
            stream=body.Stream(),
            topics=tuple(body.Topics(i).decode() for i in range(body.TopicsLength())),
            partitions=tuple(body.Partitions(i) for i in range(body.PartitionsLength())),
            start_offsets=tuple(body.StartOffsets(i) for i in range(body.StartOffsetsLength())),
            end_offsets=tuple(body.EndOffsets(i) for i in range(body.EndOffsetsLength())),
        )
    if body_type == BodyType.FETCH:
        return Fetch(
            stream=body.Stream(),
            topic=(body.Topic() or b"").decode(),
            partition=body.Partition(),
            offset=body.Offset(),
            max_bytes=body.MaxBytes(),
        )
    if body_type in (
        BodyType.CONSUME,
        BodyType.REDELIVERED,
        BodyType.SETTLE,
        BodyType.SETTLED,
        BodyType.DELETE_SUBSCRIPTION,
        BodyType.DELETED_SUBSCRIPTION,
    ):
        return _read_consumer_frame(body_type, body)
    if body_type == BodyType.SUBSCRIBED:
        return Subscribed(stream=body.Stream())
    if body_type == BodyType.UNSUBSCRIBE:
        return Unsubscribe(stream=body.Stream())
    if body_type == BodyType.FLOW:
        return Flow(stream=body.Stream(), credit=body.Credit())
    if body_type == BodyType.PING:
        return Ping(nonce=body.Nonce())
    if body_type == BodyType.PONG:
        return Pong(nonce=body.Nonce())
    if body_type == BodyType.ERROR:
        return Error(
            code=ErrorCode(body.Code()),
            message=(body.Message() or b"").decode(),
            stream=body.Stream(),
        )
    if body_type == BodyType.NOTICE:
        return Notice(stream=body.Stream(), kind=NoticeKind(body.Kind()), count=body.Count())
    runs = tuple(_generated_run(body.Runs(index)) for index in range(body.RunsLength()))
    if body_type == BodyType.PUBLISH:
        return Publish(
            stream=body.Stream(),
            runs=runs,
            stamp_ts_broker=body.StampTsBroker(),
            ack=body.Ack(),
            producer_id=body.ProducerId(),
            first_sequence=body.FirstSequence(),
            run_producers=_numbers(body, "RunProducers"),
            run_sequences=_numbers(body, "RunSequences"),
        )
    if body_type == BodyType.FETCHED:
        return Fetched(stream=body.Stream(), runs=runs)
    assert body_type == BodyType.DELIVER
    return Deliver(stream=body.Stream(), runs=runs)


def _numbers(body: Any, name: str) -> tuple[int, ...]:
    return tuple(getattr(body, name)(i) for i in range(getattr(body, name + "Length")()))


def _read_consumer_frame(body_type: BodyType, body: Any) -> Frame:
    if body_type == BodyType.CONSUME:
        _check_nul_terminated(body, 1)
        _check_nul_terminated(body, 2)
        return Consume(
            stream=body.Stream(),
            subscription=body.Subscription().decode(),
            pattern=body.Pattern(),
            kind=SubscriptionKind(body.Kind()),
            start=StartKind(body.Start()),
            credit=body.Credit(),
            max_in_flight=body.MaxInFlight(),
            ack_timeout_ms=body.AckTimeoutMs(),
            max_deliveries=body.MaxDeliveries(),
            backoff_ms=_numbers(body, "BackoffMs"),
            priority=body.Priority(),
            start_time=body.StartTime(),
            start_offsets=_numbers(body, "StartOffsets"),
            dead_letter_topic=(body.DeadLetterTopic() or b"").decode(),
            adopt_settings=body.AdoptSettings(),
        )
    if body_type == BodyType.REDELIVERED:
        return Redelivered(
            stream=body.Stream(),
            partitions=_numbers(body, "Partitions"),
            offsets=_numbers(body, "Offsets"),
            counts=_numbers(body, "Counts"),
            topic=(body.Topic() or b"").decode(),
        )
    if body_type == BodyType.SETTLE:
        _check_nul_terminated(body, 7)
        return Settle(
            stream=body.Stream(),
            sequence=body.Sequence(),
            kind=SettleKind(body.Kind()),
            partitions=_numbers(body, "Partitions"),
            first_offsets=_numbers(body, "FirstOffsets"),
            last_offsets=_numbers(body, "LastOffsets"),
            delay_ms=body.DelayMs(),
            reason=(body.Reason() or b"").decode(),
            topic=(body.Topic() or b"").decode(),
        )
    if body_type == BodyType.DELETE_SUBSCRIPTION:
        _check_nul_terminated(body, 1)
        return DeleteSubscription(
            stream=body.Stream(),
            subscription=body.Subscription().decode(),
            pattern=body.Pattern() or b"",
            force=body.Force(),
            phase=DeletePhase(body.Phase()),
        )
    if body_type == BodyType.DELETED_SUBSCRIPTION:
        return DeletedSubscription(
            stream=body.Stream(), partitions=body.Partitions(), consumers=body.Consumers()
        )
    return Settled(
        stream=body.Stream(),
        sequence=body.Sequence(),
        stale=body.Stale(),
        unconfirmed=body.Unconfirmed(),
    )


def read_message_with_generated(gen: SimpleNamespace, data: bytes, key: str) -> Message:
    """Decode one message FlatBuffer using only flatc's generated readers."""
    message = gen.Message.Message.GetRootAs(data, 0)
    tags = []
    for index in range(message.TagsLength()):
        tag = message.Tags(index)
        _check_nul_terminated(tag, 0)
        _check_nul_terminated(tag, 1)
        tags.append((tag.Key().decode(), (tag.Value() or b"").decode()))
    return Message(
        key,
        _generated_vector(message.PayloadLength(), message.Payload),
        _generated_vector(message.KeyPartitionLength(), message.KeyPartition),
        message.TsProducer(),
        0,
        _generated_vector(message.UidLength(), message.Uid),
        tuple(tags),
    )


def _split_run(run: Run) -> list[bytes]:
    sizes = struct.unpack(f"<{run.count}I", run.sizes)
    blobs, position = [], 0
    for size in sizes:
        blobs.append(bytes(run.messages[position : position + size]))
        position += size
    return blobs


# --- building with generated code --------------------------------------------


def build_message_with_generated(gen: SimpleNamespace, message: Message) -> bytes:
    """A message FlatBuffer from flatc's builders, fields added in reverse order.

    Empty tag values are left out (absent, not empty strings), and so are
    empty byte vectors and a zero timestamp.
    """
    builder = flatbuffers.Builder(64)
    tag_tables = []
    for name, value in message.tags:
        value_offset = builder.CreateString(value) if value else 0
        name_offset = builder.CreateString(name)
        gen.Tag.Start(builder)
        if value_offset:
            gen.Tag.AddValue(builder, value_offset)
        gen.Tag.AddKey(builder, name_offset)
        tag_tables.append(gen.Tag.End(builder))
    tags = 0
    if tag_tables:
        gen.Message.StartTagsVector(builder, len(tag_tables))
        for table in reversed(tag_tables):
            builder.PrependUOffsetTRelative(table)
        tags = builder.EndVector()
    uid = builder.CreateByteVector(message.uid) if message.uid else 0
    key_partition = builder.CreateByteVector(message.key_partition) if message.key_partition else 0
    payload = builder.CreateByteVector(message.payload) if message.payload else 0
    gen.Message.Start(builder)
    if tags:
        gen.Message.AddTags(builder, tags)
    if uid:
        gen.Message.AddUid(builder, uid)
    gen.Message.AddTsProducer(builder, message.ts_producer)
    if payload:
        gen.Message.AddPayload(builder, payload)
    if key_partition:
        gen.Message.AddKeyPartition(builder, key_partition)
    builder.Finish(gen.Message.End(builder))
    return bytes(builder.Output())


def _build_run(
    gen: SimpleNamespace, builder: flatbuffers.Builder, run: Run, omit_ts_broker: bool
) -> int:
    # Vectors in the opposite order to encode_run_chunk, fields in reverse id order.
    messages = builder.CreateByteVector(bytes(run.messages))
    sizes = struct.unpack(f"<{run.count}I", run.sizes)
    gen.Run.StartSizesVector(builder, len(sizes))
    for size in reversed(sizes):
        builder.PrependUint32(size)
    sizes_vector = builder.EndVector()
    key = builder.CreateString(run.key)
    gen.Run.Start(builder)
    gen.Run.AddMessages(builder, messages)
    gen.Run.AddSizes(builder, sizes_vector)
    if not omit_ts_broker:
        gen.Run.AddTsBroker(builder, run.ts_broker)
    gen.Run.AddKey(builder, key)
    gen.Run.AddPartition(builder, run.partition)
    gen.Run.AddBaseOffset(builder, run.base_offset)
    return int(gen.Run.End(builder))


def _build_body(  # noqa: PLR0911
    gen: SimpleNamespace, builder: flatbuffers.Builder, frame: Frame, omit_ts_broker: bool
) -> int:
    if isinstance(frame, Hello):
        name = builder.CreateString(frame.client_name)
        node = builder.CreateString(frame.node) if frame.node else 0
        user = builder.CreateString(frame.user) if frame.user else 0
        password = builder.CreateString(frame.password) if frame.password else 0
        token = builder.CreateString(frame.token) if frame.token else 0
        gen.Hello.Start(builder)
        if node:
            gen.Hello.AddNode(builder, node)
        if user:
            gen.Hello.AddUser(builder, user)
        if password:
            gen.Hello.AddPassword(builder, password)
        if token:
            gen.Hello.AddToken(builder, token)
        gen.Hello.AddWorkers(builder, frame.workers)
        gen.Hello.AddLink(builder, frame.link)
        gen.Hello.AddMaxFrameBytes(builder, frame.max_frame_bytes)
        gen.Hello.AddClientName(builder, name)
        gen.Hello.AddProtocolVersion(builder, frame.protocol_version)
        return int(gen.Hello.End(builder))
    if isinstance(frame, Welcome):
        name = builder.CreateString(frame.server_name)
        principal = builder.CreateString(frame.principal) if frame.principal else 0
        gen.Welcome.Start(builder)
        if principal:
            gen.Welcome.AddPrincipal(builder, principal)
        gen.Welcome.AddMaxMessageBytes(builder, frame.max_message_bytes)
        gen.Welcome.AddProtocolVersion(builder, frame.protocol_version)
        gen.Welcome.AddIdleTimeoutMs(builder, frame.idle_timeout_ms)
        gen.Welcome.AddServerName(builder, name)
        gen.Welcome.AddHeartbeatIntervalMs(builder, frame.heartbeat_interval_ms)
        gen.Welcome.AddMaxFrameBytes(builder, frame.max_frame_bytes)
        return int(gen.Welcome.End(builder))
    if isinstance(frame, Subscribe):
        offsets = _int_vector(builder, gen.Subscribe.StartStartOffsetsVector, frame.start_offsets)
        pattern = builder.CreateString(frame.pattern)
        queue = builder.CreateString(frame.queue) if frame.queue else 0
        gen.Subscribe.Start(builder)
        if queue:
            gen.Subscribe.AddQueue(builder, queue)
        gen.Subscribe.AddSlowConsumer(builder, frame.slow_consumer)
        gen.Subscribe.AddStream(builder, frame.stream)
        gen.Subscribe.AddCredit(builder, frame.credit)
        gen.Subscribe.AddPattern(builder, pattern)
        gen.Subscribe.AddStart(builder, frame.start)
        gen.Subscribe.AddStartTime(builder, frame.start_time)
        if offsets:
            gen.Subscribe.AddStartOffsets(builder, offsets)
        return int(gen.Subscribe.End(builder))
    if isinstance(frame, (Subscribed, Unsubscribe, Ping, Pong)):
        module = getattr(gen, type(frame).__name__)
        module.Start(builder)
        if isinstance(frame, (Ping, Pong)):
            module.AddNonce(builder, frame.nonce)
        else:
            module.AddStream(builder, frame.stream)
        return int(module.End(builder))
    if isinstance(frame, Flow):
        gen.Flow.Start(builder)
        gen.Flow.AddCredit(builder, frame.credit)
        gen.Flow.AddStream(builder, frame.stream)
        return int(gen.Flow.End(builder))
    if isinstance(frame, Error):
        message = builder.CreateString(frame.message)
        gen.Error.Start(builder)
        gen.Error.AddStream(builder, frame.stream)
        gen.Error.AddMessage(builder, message)
        gen.Error.AddCode(builder, frame.code)
        return int(gen.Error.End(builder))
    if isinstance(frame, Notice):
        gen.Notice.Start(builder)
        gen.Notice.AddKind(builder, frame.kind)
        gen.Notice.AddCount(builder, frame.count)
        gen.Notice.AddStream(builder, frame.stream)
        return int(gen.Notice.End(builder))
    if isinstance(frame, (PublishAck, ListPartitions, Partitions, Fetch)):
        return _build_storage_body(gen, builder, frame)
    if isinstance(
        frame,
        (Consume, Redelivered, Settle, Settled, DeleteSubscription, DeletedSubscription),
    ):
        return _build_consumer_body(gen, builder, frame)
    run_tables = [_build_run(gen, builder, run, omit_ts_broker) for run in frame.runs]
    module = getattr(gen, type(frame).__name__)
    module.StartRunsVector(builder, len(run_tables))
    for table in reversed(run_tables):
        builder.PrependUOffsetTRelative(table)
    runs = builder.EndVector()
    producers = sequences = 0
    if isinstance(frame, Publish) and frame.run_producers:
        producers = _int_vector(builder, module.StartRunProducersVector, frame.run_producers)
        sequences = _int_vector(builder, module.StartRunSequencesVector, frame.run_sequences)
    module.Start(builder)
    module.AddRuns(builder, runs)
    if isinstance(frame, Publish):
        module.AddStampTsBroker(builder, frame.stamp_ts_broker)
        module.AddAck(builder, frame.ack)
        module.AddProducerId(builder, frame.producer_id)
        module.AddFirstSequence(builder, frame.first_sequence)
        if producers:
            module.AddRunProducers(builder, producers)
            module.AddRunSequences(builder, sequences)
    module.AddStream(builder, frame.stream)
    return int(module.End(builder))


def _strings(start: Any, builder: flatbuffers.Builder, texts: tuple[str, ...]) -> int:
    """A vector of strings with flatc's ``Start...Vector`` (0 when empty)."""
    offsets = [builder.CreateString(text) for text in texts]
    if not offsets:
        return 0
    start(builder, len(offsets))
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return int(builder.EndVector())


def _int_vector(builder: flatbuffers.Builder, start: Any, values: tuple[int, ...]) -> int:
    if not values:
        return 0
    start(builder, len(values))
    for value in reversed(values):
        if start.__name__.endswith(("OffsetsVector",)):
            builder.PrependInt64(value)
        elif start.__name__.endswith(("ProducersVector", "SequencesVector")):
            builder.PrependUint64(value)
        else:
            builder.PrependUint32(value)
    return int(builder.EndVector())


def _build_consumer_body(
    gen: SimpleNamespace,
    builder: flatbuffers.Builder,
    frame: Consume | Redelivered | Settle | Settled | DeleteSubscription | DeletedSubscription,
) -> int:
    """flatc's builders, fields added in reverse order, empty vectors omitted."""
    if isinstance(frame, Consume):
        starts = _int_vector(builder, gen.Consume.StartStartOffsetsVector, frame.start_offsets)
        backoff = _int_vector(builder, gen.Consume.StartBackoffMsVector, frame.backoff_ms)
        pattern = builder.CreateString(frame.pattern)
        name = builder.CreateString(frame.subscription)
        dead = builder.CreateString(frame.dead_letter_topic) if frame.dead_letter_topic else 0
        gen.Consume.Start(builder)
        gen.Consume.AddAdoptSettings(builder, frame.adopt_settings)
        if dead:
            gen.Consume.AddDeadLetterTopic(builder, dead)
        if starts:
            gen.Consume.AddStartOffsets(builder, starts)
        gen.Consume.AddStartTime(builder, frame.start_time)
        gen.Consume.AddPriority(builder, frame.priority)
        if backoff:
            gen.Consume.AddBackoffMs(builder, backoff)
        gen.Consume.AddMaxDeliveries(builder, frame.max_deliveries)
        gen.Consume.AddAckTimeoutMs(builder, frame.ack_timeout_ms)
        gen.Consume.AddMaxInFlight(builder, frame.max_in_flight)
        gen.Consume.AddCredit(builder, frame.credit)
        gen.Consume.AddStart(builder, frame.start)
        gen.Consume.AddKind(builder, frame.kind)
        gen.Consume.AddPattern(builder, pattern)
        gen.Consume.AddSubscription(builder, name)
        gen.Consume.AddStream(builder, frame.stream)
        return int(gen.Consume.End(builder))
    if isinstance(frame, Redelivered):
        counts = _int_vector(builder, gen.Redelivered.StartCountsVector, frame.counts)
        offsets = _int_vector(builder, gen.Redelivered.StartOffsetsVector, frame.offsets)
        parts = _int_vector(builder, gen.Redelivered.StartPartitionsVector, frame.partitions)
        topic = builder.CreateString(frame.topic) if frame.topic else 0
        gen.Redelivered.Start(builder)
        if topic:
            gen.Redelivered.AddTopic(builder, topic)
        for add, value in (
            (gen.Redelivered.AddCounts, counts),
            (gen.Redelivered.AddOffsets, offsets),
            (gen.Redelivered.AddPartitions, parts),
        ):
            if value:
                add(builder, value)
        gen.Redelivered.AddStream(builder, frame.stream)
        return int(gen.Redelivered.End(builder))
    if isinstance(frame, Settle):
        reason = builder.CreateString(frame.reason) if frame.reason else 0
        last = _int_vector(builder, gen.Settle.StartLastOffsetsVector, frame.last_offsets)
        first = _int_vector(builder, gen.Settle.StartFirstOffsetsVector, frame.first_offsets)
        parts = _int_vector(builder, gen.Settle.StartPartitionsVector, frame.partitions)
        topic = builder.CreateString(frame.topic) if frame.topic else 0
        gen.Settle.Start(builder)
        if topic:
            gen.Settle.AddTopic(builder, topic)
        if reason:
            gen.Settle.AddReason(builder, reason)
        gen.Settle.AddDelayMs(builder, frame.delay_ms)
        for add, value in (
            (gen.Settle.AddLastOffsets, last),
            (gen.Settle.AddFirstOffsets, first),
            (gen.Settle.AddPartitions, parts),
        ):
            if value:
                add(builder, value)
        gen.Settle.AddKind(builder, frame.kind)
        gen.Settle.AddSequence(builder, frame.sequence)
        gen.Settle.AddStream(builder, frame.stream)
        return int(gen.Settle.End(builder))
    if isinstance(frame, DeleteSubscription):
        pattern = builder.CreateString(frame.pattern) if frame.pattern else 0
        name = builder.CreateString(frame.subscription)
        gen.DeleteSubscription.Start(builder)
        gen.DeleteSubscription.AddForce(builder, frame.force)
        gen.DeleteSubscription.AddPhase(builder, frame.phase)
        if pattern:
            gen.DeleteSubscription.AddPattern(builder, pattern)
        gen.DeleteSubscription.AddSubscription(builder, name)
        gen.DeleteSubscription.AddStream(builder, frame.stream)
        return int(gen.DeleteSubscription.End(builder))
    if isinstance(frame, DeletedSubscription):
        gen.DeletedSubscription.Start(builder)
        gen.DeletedSubscription.AddConsumers(builder, frame.consumers)
        gen.DeletedSubscription.AddPartitions(builder, frame.partitions)
        gen.DeletedSubscription.AddStream(builder, frame.stream)
        return int(gen.DeletedSubscription.End(builder))
    gen.Settled.Start(builder)
    gen.Settled.AddUnconfirmed(builder, frame.unconfirmed)
    gen.Settled.AddStale(builder, frame.stale)
    gen.Settled.AddSequence(builder, frame.sequence)
    gen.Settled.AddStream(builder, frame.stream)
    return int(gen.Settled.End(builder))


def _build_storage_body(
    gen: SimpleNamespace,
    builder: flatbuffers.Builder,
    frame: PublishAck | ListPartitions | Partitions | Fetch,
) -> int:
    if isinstance(frame, PublishAck):
        last = _int_vector(builder, gen.PublishAck.StartLastOffsetsVector, frame.last_offsets)
        first = _int_vector(builder, gen.PublishAck.StartFirstOffsetsVector, frame.first_offsets)
        parts = _int_vector(builder, gen.PublishAck.StartPartitionsVector, frame.partitions)
        runs = _int_vector(builder, gen.PublishAck.StartRunsVector, frame.runs)
        refused = _int_vector(builder, gen.PublishAck.StartRefusedRunsVector, frame.refused_runs)
        codes = 0
        if frame.refused_codes:
            gen.PublishAck.StartRefusedCodesVector(builder, len(frame.refused_codes))
            for code in reversed(frame.refused_codes):
                builder.PrependUint16(code)
            codes = int(builder.EndVector())
        reasons = _strings(gen.PublishAck.StartRefusedReasonsVector, builder, frame.refused_reasons)
        gen.PublishAck.Start(builder)
        for add, value in (
            (gen.PublishAck.AddRefusedReasons, reasons),
            (gen.PublishAck.AddRefusedCodes, codes),
            (gen.PublishAck.AddRefusedRuns, refused),
            (gen.PublishAck.AddLastOffsets, last),
            (gen.PublishAck.AddRuns, runs),
            (gen.PublishAck.AddFirstOffsets, first),
            (gen.PublishAck.AddPartitions, parts),
        ):
            if value:
                add(builder, value)
        gen.PublishAck.AddSequence(builder, frame.sequence)
        gen.PublishAck.AddStream(builder, frame.stream)
        return int(gen.PublishAck.End(builder))
    if isinstance(frame, ListPartitions):
        topic = builder.CreateString(frame.topic) if frame.topic else 0
        gen.ListPartitions.Start(builder)
        if topic:
            gen.ListPartitions.AddTopic(builder, topic)
        gen.ListPartitions.AddStream(builder, frame.stream)
        return int(gen.ListPartitions.End(builder))
    if isinstance(frame, Partitions):
        ends = _int_vector(builder, gen.Partitions.StartEndOffsetsVector, frame.end_offsets)
        starts = _int_vector(builder, gen.Partitions.StartStartOffsetsVector, frame.start_offsets)
        parts = _int_vector(builder, gen.Partitions.StartPartitionsVector, frame.partitions)
        topics = _strings(gen.Partitions.StartTopicsVector, builder, frame.topics)
        gen.Partitions.Start(builder)
        for add, value in (
            (gen.Partitions.AddTopics, topics),
            (gen.Partitions.AddEndOffsets, ends),
            (gen.Partitions.AddPartitions, parts),
            (gen.Partitions.AddStartOffsets, starts),
        ):
            if value:
                add(builder, value)
        gen.Partitions.AddStream(builder, frame.stream)
        return int(gen.Partitions.End(builder))
    topic = builder.CreateString(frame.topic) if frame.topic else 0
    gen.Fetch.Start(builder)
    gen.Fetch.AddMaxBytes(builder, frame.max_bytes)
    if topic:
        gen.Fetch.AddTopic(builder, topic)
    gen.Fetch.AddOffset(builder, frame.offset)
    gen.Fetch.AddPartition(builder, frame.partition)
    gen.Fetch.AddStream(builder, frame.stream)
    return int(gen.Fetch.End(builder))


def build_with_generated(
    gen: SimpleNamespace,
    frame: Frame,
    *,
    force_defaults: bool = False,
    omit_ts_broker: bool = False,
) -> bytes:
    """A size-prefixed frame from flatc's builders (``FinishSizePrefixed``)."""
    builder = flatbuffers.Builder(256)
    builder.ForceDefaults(force_defaults)
    body = _build_body(gen, builder, frame, omit_ts_broker)
    gen.Frame.Start(builder)
    gen.Frame.AddBodyType(
        builder, BodyType[re.sub(r"(?<!^)(?=[A-Z])", "_", type(frame).__name__).upper()]
    )
    gen.Frame.AddBody(builder, body)
    builder.FinishSizePrefixed(gen.Frame.End(builder))
    return bytes(builder.Output())


# --- the schema and the constants agree --------------------------------------


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (BodyType, "Body"),
        (ErrorCode, "ErrorCode"),
        (SlowConsumerPolicy, "SlowConsumerPolicy"),
        (NoticeKind, "NoticeKind"),
        (SubscriptionKind, "SubscriptionKind"),
        (SettleKind, "SettleKind"),
    ],
)
def test_enums_match_schema(
    generated: SimpleNamespace, ours: type[enum.IntEnum], theirs: str
) -> None:
    generated_enum = getattr(getattr(generated, theirs), theirs)
    schema = {
        name: value
        for name, value in vars(generated_enum).items()
        if not name.startswith("_") and name != "NONE"
    }
    assert schema == {_camel(member.name): int(member) for member in ours}


# --- (a) Broky writes, generated code reads ----------------------------------


@pytest.mark.parametrize("frame", CONTROL_FRAMES + DEFAULT_CONTROL_FRAMES, ids=_id)
def test_generated_code_reads_control_frames(generated: SimpleNamespace, frame: Frame) -> None:
    assert read_with_generated(generated, encode_frame(frame)) == frame


@pytest.mark.parametrize("message", MESSAGES, ids=range(len(MESSAGES)))
def test_generated_code_reads_messages(generated: SimpleNamespace, message: Message) -> None:
    data = _encode(message)
    assert len(data) % 8 == 0
    assert read_message_with_generated(generated, data, "") == message


def _several_runs() -> tuple[Run, ...]:
    return (
        _make_run(b"orders.eu.created", 0, MESSAGES[:3]),
        _make_run(b"k", 1_700_000_000_000_000_001, MESSAGES[3:]),
        _make_run(b"empty.run", -5, []),
        _make_run("ünicode.kéy".encode(), 2**63 - 1, [MESSAGES[6]] * 4),
    )


@pytest.mark.parametrize("stamp", [False, True])
def test_generated_code_reads_publish_runs(generated: SimpleNamespace, stamp: bool) -> None:
    frame = Publish(stream=0xFFFF_FFFE, runs=_several_runs(), stamp_ts_broker=stamp)
    read = read_with_generated(generated, encode_frame(frame))
    assert read == _plain(frame)
    assert isinstance(read, Publish)
    expected_messages = [MESSAGES[:3], MESSAGES[3:], [], [MESSAGES[6]] * 4]
    for run, expected in zip(read.runs, expected_messages, strict=True):
        key = run.key.decode()
        decoded = [read_message_with_generated(generated, blob, key) for blob in _split_run(run)]
        assert decoded == [message._replace(key=key) for message in expected]


#: Publish frames of idempotent producers: a client's (one producer, the
#: frame's first sequence) and a forwarding worker's (per-run producers).
PRODUCER_PUBLISHES = [
    Publish(3, _several_runs(), ack=True, producer_id=2**64 - 1, first_sequence=2**40 + 1),
    Publish(3, _several_runs()[:1], True, True, producer_id=7, first_sequence=1),
    Publish(
        1,
        _several_runs(),
        ack=True,
        run_producers=(5, 0, 2**63, 5),
        run_sequences=(1, 0, 9, 4),
    ),
]


@pytest.mark.parametrize("frame", PRODUCER_PUBLISHES, ids=range(len(PRODUCER_PUBLISHES)))
def test_producer_publish_reads_both_ways(generated: SimpleNamespace, frame: Publish) -> None:
    data = encode_frame(frame)
    assert len(data) % 8 == 0
    assert read_with_generated(generated, data) == _plain(frame)
    assert _plain(decode_frame(data[4:])) == _plain(frame)
    built = build_with_generated(generated, frame)
    assert _plain(decode_frame(built[4:])) == _plain(frame)


def test_generated_code_reads_deliver_built_from_chunks(generated: SimpleNamespace) -> None:
    runs = _several_runs()
    chunks = [encode_run_chunk(run.key, run.ts_broker, run.sizes, run.messages) for run in runs]
    data = b"".join(runs_frame_parts(BodyType.DELIVER, 7, chunks))
    assert read_with_generated(generated, data) == _plain(Deliver(stream=7, runs=runs))


@pytest.mark.parametrize("body_type", [BodyType.DELIVER, BodyType.FETCHED])
def test_generated_code_reads_durable_runs(generated: SimpleNamespace, body_type: BodyType) -> None:
    """Durable chunks (vtable after the table) carry partition and base_offset,
    read by flatc's code and by ours, and still stamp ts_broker in place."""
    runs = tuple(
        attrs.evolve(run, partition=index + 2, base_offset=2**40 + index)
        for index, run in enumerate(_several_runs())
    )
    chunks = [encode_durable_run_chunk(run) for run in runs]
    assert all(len(chunk) % 8 == 0 for chunk in chunks)
    for run, chunk in zip(runs, chunks, strict=True):
        extra = len(chunk) - len(run.messages) - len(run.key) - 4 * run.count
        assert extra <= RUN_CHUNK_OVERHEAD
    data = b"".join(runs_frame_parts(body_type, 7, chunks))
    frame = Deliver(stream=7, runs=runs) if body_type == BodyType.DELIVER else Fetched(7, runs)
    assert read_with_generated(generated, data) == _plain(frame)
    assert _plain(decode_frame(data[4:])) == _plain(frame)


# --- (b) generated code writes, Broky reads ----------------------------------


@pytest.mark.parametrize("force_defaults", [False, True])
@pytest.mark.parametrize("frame", CONTROL_FRAMES + DEFAULT_CONTROL_FRAMES, ids=_id)
def test_broky_reads_generated_control_frames(
    generated: SimpleNamespace, frame: Frame, force_defaults: bool
) -> None:
    data = build_with_generated(generated, frame, force_defaults=force_defaults)
    assert decode_frame(data[4:]) == frame


def test_defaults_really_are_omitted_by_the_generated_builder(generated: SimpleNamespace) -> None:
    # Guards the test above: with defaults omitted, Broky must fill them in itself.
    lean = build_with_generated(generated, Hello())
    full = build_with_generated(generated, Hello(), force_defaults=True)
    assert len(lean) < len(full)


@pytest.mark.parametrize("message", MESSAGES, ids=range(len(MESSAGES)))
def test_broky_reads_generated_messages(generated: SimpleNamespace, message: Message) -> None:
    data = build_message_with_generated(generated, message)
    assert decode_message(memoryview(data), "some.key", 17) == message._replace(
        key="some.key", ts_broker=17
    )


def _generated_message_run(
    gen: SimpleNamespace, key: bytes, ts: int, messages: list[Message]
) -> Run:
    blobs = [build_message_with_generated(gen, message) for message in messages]
    return Run(key, ts, len(blobs), pack_sizes([len(b) for b in blobs]), b"".join(blobs))


@pytest.mark.parametrize("omit_ts_broker", [False, True])
def test_broky_reads_generated_publish(generated: SimpleNamespace, omit_ts_broker: bool) -> None:
    runs = (
        _generated_message_run(generated, b"a.b.c", 123_456_789, MESSAGES[:4]),
        _generated_message_run(generated, b"$SYS.x", 987, MESSAGES[4:]),
        _generated_message_run(generated, b"z", 5, []),
    )
    frame = Publish(stream=3, runs=runs, stamp_ts_broker=True)
    data = build_with_generated(generated, frame, omit_ts_broker=omit_ts_broker)
    if omit_ts_broker:
        _, body = _generated_body(generated, data)
        # The field is really absent from each run's vtable, not written as 0.
        assert [body.Runs(index)._tab.Offset(6) for index in range(3)] == [0, 0, 0]

    decoded = decode_frame(data[4:])

    assert isinstance(decoded, Publish)
    assert (decoded.stream, decoded.stamp_ts_broker) == (3, True)
    expected_ts = [0, 0, 0] if omit_ts_broker else [123_456_789, 987, 5]
    assert [run.ts_broker for run in decoded.runs] == expected_ts
    assert [run.key for run in decoded.runs] == [b"a.b.c", b"$SYS.x", b"z"]
    expected_groups = [MESSAGES[:4], MESSAGES[4:], []]
    for run, ts, key, group in zip(
        decoded.runs, expected_ts, ["a.b.c", "$SYS.x", "z"], expected_groups, strict=True
    ):
        assert decode_run(run) == [m._replace(key=key, ts_broker=ts) for m in group]


def test_broky_reads_generated_deliver(generated: SimpleNamespace) -> None:
    runs = (_generated_message_run(generated, b"x.y", 1, MESSAGES),)
    data = build_with_generated(generated, Deliver(stream=11, runs=runs))
    decoded = decode_frame(data[4:])
    assert _plain(decoded) == Deliver(stream=11, runs=runs)
    assert isinstance(decoded, Deliver)
    assert decode_run(decoded.runs[0]) == [m._replace(key="x.y", ts_broker=1) for m in MESSAGES]


# --- (c) alignment of runs ---------------------------------------------------


def _run_positions(gen: SimpleNamespace, data: bytes) -> list[tuple[int, int, int]]:
    """(messages data start, ts_broker position, run table) per run, from the prefix."""
    _, body = _generated_body(gen, data)
    positions = []
    for index in range(body.RunsLength()):
        table = body.Runs(index)._tab
        ts_field = table.Offset(6)
        assert ts_field != 0, "encoders must always write ts_broker"
        positions.append((table.Vector(table.Offset(10)), table.Pos + ts_field, table.Pos))
    return positions


@pytest.mark.parametrize("body_type", [BodyType.PUBLISH, BodyType.DELIVER])
@pytest.mark.parametrize("run_count", [1, 2, 3, 5])
def test_runs_are_8_aligned(
    generated: SimpleNamespace, body_type: BodyType, run_count: int
) -> None:
    runs = [
        _make_run(
            b"k" * (1 + 3 * index),  # key lengths 1, 4, 7, ... cover every residue mod 8
            index,
            [Message("", b"p" * (index + size)) for size in range(index % 3)],
        )
        for index in range(run_count * 3)
    ]
    chunks = [encode_run_chunk(run.key, run.ts_broker, run.sizes, run.messages) for run in runs]
    parts = runs_frame_parts(body_type, 1, chunks)
    data = b"".join(parts)
    header = sum(len(part) for part in parts[:3])
    chunk_starts = [header + sum(len(chunk) for chunk in chunks[:i]) for i in range(len(chunks))]

    positions = _run_positions(generated, data)

    assert len(positions) == len(runs)
    for run, position, chunk_at in zip(runs, positions, chunk_starts, strict=True):
        messages_at, ts_at, table_at = position
        assert messages_at % 8 == 0
        assert ts_at % 8 == 0
        assert ts_at == chunk_at + CHUNK_TS_OFFSET
        assert table_at < ts_at
        # Every message inside the run starts 8-aligned too (sizes are multiples of 8).
        offset = messages_at
        for size in struct.unpack(f"<{run.count}I", run.sizes):
            assert offset % 8 == 0
            offset += size


def test_ts_broker_can_be_stamped_in_place(generated: SimpleNamespace) -> None:
    runs = (_make_run(b"a", 0, MESSAGES[:2]), _make_run(b"bb.cc", 0, MESSAGES[2:3]))
    data = bytearray(encode_frame(Publish(stream=1, runs=runs, stamp_ts_broker=True)))
    for stamp, (_, ts_at, _) in enumerate(_run_positions(generated, bytes(data)), start=1000):
        struct.pack_into("<q", data, ts_at, stamp)

    decoded = decode_frame(bytes(data[4:]))

    assert isinstance(decoded, Publish)
    assert [run.ts_broker for run in decoded.runs] == [1000, 1001]
    stamped = tuple(
        Run(run.key, 1000 + index, run.count, run.sizes, run.messages)
        for index, run in enumerate(runs)
    )
    expected = Publish(stream=1, runs=stamped, stamp_ts_broker=True)
    assert read_with_generated(generated, bytes(data)) == _plain(expected)
