# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of ``chunks.chunk_offsets_pure``: the runs vector of a
Deliver frame, one uoffset per run, is built once per run of every frame a
broker writes. Little-endian hosts only (elsewhere the import is refused
and the pure version runs)."""

import sys

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint32_t
from libc.string cimport memcpy

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
