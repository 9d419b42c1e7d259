# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``broky.storage.topics.message_partitions_pure``.

Why: a durable topic's owner is chosen per message when messages carry
their own ``key_partition`` (or when every message has its own key, one
message per run): the pure version's struct reads, slices and calls cost
about 0.9 us per message there, a fifth of the broker's whole durable
path. This reads the same fields with the same bounds checks in C; a
message whose field it cannot read on the fast path (garbage, another
layout) goes to ``key_partition``, the validated walk, exactly as the pure
version does, so both answer or raise alike (hypothesis tests compare them).
Little-endian hosts only: elsewhere the import is refused.
"""

import sys

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy

import xxhash

from broky.storage.topics import key_partition

if sys.byteorder != "little":
    raise ImportError("the compiled partition reader assumes a little-endian host")

_xxh3 = xxhash.xxh3_64_intdigest


cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    cdef uint32_t value
    memcpy(&value, p, 4)
    return value


cdef inline int32_t _i32(const uint8_t* p) noexcept nogil:
    cdef int32_t value
    memcpy(&value, p, 4)
    return value


cdef inline uint16_t _u16(const uint8_t* p) noexcept nogil:
    cdef uint16_t value
    memcpy(&value, p, 2)
    return value


cdef inline bint _has_key_partition(const uint8_t* buf, int64_t size, int64_t position) noexcept nogil:
    """``topics._has_key_partition``: any read out of ``buf`` answers True
    (there, a ``struct.error``: the validated path says what is wrong)."""
    cdef int64_t table, vtable
    if size - position >= 24:  # topics._USUAL_HEAD
        if _u32(buf + position) == 20 and _i32(buf + position + 20) == 16:
            return _u16(buf + position + 4) > 4 and _u16(buf + position + 8) != 0
    if position + 4 > size:
        return True
    table = position + <int64_t>_u32(buf + position)
    if table + 4 > size:
        return True
    vtable = table - <int64_t>_i32(buf + table)
    if vtable < 0:
        return True
    if vtable + 2 > size:
        return True
    if _u16(buf + vtable) <= 4:
        return False
    if vtable + 6 > size:
        return True
    return _u16(buf + vtable + 4) != 0


cdef inline int64_t _key_start(const uint8_t* message, int64_t size, int64_t* end) noexcept nogil:
    """Where the fast path of ``topics.key_partition`` finds the field's
    bytes in ``message`` (``end`` set), or -1 where it would fall back."""
    cdef int64_t table, vtable, start, stop
    cdef uint16_t vtable_size, table_size, slot
    if size < 4:
        return -1
    table = _u32(message)
    if not (0 <= table <= size - 4):
        return -1
    vtable = table - <int64_t>_i32(message + table)
    if not (0 <= vtable <= size - 6):
        return -1
    vtable_size = _u16(message + vtable)
    table_size = _u16(message + vtable + 2)
    slot = _u16(message + vtable + 4)
    if not (
        vtable_size >= 6
        and not vtable_size & 1
        and vtable + vtable_size <= size
        and 4 <= slot < table_size
        and table + table_size <= size
    ):
        return -1
    if table + slot + 4 > size:  # the pure version's unpack raises: fall back
        return -1
    start = table + slot + <int64_t>_u32(message + table + slot)
    if start > size - 4:
        return -1
    stop = start + 4 + <int64_t>_u32(message + start)
    if stop > size:
        return -1
    end[0] = stop
    return start + 4


def message_partitions(messages, sizes, Py_ssize_t partitions, default):
    """See ``broky.storage.topics.message_partitions_pure``."""
    cdef Py_buffer messages_buffer, sizes_buffer
    cdef const uint8_t* buf
    cdef const uint8_t* size_table
    cdef int64_t total, position = 0, size, start, end = 0
    cdef Py_ssize_t index, count
    cdef list targets = []
    cdef object partition_key
    PyObject_GetBuffer(messages, &messages_buffer, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(sizes, &sizes_buffer, PyBUF_SIMPLE)
        try:
            buf = <const uint8_t*>messages_buffer.buf
            total = messages_buffer.len
            size_table = <const uint8_t*>sizes_buffer.buf
            count = sizes_buffer.len // 4
            for index in range(count):
                size = _u32(size_table + 4 * index)
                if not _has_key_partition(buf, total, position):
                    targets.append(default)
                else:
                    start = -1
                    if position + size <= total:
                        start = _key_start(buf + position, size, &end)
                    if start >= 0:
                        partition_key = PyBytes_FromStringAndSize(
                            <const char*>(buf + position + start), end - start
                        )
                    else:
                        partition_key = key_partition(
                            memoryview(messages)[position : position + size]
                        )
                    if partition_key:
                        targets.append(_xxh3(partition_key) % partitions)
                    else:
                        targets.append(default)
                position += size
        finally:
            PyBuffer_Release(&sizes_buffer)
    finally:
        PyBuffer_Release(&messages_buffer)
    return targets
