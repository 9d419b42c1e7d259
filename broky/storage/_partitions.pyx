# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of ``broky.storage.topics.message_partitions_pure``,
``broky.storage.grouping.partition_groups_pure`` and
``broky.subscriptions.slots.message_slots_pure``.

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
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_GET_ITEM
from cpython.object cimport PyObject
from broky.protocol._run_slots cimport (
    RUN_COUNT, RUN_KEY, RUN_MESSAGES, RUN_SIZES, RUN_TS_BROKER, new_run, run_field,
)
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy

import xxhash

from broky.storage.topics import key_partition

if sys.byteorder != "little":
    raise ImportError("the compiled partition reader assumes a little-endian host")

_xxh3 = xxhash.xxh3_64_intdigest


cdef extern from *:
    """
    #define XXH_INLINE_ALL
    #include "xxhash.h"
    """
    # xxHash's own XXH3 (``vendor/xxhash``, the algorithm and version the
    # ``xxhash`` package wraps): hashed where the key lies, with no bytes
    # object, call or dict lookup per key.
    unsigned long long XXH3_64bits(const void* data, size_t length) nogil


#: One int object per slot (65,536 of them at most, made at first use): the
#: dispatcher's slot maps are dicts keyed by slot, and a lookup whose key
#: is the very object stored there skips the value comparison a fresh int
#: costs (with a new int per message, each of the feed's and the ack's
#: slot lookups cost ~50 instructions more).
cdef list _SLOT_OBJECTS = [None] * 65536


cdef inline object _slot_at(const void* key, Py_ssize_t length):
    """``slots.slot_of`` of the ``length`` bytes at ``key``."""
    cdef Py_ssize_t slot = <Py_ssize_t>(XXH3_64bits(key, <size_t>length) >> 48)
    cdef object found = <object>PyList_GET_ITEM(_SLOT_OBJECTS, slot)
    if found is None:
        found = slot
        _SLOT_OBJECTS[slot] = found
    return found


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


cdef object _message_partition(
    object messages, const uint8_t* buf, int64_t total, int64_t position, int64_t size,
    object partitions, object default,
):
    """The partition of the message of ``size`` bytes at ``position`` of
    ``buf`` (``messages``' bytes, ``total`` long)."""
    cdef int64_t start = -1, end = 0
    cdef object partition_key
    if not _has_key_partition(buf, total, position):
        return default
    if position + size <= total:
        start = _key_start(buf + position, size, &end)
    if start >= 0:
        partition_key = PyBytes_FromStringAndSize(<const char*>(buf + position + start), end - start)
    else:
        partition_key = key_partition(memoryview(messages)[position : position + size])
    if partition_key:
        return _xxh3(partition_key) % partitions
    return default


cdef object _message_slot(
    object messages, const uint8_t* buf, int64_t total, int64_t position, int64_t size,
    object run_slot,
):
    """The key-shared slot of the message of ``size`` bytes at ``position``
    of ``buf``: its ``key_partition``'s, else ``run_slot`` (its run key's)."""
    cdef int64_t start = -1, end = 0
    cdef object sticky
    if not _has_key_partition(buf, total, position):
        return run_slot
    if position + size <= total:
        start = _key_start(buf + position, size, &end)
    if start >= 0:
        if end == start:
            return run_slot  # an empty key_partition: the run key's slot
        return _slot_at(buf + position + start, end - start)
    sticky = key_partition(memoryview(messages)[position : position + size])
    if sticky:
        return _xxh3(sticky) >> 48
    return run_slot


