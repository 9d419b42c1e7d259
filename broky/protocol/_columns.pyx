# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twins of ``broky.storage.batch_reading.distinct_keys_pure`` (the
distinct run keys of a stored batch's span) and
``broky.durable.acks.ack_columns_pure`` (a PublishAck's entry columns):
column passes over a batch's or a frame's runs, apart from the chunk
writers of ``broky.protocol._vectors`` (see the pure versions for what
they do and why)."""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport int64_t
from libc.string cimport memcmp


# Keys remembered by address in ``distinct_keys`` before it turns to the set.
cdef enum:
    _KNOWN_KEYS = 16


def distinct_keys(counts, key_lengths, keys, int64_t base_offset, int64_t start,
                  int64_t stop):
    """See ``broky.storage.batch_reading.distinct_keys_pure``: the same set,
    with a ``bytes`` made only for a key unlike the (up to 16) distinct
    ones met before it, instead of one per run."""
    cdef Py_buffer keys_buffer
    cdef Py_ssize_t runs = len(counts), index
    cdef int64_t offset = base_offset, key_at = 0, key_length
    cdef const char* known_at[_KNOWN_KEYS]
    cdef int64_t known_length[_KNOWN_KEYS]
    cdef int known = 0, slot
    cdef const char* key
    cdef set found = set()
    if len(key_lengths) != runs:
        raise ValueError("run columns of different lengths")
    PyObject_GetBuffer(keys, &keys_buffer, PyBUF_SIMPLE)
    try:
        for index in range(runs):
            if offset >= stop:
                break
            offset += <int64_t>counts[index]
            key_length = key_lengths[index]
            if key_length < 0 or key_at + key_length > keys_buffer.len:
                raise ValueError("run table runs past the batch")
            if offset > start:
                key = <const char*>keys_buffer.buf + key_at
                for slot in range(known):
                    if (known_length[slot] == key_length
                            and memcmp(known_at[slot], key, key_length) == 0):
                        break
                else:
                    found.add(PyBytes_FromStringAndSize(key, key_length))
                    if known < _KNOWN_KEYS:
                        known_at[known] = key
                        known_length[known] = key_length
                        known += 1
            key_at += key_length
        return found
    finally:
        PyBuffer_Release(&keys_buffer)


# Run indexes ``ack_columns`` orders by counting, past the entries' number:
# a frame's runs are indexed from 0, so its acked ones lie below its run count.
cdef enum:
    _SPARE_RUN_INDEXES = 1024


def ack_columns(list run_indexes, list partitions, list firsts, list lasts):
    """See ``broky.durable.acks.ack_columns_pure``: the same four tuples
    when no run index repeats, laid out by a counting pass over the run
    indexes (a slot per index, no comparison sort, no per-entry Python
    step); None when one repeats, is negative or lies far past the others'
    number (the caller then takes the pure sort, which breaks such ties)."""
    cdef Py_ssize_t count = len(run_indexes), index, position, written = 0
    cdef Py_ssize_t largest = -1, run, bound
    cdef Py_ssize_t* slots
    cdef tuple ordered_runs, ordered_partitions, ordered_firsts, ordered_lasts
    if len(partitions) != count or len(firsts) != count or len(lasts) != count:
        raise ValueError("ack columns of different lengths")
    bound = count + _SPARE_RUN_INDEXES
    for index in range(count):
        run = run_indexes[index]
        if run < 0 or run >= bound:
            return None
        if run > largest:
            largest = run
    slots = <Py_ssize_t*>PyMem_Malloc((largest + 1) * sizeof(Py_ssize_t))
    if slots == NULL and largest >= 0:
        raise MemoryError()
    try:
        for position in range(largest + 1):
            slots[position] = -1
        for index in range(count):
            run = run_indexes[index]
            if slots[run] != -1:
                return None  # a run split over partitions: ties to break
            slots[run] = index
        ordered_runs = PyTuple_New(count)
        ordered_partitions = PyTuple_New(count)
        ordered_firsts = PyTuple_New(count)
        ordered_lasts = PyTuple_New(count)
        for position in range(largest + 1):
            index = slots[position]
            if index == -1:
                continue
            _place(ordered_runs, written, run_indexes[index])
            _place(ordered_partitions, written, partitions[index])
            _place(ordered_firsts, written, firsts[index])
            _place(ordered_lasts, written, lasts[index])
            written += 1
        return ordered_runs, ordered_partitions, ordered_firsts, ordered_lasts
    finally:
        PyMem_Free(slots)


cdef inline void _place(tuple into, Py_ssize_t at, object item) noexcept:
    Py_INCREF(item)
    PyTuple_SET_ITEM(into, at, item)
