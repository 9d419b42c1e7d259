"""Decoding delivered runs at C speed for the client's subscriptions.

``broky.protocol.message.decode_run`` reads every message through its vtable:
some twenty Python-level calls per message, which held a subscriber near 160k
messages/s. Almost every message, though, has the one layout
``encode_message`` writes when a message carries only a payload and a
producer timestamp, and a run usually holds messages of one size. For those,
``decode_delivered_run`` checks the layout's fixed bytes and cuts every
message of the run with one ``struct.iter_unpack`` and builds the ``Message``
tuples with ``map``, so no Python code runs per message. A run of messages of
varied sizes is read message by message with one ``unpack_from`` each; any
other layout (key_partition, uid, tags, or another FlatBuffers writer's) goes
through ``decode_message``. Either way the values are exactly those of
``decode_run``, and a malformed message raises RemoteProtocolError as it does.

Decoding is eager per run rather than lazy per field: ``Message`` stays the
immutable NamedTuple every caller knows (equality, unpacking, ``_replace``),
and a lazy view would pay a Python-level property call on every field read,
which costs more than this whole path does per message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Final

from broky.compiled import compiled_twin
from broky.protocol.codec import u32_array
from broky.protocol.frames import Run
from broky.protocol.message import Message, decode_message

#: The fixed bytes of that layout (see ``broky.protocol.message``): root
#: uoffset 20, the vtable (14 bytes, table 28 bytes, payload@12, ts_producer@4,
#: no key_partition, uid or tags), 2 bytes of vtable padding, the table's
#: soffset 16.
FAST_PREFIX: Final = struct.pack("<I7H2xi", 20, 14, 28, 0, 12, 4, 0, 0, 16)
#: The payload field's uoffset: its vector starts 16 bytes after the field.
_PAYLOAD_UOFFSET: Final = 16
#: prefix, ts_producer, payload uoffset, (three absent uoffsets), payload length.
_FAST_HEAD: Final = struct.Struct("<24sqI12xI")
_U32: Final = struct.Struct("<I")
_PAYLOAD_AT: Final = _FAST_HEAD.size
#: Formats that cut a run of equal messages, by (message size, payload length).
_UNIFORM_FORMATS: dict[tuple[int, int], struct.Struct] = {}
#: Entries kept in _UNIFORM_FORMATS: a few distinct sizes per application.
_MAX_UNIFORM_FORMATS: Final = 256

_new_message = tuple.__new__


def decode_delivered_run(run: Run) -> list[Message]:
    """Every message of ``run``, equal to ``decode_run(run)``; raises
    RemoteProtocolError on the first malformed message as it does."""
    count = run.count
    if not count:
        return []
    key = run.key.decode(errors="replace")
    if count == 1:
        # Keys change on almost every message in real traffic, so most runs
        # hold one: cutting columns costs more than one unpack then.
        return _single(run, key)
    sizes = u32_array(memoryview(run.sizes))
    size = sizes[0]
    if size >= _PAYLOAD_AT and list(sizes).count(size) == count:
        messages = uniform_messages(run, key, size)
        if messages is not None:
            return messages
    return _varied(run, key, sizes)


def _columns(run: Run, key: str, payloads: Iterable[bytes], stamps: Iterable[int]) -> list[Message]:
    """Build the run's Messages from its payload and ts_producer columns."""
    count = run.count
    if run.base_offset < 0:
        partitions: Iterable[int] = repeat(-1, count)
        offsets: Iterable[int] = repeat(-1, count)
    else:
        partitions = repeat(run.partition, count)
        offsets = range(run.base_offset, run.base_offset + count)
    rows = zip(
        repeat(key, count),
        payloads,
        repeat(b"", count),
        stamps,
        repeat(run.ts_broker, count),
        repeat(b"", count),
        repeat((), count),
        partitions,
        offsets,
        strict=True,
    )
    return list(map(_new_message, repeat(Message, count), rows))


