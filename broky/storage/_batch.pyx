# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of ``broky.storage.batch.encode_runs_pure`` and
``broky.storage.batch.stored_byte_ends_pure``.

Why: a partition's owner encodes every round it appends, in its own thread
but holding the GIL. With a key per message a round is hundreds of
one-message runs, and the pure encoder's dozen list passes, running sums
and ``struct.pack`` argument tuples cost about a microsecond per message,
a sixth of the broker's whole durable path, while other owners and the
connections wait for the GIL. This reads each run's fields once (at
their slots: ``_run_slots.run_field``), checks
what the pure version checks (raising the same StorageError, in the same
order of checks), and writes the batch into one buffer: the same bytes
(hypothesis tests compare them). Little-endian hosts only: elsewhere the
import is refused and the pure version runs.
"""

import sys

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from broky.protocol._run_slots cimport (
    RUN_COUNT, RUN_KEY, RUN_MESSAGES, RUN_SIZES, RUN_TS_BROKER, run_field,
)
from libc.stdint cimport int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from crc32c import crc32c

from broky.storage.errors import StorageError

if sys.byteorder != "little":
    raise ImportError("the compiled batch encoder assumes a little-endian host")

# Mirrors of broky.storage.batch's constants (that module imports this one).
cdef int64_t _HEADER_BYTES = 48
cdef int64_t _RUN_ENTRY_BYTES = 16
cdef int64_t _RUN_ENTRY_BYTES_V3 = 32
cdef int64_t _MAX_KEY_BYTES = 0xFFFF
cdef int64_t _MAX_BATCH_BYTES = 64 * 1024 * 1024

cdef inline int64_t _pad8(int64_t length) noexcept:
    return -length & 7


cdef inline void _put_u32(char* out, int64_t at, uint32_t value) noexcept:
    memcpy(out + at, &value, 4)


cdef inline void _put_i64(char* out, int64_t at, int64_t value) noexcept:
    memcpy(out + at, &value, 8)


cdef inline void _put_u64(char* out, int64_t at, uint64_t value) noexcept:
    memcpy(out + at, &value, 8)


def encode_runs(int64_t base_offset, int64_t log_time, runs, ts_brokers=None, producers=None):
    """See ``broky.storage.batch.encode_runs_pure``: the same bytes, or the
    same StorageError."""
    cdef list items = list(runs)
    cdef Py_ssize_t run_count = len(items), index, held = 0
    if run_count == 0:
        raise StorageError("a batch needs at least one run")
    if ts_brokers is not None and len(ts_brokers) != run_count:
        raise StorageError(f"{len(ts_brokers)} ts_broker stamps for {run_count} runs")
    cdef list keys = [None] * run_count
    cdef int64_t* counts = <int64_t*>PyMem_Malloc(run_count * sizeof(int64_t))
    cdef Py_buffer* buffers = <Py_buffer*>PyMem_Malloc(2 * run_count * sizeof(Py_buffer))
    cdef int64_t count = 0, messages_length = 0, keys_length = 0, key_length, longest_key = 0
    cdef int64_t size_sum, length, at, sizes_at, messages_at, i, entry
    cdef bint bad_table = False, disagree = False
    cdef const unsigned char* table
    cdef uint32_t size
    cdef bytes batch
    cdef char* out
    cdef Py_buffer key_buffer
    cdef object identity
    if counts == NULL or buffers == NULL:
        PyMem_Free(counts)
        PyMem_Free(buffers)
        raise MemoryError()
    try:
        for index in range(run_count):
            run = items[index]
            key = run_field(run, RUN_KEY)
            keys[index] = key
            counts[index] = run_field(run, RUN_COUNT)
            key_length = len(key)
            keys_length += key_length
            if key_length > longest_key:
                longest_key = key_length
            PyObject_GetBuffer(run_field(run, RUN_SIZES), &buffers[2 * index], PyBUF_SIMPLE)
            held += 1
            PyObject_GetBuffer(run_field(run, RUN_MESSAGES), &buffers[2 * index + 1], PyBUF_SIMPLE)
            held += 1
            messages_length += buffers[2 * index + 1].len
            if counts[index] < 1 or buffers[2 * index].len != 4 * counts[index]:
                bad_table = True
                continue
            count += counts[index]
            table = <const unsigned char*>buffers[2 * index].buf
            size_sum = 0
            for i in range(counts[index]):
                memcpy(&size, table + 4 * i, 4)
                size_sum += size
            if size_sum != buffers[2 * index + 1].len:
                disagree = True
        if bad_table:
            raise StorageError("cannot store an empty run or one with a bad size table")
        if longest_key > _MAX_KEY_BYTES:
            raise StorageError(f"key of {longest_key} bytes exceeds {_MAX_KEY_BYTES}")
        if disagree:
            raise StorageError("run sizes do not add up to the length of its messages")
        if producers is not None and len(producers) != run_count:
            raise StorageError(f"{len(producers)} producer entries for {run_count} runs")
        entry = _RUN_ENTRY_BYTES if producers is None else _RUN_ENTRY_BYTES_V3
        sizes_at = _HEADER_BYTES + entry * run_count + keys_length + _pad8(keys_length)
        messages_at = sizes_at + 4 * count + _pad8(4 * count)
        length = messages_at + messages_length + _pad8(messages_length)
        if length > _MAX_BATCH_BYTES:
            raise StorageError(f"batch of {length} bytes exceeds {_MAX_BATCH_BYTES}")
        batch = PyBytes_FromStringAndSize(NULL, length)
        out = PyBytes_AS_STRING(batch)
        _put_u32(out, 0, <uint32_t>length)
        memcpy(out + 8, b"BKB\x02" if producers is None else b"BKB\x03", 4)
        memset(out + 12, 0, 4)  # flags and reserved
        _put_u32(out, 16, <uint32_t>count)
        _put_u32(out, 20, <uint32_t>messages_length)
        _put_i64(out, 24, base_offset)
        _put_u32(out, 32, <uint32_t>run_count)
        _put_u32(out, 36, <uint32_t>keys_length)
        _put_i64(out, 40, log_time)
        at = _HEADER_BYTES
        for index in range(run_count):
            if ts_brokers is None:
                _put_i64(out, at + 8 * index, run_field(items[index], RUN_TS_BROKER))
            else:
                _put_i64(out, at + 8 * index, ts_brokers[index])
        at += 8 * run_count
        for index in range(run_count):
            _put_u32(out, at + 4 * index, <uint32_t>counts[index])
        at += 4 * run_count
        for index in range(run_count):
            _put_u32(out, at + 4 * index, <uint32_t>len(keys[index]))
        at += 4 * run_count
        if producers is not None:
            for index in range(run_count):
                identity = producers[index]
                if type(identity) is tuple and PyTuple_GET_SIZE(identity) == 2:
                    _put_u64(out, at + 8 * index, <object>PyTuple_GET_ITEM(identity, 0))
                    _put_u64(out, at + 8 * (run_count + index),
                             <object>PyTuple_GET_ITEM(identity, 1))
                else:
                    producer, sequence = identity
                    _put_u64(out, at + 8 * index, producer)
                    _put_u64(out, at + 8 * (run_count + index), sequence)
            at += 16 * run_count
        for index in range(run_count):
            key = keys[index]
            PyObject_GetBuffer(key, &key_buffer, PyBUF_SIMPLE)
            try:
                if key_buffer.len != len(key):
                    raise StorageError("a run's key changed size while being encoded")
                memcpy(out + at, key_buffer.buf, key_buffer.len)
                at += key_buffer.len
            finally:
                PyBuffer_Release(&key_buffer)
        memset(out + at, 0, sizes_at - at)
        at = sizes_at
        for index in range(run_count):
            memcpy(out + at, buffers[2 * index].buf, buffers[2 * index].len)
            at += buffers[2 * index].len
        memset(out + at, 0, messages_at - at)
        at = messages_at
        for index in range(run_count):
            memcpy(out + at, buffers[2 * index + 1].buf, buffers[2 * index + 1].len)
            at += buffers[2 * index + 1].len
        memset(out + at, 0, length - at)
        _put_u32(out, 4, <uint32_t>crc32c(memoryview(batch)[8:]))
        return batch
    finally:
        for index in range(held):
            PyBuffer_Release(&buffers[index])
        PyMem_Free(buffers)
        PyMem_Free(counts)


def stored_byte_ends(runs):
    """See ``broky.storage.batch.stored_byte_ends_pure``."""
    cdef int64_t total = 0
    cdef list ends = []
    for run in runs:
        total += (_RUN_ENTRY_BYTES + len(run_field(run, RUN_KEY))
                  + 4 * <int64_t>run_field(run, RUN_COUNT) + len(run_field(run, RUN_MESSAGES)))
        ends.append(total)
    return ends
