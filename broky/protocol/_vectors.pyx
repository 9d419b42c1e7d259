# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twins of ``chunks.chunk_offsets_pure`` and
``chunks.encode_located_chunk``: the runs vector of a Deliver frame, one
uoffset per run, is built once per run of every frame a broker writes, and
a subscription's delivery lays out one located chunk per run. Little-endian hosts only (elsewhere the import is refused
and the pure version runs)."""

import sys

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t
from libc.string cimport memcpy, memset

if sys.byteorder != "little":
    raise ImportError("the compiled vector builder assumes a little-endian host")


def chunk_offsets(chunks, int64_t position):
    """See ``broky.protocol.chunks.chunk_offsets_pure``."""
    cdef Py_ssize_t count = len(chunks), index = 0
    cdef bytes packed = PyBytes_FromStringAndSize(NULL, 4 * count)
    cdef char* out = PyBytes_AS_STRING(packed)
    cdef int64_t total = 0, size
    cdef uint32_t offset
    for chunk in chunks:
        if index == count:
            raise ValueError("chunks changed size while being read")
        size = len(chunk)
        offset = <uint32_t>position
        memcpy(out + 4 * index, &offset, 4)
        position += size - 4
        total += size
        index += 1
    if index != count:
        raise ValueError("chunks changed size while being read")
    return packed, total


cdef inline void _put_u32(char* out, int64_t at, uint32_t value) noexcept:
    memcpy(out + at, &value, 4)


# A located chunk's fixed head after its 12 leading zeros: the table's
# soffset (-36), then after ts_broker and base_offset the sizes uoffset (28)
# and, after the partition, the vtable (see ``chunks.encode_located_chunk``).
cdef int32_t _LOCATED_SOFFSET = -36
cdef uint32_t _LOCATED_SIZES_UOFFSET = 28
cdef uint16_t[8] _LOCATED_VTABLE = [16, 36, 20, 4, 24, 28, 32, 12]


def encode_located_chunk(bytes key, int64_t ts_broker, sizes, messages,
                         uint32_t partition, int64_t base_offset):
    """See ``broky.protocol.chunks.encode_located_chunk``: the same bytes,
    written into one buffer instead of packed and joined from ten parts (a
    key-shared delivery lays out one of these per message)."""
    cdef Py_buffer sizes_buffer
    cdef Py_buffer messages_buffer
    cdef int64_t sizes_len, messages_len, key_len, sizes_end, messages_at
    cdef int64_t messages_end, key_at, key_end, chunk_end
    cdef bytes chunk
    cdef char* out
    cdef uint32_t value
    PyObject_GetBuffer(sizes, &sizes_buffer, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(messages, &messages_buffer, PyBUF_SIMPLE)
        try:
            sizes_len = sizes_buffer.len
            messages_len = messages_buffer.len
            key_len = PyBytes_GET_SIZE(key)
            sizes_end = 64 + 4 + sizes_len
            messages_at = sizes_end + ((4 - sizes_end) & 7)
            messages_end = messages_at + 4 + messages_len
            key_at = (messages_end + 3) & ~3
            key_end = key_at + 4 + key_len + 1
            chunk_end = (key_end + 7) & ~7
            chunk = PyBytes_FromStringAndSize(NULL, chunk_end)
            out = PyBytes_AS_STRING(chunk)
            memset(out, 0, chunk_end)
            memcpy(out + 12, &_LOCATED_SOFFSET, 4)
            memcpy(out + 16, &ts_broker, 8)
            memcpy(out + 24, &base_offset, 8)
            _put_u32(out, 32, <uint32_t>(key_at - 32))
            _put_u32(out, 36, _LOCATED_SIZES_UOFFSET)
            _put_u32(out, 40, <uint32_t>(messages_at - 40))
            _put_u32(out, 44, partition)
            memcpy(out + 48, _LOCATED_VTABLE, 16)
            _put_u32(out, 64, <uint32_t>(sizes_len >> 2))
            memcpy(out + 68, sizes_buffer.buf, sizes_len)
            _put_u32(out, messages_at, <uint32_t>messages_len)
            memcpy(out + messages_at + 4, messages_buffer.buf, messages_len)
            _put_u32(out, key_at, <uint32_t>key_len)
            memcpy(out + key_at + 4, PyBytes_AS_STRING(key), key_len)
            return chunk
        finally:
            PyBuffer_Release(&messages_buffer)
    finally:
        PyBuffer_Release(&sizes_buffer)
