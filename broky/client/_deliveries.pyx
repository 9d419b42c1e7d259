# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of ``broky.client.delivery.convert_runs_pure`` and
``settle_ranges_pure`` (see that module for what they do and why).

Each Delivery is allocated once and its ten slots stored at their offsets
(``_run_slots.slot_offsets``, checked by ``bind``), its message's fixed
bytes checked in place; runs are read through Run's slots the same way.
So a delivered message costs one object, its payload bytes and two ints,
and no Python-level call. Little-endian hosts only (elsewhere the import is
refused and the pure versions run).
"""

import sys

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_AsLongLong, PyLong_AsSsize_t, PyLong_FromLongLong
from cpython.object cimport PyObject, PyObject_RichCompareBool, PyTypeObject, Py_EQ
from cpython.ref cimport Py_DECREF
from cpython.sequence cimport PySequence_Fast, PySequence_Fast_GET_ITEM, PySequence_Fast_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport INT64_MAX, int64_t, uint8_t, uint32_t
from libc.string cimport memcmp, memcpy

from broky.client.decoding import FAST_PREFIX
from broky.client._fixed_layout cimport (
    LENGTH_AT, PAYLOAD_AT, PAYLOAD_UOFFSET, PREFIX_BYTES, STAMP_AT, UOFFSET_AT, PyType_GenericAlloc,
)
from broky.protocol._forward cimport Chunk, _chunk_at, _read_located
from broky.protocol._run_slots cimport load_slot, slot_offsets, store_slot

if sys.byteorder != "little":
    raise ImportError("the compiled delivery builder assumes a little-endian host")

# Delivery's slots, in the order of _DELIVERY_SLOTS; Run's, of _RUN_SLOTS.
cdef enum:
    D_CONSUMER, D_MESSAGE, D_TS_BROKER, D_TS_PRODUCER, D_COUNT, D_KEY, D_OFFSET, D_PARTITION
    D_PAYLOAD, D_TOPIC, D_SLOTS
cdef enum:
    R_KEY, R_TS_BROKER, R_COUNT, R_SIZES, R_MESSAGES, R_PARTITION, R_BASE_OFFSET, R_SLOTS

cdef tuple _DELIVERY_SLOTS = (
    "_consumer", "_message", "_ts_broker", "_ts_producer", "delivery_count", "key", "offset",
    "partition", "payload", "topic",
)
cdef tuple _RUN_SLOTS = ("key", "ts_broker", "count", "sizes", "messages", "partition", "base_offset")
cdef Py_ssize_t _DELIVERY[D_SLOTS]
cdef Py_ssize_t _RUN[R_SLOTS]
cdef type _delivery_type = None
cdef type _run_type = None
cdef bytes _PREFIX = FAST_PREFIX
cdef object _ONE = 1
cdef object _NO_OFFSET = -1


def bind(type delivery_type, type run_type):
    """Learn the slot offsets of ``delivery_type`` and ``run_type``; False
    (the twins then refuse to run) when either is not laid out as plain
    object slots."""
    global _delivery_type, _run_type
    if len(_PREFIX) != PREFIX_BYTES:
        return False
    if not (
        slot_offsets(delivery_type, _DELIVERY_SLOTS, _DELIVERY)
        and slot_offsets(run_type, _RUN_SLOTS, _RUN)
    ):
        return False
    _delivery_type, _run_type = delivery_type, run_type
    return True


cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    cdef uint32_t value
    memcpy(&value, p, 4)
    return value


cdef bint _all_fixed(const uint8_t* sizes, Py_ssize_t count, const uint8_t* data,
                     Py_ssize_t data_len) noexcept:
    """Whether the sizes cover ``data`` exactly and every message is in the
    fixed layout with its payload inside it (``delivery._fast_rows``)."""
    cdef const uint8_t* prefix = <const uint8_t*>PyBytes_AS_STRING(_PREFIX)
    cdef Py_ssize_t index, position = 0
    cdef int64_t size
    for index in range(count):
        size = _u32(sizes + 4 * index)
        if size < PAYLOAD_AT or position + size > data_len:
            return False
        if (
            memcmp(data + position, prefix, PREFIX_BYTES) != 0
            or _u32(data + position + UOFFSET_AT) != PAYLOAD_UOFFSET
            or PAYLOAD_AT + <int64_t>_u32(data + position + LENGTH_AT) > size
        ):
            return False
        position += size
    return position == data_len


cdef inline object _slot(object source, Py_ssize_t offset):
    cdef PyObject* value = load_slot(<PyObject*>source, offset)
    if value == NULL:
        raise AttributeError("a slot of a delivered run or delivery is not set")
    return <object>value


cdef object _new_delivery():
    # A new reference, and <object> takes one more: give that one back.
    cdef object delivery = <object>PyType_GenericAlloc(<PyTypeObject*>_delivery_type, 0)
    Py_DECREF(delivery)
    return delivery


cdef int _append_deliveries(list into, object consumer, object topic, dict counts, object key,
                            object partition, object ts_broker, int64_t base,
                            const uint8_t* sizes, const uint8_t* data,
                            Py_ssize_t count) except -1:
    """Append the Deliveries of a run's ``count`` messages at ``data``, all
    in the fixed layout (``_all_fixed`` said so), the first at offset
    ``base`` (-1: none)."""
    cdef Py_ssize_t index, position = 0
    cdef const uint8_t* start
    cdef int64_t stamp
    cdef object offset, delivery_count, delivery
    cdef PyObject* target
    for index in range(count):
        start = data + position
        memcpy(&stamp, start + STAMP_AT, 8)
        offset = PyLong_FromLongLong(base + index) if base >= 0 else _NO_OFFSET
        delivery_count = counts.pop((topic, partition, offset), _ONE) if counts else _ONE
        delivery = _new_delivery()
        target = <PyObject*>delivery
        store_slot(target, _DELIVERY[D_CONSUMER], consumer)
        store_slot(target, _DELIVERY[D_MESSAGE], None)
        store_slot(target, _DELIVERY[D_TS_BROKER], ts_broker)
        store_slot(target, _DELIVERY[D_TS_PRODUCER], PyLong_FromLongLong(stamp))
        store_slot(target, _DELIVERY[D_COUNT], delivery_count)
        store_slot(target, _DELIVERY[D_KEY], key)
        store_slot(target, _DELIVERY[D_OFFSET], offset)
        store_slot(target, _DELIVERY[D_PARTITION], partition)
        store_slot(
            target,
            _DELIVERY[D_PAYLOAD],
            PyBytes_FromStringAndSize(<const char*>start + PAYLOAD_AT, _u32(start + LENGTH_AT)),
        )
        store_slot(target, _DELIVERY[D_TOPIC], topic)
        into.append(delivery)
        position += _u32(sizes + 4 * index)
    return 0


def convert_runs(object runs, Py_ssize_t max_runs, Py_ssize_t limit, Py_ssize_t taken,
                 object consumer, object topic, dict counts, list into):
    """See ``broky.client.delivery.convert_runs_pure``."""
    cdef Py_ssize_t used = 0, count
    cdef Py_buffer sizes_buffer, messages_buffer
    cdef const uint8_t* sizes
    cdef const uint8_t* data
    cdef int64_t base
    cdef bint fixed
    cdef object run, key_bytes
    if _delivery_type is None:
        raise RuntimeError("bind() was not called, or refused the types")
    while used < max_runs and runs:
        run = runs[0]
        if type(run) is not _run_type:
            break
        count = PyLong_AsSsize_t(_slot(run, _RUN[R_COUNT]))
        if taken and taken + count > limit:
            break
        key_bytes = _slot(run, _RUN[R_KEY])
        if not PyBytes_Check(key_bytes) or count < 0:
            break
        PyObject_GetBuffer(_slot(run, _RUN[R_SIZES]), &sizes_buffer, PyBUF_SIMPLE)
        try:
            PyObject_GetBuffer(_slot(run, _RUN[R_MESSAGES]), &messages_buffer, PyBUF_SIMPLE)
            try:
                sizes = <const uint8_t*>sizes_buffer.buf
                data = <const uint8_t*>messages_buffer.buf
                fixed = sizes_buffer.len == 4 * count and _all_fixed(
                    sizes, count, data, messages_buffer.len
                )
                if not fixed:
                    break
                runs.popleft()
                base = PyLong_AsLongLong(_slot(run, _RUN[R_BASE_OFFSET]))
                _append_deliveries(
                    into, consumer, topic, counts,
                    PyUnicode_DecodeUTF8(
                        PyBytes_AS_STRING(key_bytes), PyBytes_GET_SIZE(key_bytes), "replace"
                    ),
                    _slot(run, _RUN[R_PARTITION]) if base >= 0 else _NO_OFFSET,
                    _slot(run, _RUN[R_TS_BROKER]), base, sizes, data, count,
                )
            finally:
                PyBuffer_Release(&messages_buffer)
        finally:
            PyBuffer_Release(&sizes_buffer)
        used += 1
        taken += count
    return used, taken


def convert_located(object frame, Py_ssize_t limit, Py_ssize_t taken, object consumer,
                    object topic, dict counts, list into):
    """``convert_runs`` over the runs a ``FrameRuns`` (broky.client.buffered)
    has left in its frame, read in place (no Run built), advancing it past
    each one converted: whole runs while ``taken`` plus their messages stays
    within ``limit`` (the first whatever its size when ``taken`` is 0),
    stopping before a run not all in the fixed layout. Returns (runs
    converted, ``taken`` plus their messages)."""
    cdef Py_buffer frame_buffer
    cdef const uint8_t* buf
    cdef int64_t size, slot = frame.slot, base_offset
    cdef Py_ssize_t runs = frame.runs, done = 0
    cdef uint32_t partition
    cdef Chunk chunk
    if _delivery_type is None:
        raise RuntimeError("bind() was not called, or refused the types")
    PyObject_GetBuffer(frame.buffer, &frame_buffer, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t*>frame_buffer.buf
        size = frame_buffer.len
        while runs:
            if slot < 0 or slot + 4 > size or not _read_located(
                buf, size, _chunk_at(buf, slot), &chunk, &partition, &base_offset
            ):
                break  # not what count_located checked: take_run says so
            if taken and taken + chunk.count > limit:
                break
            if not _all_fixed(chunk.sizes, chunk.count, chunk.messages, chunk.messages_len):
                break
            _append_deliveries(
                into, consumer, topic, counts,
                PyUnicode_DecodeUTF8(<const char*>chunk.key, chunk.key_len, "replace"),
                PyLong_FromLongLong(partition) if base_offset >= 0 else _NO_OFFSET,
                PyLong_FromLongLong(chunk.ts_broker), base_offset, chunk.sizes, chunk.messages,
                chunk.count,
            )
            slot += 4
            runs -= 1
            done += 1
            taken += chunk.count
    finally:
        PyBuffer_Release(&frame_buffer)
        frame.slot = slot
        frame.runs = runs
    return done, taken


cdef class _Fold:
    """One (topic, partition)'s ranges while ``settle_ranges`` folds."""
    cdef object topic, partition
    cdef list firsts, lasts
    cdef int64_t last
    cdef bint ascending