def uniform_messages_pure(run: Run, key: str, size: int) -> list[Message] | None:
    """A run of ``count`` messages of ``size`` bytes, all in the fixed layout
    with one payload length, cut in one pass; None when any one is not
    (``broky.client._uniform`` is its compiled twin)."""
    prefix, _, uoffset, payload_length = _FAST_HEAD.unpack_from(run.messages, 0)
    if prefix != FAST_PREFIX or uoffset != _PAYLOAD_UOFFSET:
        return None
    padding = size - _PAYLOAD_AT - payload_length
    if padding < 0:
        return None
    cutter = _UNIFORM_FORMATS.get((size, payload_length))
    if cutter is None:
        if len(_UNIFORM_FORMATS) >= _MAX_UNIFORM_FORMATS:
            _UNIFORM_FORMATS.clear()
        cutter = _UNIFORM_FORMATS[size, payload_length] = struct.Struct(
            f"<24sqI12xI{payload_length}s{padding}x"
        )
    prefixes, stamps, uoffsets, lengths, payloads = zip(
        *cutter.iter_unpack(run.messages), strict=True
    )
    count = run.count
    if (
        prefixes.count(FAST_PREFIX) != count
        or uoffsets.count(_PAYLOAD_UOFFSET) != count
        or lengths.count(payload_length) != count
    ):
        return None
    return _columns(run, key, payloads, stamps)


#: The compiled cutter (``broky.client._uniform``) when it is built.
_uniform_compiled: Callable[..., list[Message] | None] | None = compiled_twin(
    "broky.client._uniform", "uniform_messages"
)


def uniform_messages(run: Run, key: str, size: int) -> list[Message] | None:
    """``uniform_messages_pure``, compiled when the extension is built."""
    if _uniform_compiled is None:
        return uniform_messages_pure(run, key, size)
    return _uniform_compiled(
        run.messages,
        run.count,
        size,
        FAST_PREFIX,
        key,
        run.ts_broker,
        run.partition,
        run.base_offset,
        Message,
    )


def _single(run: Run, key: str) -> list[Message]:
    """A run of one message: ``_varied``'s fixed-layout step without its loop."""
    (size,) = _U32.unpack_from(run.sizes)
    data = run.messages
    if size >= _PAYLOAD_AT:
        prefix, stamp, uoffset, payload_length = _FAST_HEAD.unpack_from(data, 0)
        end = _PAYLOAD_AT + payload_length
        if prefix == FAST_PREFIX and uoffset == _PAYLOAD_UOFFSET and end <= size:
            base = run.base_offset
            partition, offset = (run.partition, base) if base >= 0 else (-1, -1)
            payload = bytes(data[_PAYLOAD_AT:end])
            row = (key, payload, b"", stamp, run.ts_broker, b"", (), partition, offset)
            return [_new_message(Message, row)]
    return _varied(run, key, (size,))


def _varied(run: Run, key: str, sizes: Sequence[int]) -> list[Message]:
    """Message by message: one ``unpack_from`` for the fixed layout,
    ``decode_message`` for any other."""
    data = bytes(run.messages)
    view = memoryview(data)
    ts_broker, base = run.ts_broker, run.base_offset
    partition = run.partition if base >= 0 else -1
    unpack = _FAST_HEAD.unpack_from
    messages: list[Message] = []
    append = messages.append
    position = 0
    for index, size in enumerate(sizes):
        end = position + size
        offset = base + index if base >= 0 else -1
        if size >= _PAYLOAD_AT:
            prefix, stamp, uoffset, payload_length = unpack(data, position)
            payload_at = position + _PAYLOAD_AT
            if (
                prefix == FAST_PREFIX
                and uoffset == _PAYLOAD_UOFFSET
                and payload_at + payload_length <= end
            ):
                payload = data[payload_at : payload_at + payload_length]
                append(
                    _new_message(
                        Message,
                        (key, payload, b"", stamp, ts_broker, b"", (), partition, offset),
                    )
                )
                position = end
                continue
        append(decode_message(view[position:end], key, ts_broker, partition, offset))
        position = end
    return messages
