# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``ProtocolMachine._forwardable`` (see broky.protocol.forward).

The loop that reads unacked Publish frames for forwarding runs once per run
of every frame a broker receives: on short runs it is the broker's
per-message cost. This module does exactly what the pure-Python
``forward.forwardable`` does, checked by the same hypothesis properties; it
is built when a C compiler is there and skipped otherwise (the pure
version then runs). Little-endian hosts only: elsewhere the import is
refused and the pure version runs.
"""

import sys

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from broky.protocol.chunks import CHUNK_VTABLE, PUBLISH_FRAME_STARTS
from broky.protocol.frames import EncodedRun, ForwardPublish

if sys.byteorder != "little":
    raise ImportError("the compiled forwarding reader assumes a little-endian host")

cdef bytes _VTABLE = CHUNK_VTABLE
cdef bytes _PLAIN = PUBLISH_FRAME_STARTS[0]
cdef bytes _WITH_ACK = PUBLISH_FRAME_STARTS[1]


cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    cdef uint32_t value
    memcpy(&value, p, 4)
    return value


cdef inline uint64_t _u64(const uint8_t* p) noexcept nogil:
    cdef uint64_t value
    memcpy(&value, p, 8)
    return value


cdef list _runs(const uint8_t* buf, int64_t size, int64_t count, int64_t limit):
    """The frame's runs as EncodedRuns, or None (see chunks.read_forwardable_runs)."""
    cdef list runs = []
    cdef const uint8_t* vtable = _VTABLE
    cdef int64_t index, start, run_count, sizes_end, messages_at, messages_len
    cdef int64_t messages_end, key_at, key_len, key_end, end, total, i
    cdef uint64_t before
    for index in range(count):
        start = 56 + 4 * index + <int64_t>_u32(buf + 56 + 4 * index) - 12
        if start < 0 or start + 48 > size:
            return None
        if memcmp(buf + start, vtable, 16) != 0:
            return None
        # sizes uoffset (28) must point right behind the table, padding zero
        if _u32(buf + start + 28) != 12 or _u32(buf + start + 36) != 0:
            return None
        run_count = _u32(buf + start + 40)
        sizes_end = 44 + 4 * run_count
        messages_at = sizes_end + ((4 - sizes_end) & 7)
        if <int64_t>_u32(buf + start + 32) != messages_at - 32 or start + messages_at + 4 > size:
            return None
        before = _u32(buf + start + messages_at - 4)
        messages_len = _u32(buf + start + messages_at)
        if messages_at != sizes_end and before:
            return None
        messages_end = messages_at + 4 + messages_len
        key_at = (messages_end + 3) & ~3
        if <int64_t>_u32(buf + start + 24) != key_at - 24 or start + key_at + 4 > size:
            return None
        before = _u32(buf + start + key_at - 4)
        key_len = _u32(buf + start + key_at)
        key_end = key_at + 4 + key_len
        end = (key_end + 8) & ~7
        if start + end > size:
            return None
        if (before >> (32 - 8 * (key_at - messages_end))) != 0:
            return None
        if (_u64(buf + start + end - 8) >> (64 - 8 * (end - key_end))) != 0:
            return None
        if run_count == 1:
            if <int64_t>_u32(buf + start + 44) != messages_len:
                return None
        else:
            total = 0
            for i in range(run_count):
                total += _u32(buf + start + 44 + 4 * i)
            if total != messages_len:
                return None
        if limit and messages_len > limit:
            return None
        runs.append(
            EncodedRun(
                PyBytes_FromStringAndSize(<const char*>(buf + start + key_at + 4), key_len),
                run_count,
                PyBytes_FromStringAndSize(<const char*>(buf + start), end),
            )
        )
    return runs


cdef list _frame_runs(const uint8_t* buf, int64_t size, int64_t limit, uint32_t* stream):
    """The runs of the frame at ``buf`` if it is an unacked, unstamped
    Publish laid out as chunks (its stream in ``stream``); else None."""
    cdef bint acked_layout = size >= 56 and memcmp(buf, <const uint8_t*>_WITH_ACK, 36) == 0
    cdef int64_t count
    if not (
        size >= 56
        and (acked_layout or memcmp(buf, <const uint8_t*>_PLAIN, 36) == 0)
        and _u32(buf + 36) == 12  # the body table's soffset
        and _u32(buf + 44) == 8  # the runs uoffset
        and buf[48] == 0  # stamp_ts_broker
        and not (acked_layout and buf[49])  # a field only in that layout
    ):
        return None
    count = _u32(buf + 52)
    if 56 + 4 * count > size:
        return None
    stream[0] = _u32(buf + 40)
    return _runs(buf, size, count, limit)


def forwardable(views, int64_t limit, decode):
    """See ``broky.protocol.forward.forwardable``."""
    cdef list frames = []
    cdef object merged = None
    cdef Py_buffer view_buffer
    cdef uint32_t stream = 0
    cdef list runs
    for view in views:
        PyObject_GetBuffer(view, &view_buffer, PyBUF_SIMPLE)
        try:
            runs = _frame_runs(
                <const uint8_t*>view_buffer.buf, view_buffer.len, limit, &stream
            )
        finally:
            PyBuffer_Release(&view_buffer)
        if runs is None:
            frames.append(decode(view))
            merged = None
        elif merged is not None and merged.stream == stream:
            merged.runs.extend(runs)
        else:
            merged = ForwardPublish(stream, runs)
            frames.append(merged)
    return frames


def walk(view, int64_t max_frame_bytes, int64_t limit, decode):
    """See ``broky.protocol.forward.walk``."""
    cdef list frames = []
    cdef object merged = None
    cdef Py_buffer view_buffer
    cdef const uint8_t* buf
    cdef int64_t size, position = 0, length
    cdef uint32_t stream = 0
    cdef list runs
    PyObject_GetBuffer(view, &view_buffer, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t*>view_buffer.buf
        size = view_buffer.len
        while size - position >= 4:
            length = _u32(buf + position)
            if length > max_frame_bytes or size - position - 4 < length:
                break
            runs = _frame_runs(buf + position + 4, length, limit, &stream)
            if runs is None:
                frames.append(decode(view[position + 4 : position + 4 + length]))
                merged = None
            elif merged is not None and merged.stream == stream:
                merged.runs.extend(runs)
            else:
                merged = ForwardPublish(stream, runs)
                frames.append(merged)
            position += 4 + length
    finally:
        PyBuffer_Release(&view_buffer)
    return frames, position