def settle_ranges(deliveries):
    """See ``broky.client.delivery.settle_ranges_pure``."""
    cdef object items = PySequence_Fast(deliveries, "deliveries must be a sequence")
    cdef Py_ssize_t size = PySequence_Fast_GET_SIZE(items), index
    cdef dict folds = {}
    cdef list order = []
    cdef _Fold fold = None
    cdef object item, item_topic, item_partition, offset, found
    cdef int64_t value
    if _delivery_type is None:
        raise RuntimeError("bind() was not called, or refused the types")
    for index in range(size):
        item = <object>PySequence_Fast_GET_ITEM(items, index)
        if type(item) is _delivery_type:
            offset = _slot(item, _DELIVERY[D_OFFSET])
            item_partition = _slot(item, _DELIVERY[D_PARTITION])
            item_topic = _slot(item, _DELIVERY[D_TOPIC])
        else:
            offset, item_partition, item_topic = item.offset, item.partition, item.topic
        value = PyLong_AsLongLong(offset)
        if fold is None or not (
            PyObject_RichCompareBool(item_partition, fold.partition, Py_EQ)
            and PyObject_RichCompareBool(item_topic, fold.topic, Py_EQ)
        ):
            pair = (item_topic, item_partition)
            found = folds.get(pair)
            if found is None:
                fold = _Fold()
                fold.topic, fold.partition = item_topic, item_partition
                fold.firsts, fold.lasts = [offset], [offset]
                fold.last, fold.ascending = value, True
                folds[pair] = fold
                order.append(fold)
                continue
            fold = <_Fold>found
        if fold.last != INT64_MAX and value == fold.last + 1:
            fold.lasts[len(fold.lasts) - 1] = offset
            fold.last = value
            continue
        if value <= fold.last:
            fold.ascending = False
        fold.firsts.append(offset)
        fold.lasts.append(offset)
        fold.last = value
    return [
        (fold.topic, fold.partition, fold.firsts, fold.lasts, fold.ascending) for fold in order
    ]