def message_slots(batch, int64_t start, int64_t stop):
    """See ``broky.subscriptions.slots.message_slots_pure``."""
    cdef object counts = batch.counts, key_lengths = batch.key_lengths, messages = batch.messages
    cdef Py_buffer keys_buffer, sizes_buffer, messages_buffer
    cdef const uint8_t* size_table
    cdef Py_ssize_t runs = len(counts), run, index, sized
    cdef int64_t offset = batch.base_offset, key_at = 0, position = 0, count, key_length, size
    cdef Py_ssize_t message = 0
    cdef list slots = []
    cdef object run_slot
    if len(key_lengths) != runs:
        raise ValueError("run columns of different lengths")
    PyObject_GetBuffer(batch.keys, &keys_buffer, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(batch.sizes, &sizes_buffer, PyBUF_SIMPLE)
        try:
            PyObject_GetBuffer(messages, &messages_buffer, PyBUF_SIMPLE)
            try:
                size_table = <const uint8_t*>sizes_buffer.buf
                sized = sizes_buffer.len // 4
                for run in range(runs):
                    if offset >= stop:
                        break
                    count = counts[run]
                    key_length = key_lengths[run]
                    if (count < 0 or message + count > sized or key_length < 0
                            or key_at + key_length > keys_buffer.len):
                        raise IndexError("run table runs past the batch")
                    if offset + count <= start:
                        for index in range(message, message + count):
                            position += _u32(size_table + 4 * index)
                    else:
                        run_slot = _slot_at(<const char*>keys_buffer.buf + key_at, key_length)
                        for index in range(message, message + count):
                            size = _u32(size_table + 4 * index)
                            if start <= offset + index - message < stop:
                                slots.append(
                                    _message_slot(
                                        messages, <const uint8_t*>messages_buffer.buf,
                                        messages_buffer.len, position, size, run_slot,
                                    )
                                )
                            position += size
                    offset += count
                    message += count
                    key_at += key_length
            finally:
                PyBuffer_Release(&messages_buffer)
        finally:
            PyBuffer_Release(&sizes_buffer)
    finally:
        PyBuffer_Release(&keys_buffer)
    return slots


def message_partitions(messages, sizes, Py_ssize_t partitions, default):
    """See ``broky.storage.topics.message_partitions_pure``."""
    cdef Py_buffer messages_buffer, sizes_buffer
    cdef const uint8_t* size_table
    cdef int64_t position = 0, size
    cdef Py_ssize_t index
    cdef list targets = []
    cdef object modulus = partitions
    PyObject_GetBuffer(messages, &messages_buffer, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(sizes, &sizes_buffer, PyBUF_SIMPLE)
        try:
            size_table = <const uint8_t*>sizes_buffer.buf
            for index in range(sizes_buffer.len // 4):
                size = _u32(size_table + 4 * index)
                targets.append(
                    _message_partition(
                        messages, <const uint8_t*>messages_buffer.buf, messages_buffer.len,
                        position, size, modulus, default,
                    )
                )
                position += size
        finally:
            PyBuffer_Release(&sizes_buffer)
    finally:
        PyBuffer_Release(&messages_buffer)
    return targets


cdef object _run_partition(object messages, object sizes, object partitions, object default,
                           int64_t* messages_length):
    """The one partition of every message of a run (its ``messages`` and
    ``sizes``), or None when its messages go to several (``partition_groups``'
    caller splits it); sets the length of its messages."""
    cdef Py_buffer messages_buffer, sizes_buffer
    cdef const uint8_t* size_table
    cdef int64_t position = 0, size
    cdef Py_ssize_t index
    cdef object first = None, target
    PyObject_GetBuffer(messages, &messages_buffer, PyBUF_SIMPLE)
    try:
        messages_length[0] = messages_buffer.len
        PyObject_GetBuffer(sizes, &sizes_buffer, PyBUF_SIMPLE)
        try:
            size_table = <const uint8_t*>sizes_buffer.buf
            for index in range(sizes_buffer.len // 4):
                size = _u32(size_table + 4 * index)
                target = _message_partition(
                    messages, <const uint8_t*>messages_buffer.buf, messages_buffer.len,
                    position, size, partitions, default,
                )
                if index == 0:
                    first = target
                elif target != first:
                    return None
                position += size
        finally:
            PyBuffer_Release(&sizes_buffer)
    finally:
        PyBuffer_Release(&messages_buffer)
    return first


cdef object _new_piece(object run, Py_ssize_t count, bytes sizes, bytes messages):
    """``Run(run.key, run.ts_broker, count, sizes, messages)`` without the
    frozen attrs ``__init__`` (an ``object.__setattr__`` call per field):
    built as the compiled chunk reader builds its runs (broky.protocol._run_slots)."""
    return new_run(run_field(run, RUN_KEY), run_field(run, RUN_TS_BROKER), count, sizes, messages,
                   None)


cdef list _split_run(object run, list targets):
    """``broky.storage.topics.split_run`` with the pieces' bytes copied:
    ``(partition, piece)`` pairs in message order."""
    cdef Py_buffer messages_buffer, sizes_buffer
    cdef const uint8_t* size_table
    cdef const char* data
    cdef int64_t position = 0, length = 0
    cdef Py_ssize_t index, start = 0, total = len(targets)
    cdef list pieces = []
    PyObject_GetBuffer(run.messages, &messages_buffer, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(run.sizes, &sizes_buffer, PyBUF_SIMPLE)
        try:
            if sizes_buffer.len // 4 != total:
                raise ValueError("one partition per message expected")
            size_table = <const uint8_t*>sizes_buffer.buf
            data = <const char*>messages_buffer.buf
            for index in range(total):
                length += _u32(size_table + 4 * index)
                if index + 1 == total or targets[index + 1] != targets[start]:
                    if position + length > messages_buffer.len:
                        raise ValueError("a run's sizes overrun its messages")
                    pieces.append(
                        (
                            targets[start],
                            _new_piece(
                                run,
                                index + 1 - start,
                                PyBytes_FromStringAndSize(
                                    <const char*>(size_table + 4 * start), 4 * (index + 1 - start)
                                ),
                                PyBytes_FromStringAndSize(data + position, length),
                            ),
                        )
                    )
                    position += length
                    length = 0
                    start = index + 1
        finally:
            PyBuffer_Release(&sizes_buffer)
    finally:
        PyBuffer_Release(&messages_buffer)
    return pieces


cdef object _MISSING = None


cdef inline Py_ssize_t _add(
    list groups, object partition, object run, Py_ssize_t count, Py_ssize_t index,
    object sequence,
) except -1:
    """``run`` (``count`` messages, the frame's ``index``-th run, first
    sequence ``sequence``) into ``partition``'s group, made on first use;
    the group's position (its totals are kept in C until the pass ends)."""
    cdef Py_ssize_t position = partition
    if not 0 <= position < len(groups):
        raise IndexError(f"partition {position} of {len(groups)}")
    cdef list group = groups[position]
    if group is None:
        group = groups[position] = [[], [], [], [], 0, 0]
    (<list>group[0]).append(run)
    (<list>group[1]).append(count)
    (<list>group[2]).append(index)
    (<list>group[3]).append(sequence)
    return position


def partition_groups(runs, dict located, first_sequence):
    """See ``broky.storage.grouping.partition_groups_pure``: the same
    groups, each run's fields loaded at their slots (``run_field``) and the
    groups' message and byte totals added up in C, written once at the end."""
    global _MISSING
    if _MISSING is None:  # grouping imports this module: its sentinel, once loaded
        from broky.storage.grouping import MISSING
        _MISSING = MISSING
    cdef int64_t* totals = NULL  # per partition: its messages, then their bytes
    try:
        return _grouped(runs, located, first_sequence, &totals)
    finally:
        PyMem_Free(totals)


cdef object _grouped(runs, dict located, object first_sequence, int64_t** totals_at):
    """``partition_groups``' pass; ``totals_at`` receives the totals array
    it allocates (the caller frees it, however the pass ends)."""
    cdef list ephemeral = []
    cdef list groups = []
    cdef list pieces
    cdef object topic = None
    cdef object modulus = None
    cdef object run, key, found, partition, piece, piece_sequence
    cdef Py_ssize_t index = 0, count, piece_count, position, partitions = 0
    cdef int64_t messages_length = 0
    cdef object sequence = first_sequence
    cdef PyObject* entry
    cdef int64_t* totals = NULL
    for run in runs:
        key = run_field(run, RUN_KEY)
        entry = PyDict_GetItem(located, key)
        if entry == NULL:
            return _MISSING
        found = <object>entry
        count = run_field(run, RUN_COUNT)
        if found is None:
            ephemeral.append(run)
        elif count:
            if topic is None:
                topic = (<tuple>found)[0]
                modulus = topic.partitions
                groups = [None] * modulus
                partitions = len(groups)
                totals = totals_at[0] = <int64_t*>PyMem_Calloc(2 * partitions, sizeof(int64_t))
                if totals == NULL:
                    raise MemoryError()
            elif (<tuple>found)[0] is not topic:
                return None
            partition = _run_partition(
                run_field(run, RUN_MESSAGES), run_field(run, RUN_SIZES), modulus,
                (<tuple>found)[1], &messages_length,
            )
            if partition is not None:
                position = _add(groups, partition, run, count, index, sequence)
                totals[2 * position] += count
                totals[2 * position + 1] += messages_length
            else:  # each message its own key_partition: cut where it changes
                pieces = _split_run(
                    run,
                    message_partitions(
                        run_field(run, RUN_MESSAGES), run_field(run, RUN_SIZES), modulus,
                        (<tuple>found)[1],
                    ),
                )
                piece_sequence = sequence
                for partition, piece in pieces:
                    piece_count = run_field(piece, RUN_COUNT)
                    position = _add(groups, partition, piece, piece_count, index, piece_sequence)
                    totals[2 * position] += piece_count
                    totals[2 * position + 1] += len(run_field(piece, RUN_MESSAGES))
                    piece_sequence += piece_count
        sequence += count
        index += 1
    for position in range(partitions):
        group = groups[position]
        if group is not None:
            group[4] = totals[2 * position]
            group[5] = totals[2 * position + 1]
    return ephemeral, topic, groups
