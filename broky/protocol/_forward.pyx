# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``broky.protocol.forward.walk_pure`` (see that module),
and of ``broky.protocol.located.read_chunk_runs_pure`` (the runs of a frame
a peer decodes, an acked Publish or a durable Deliver above all, read as
ephemeral or located chunks).

The loop that reads unacked Publish frames for forwarding runs once per run
of every frame a broker receives: on short runs it is the broker's
per-message cost. This module does exactly what the pure-Python version
does, checked by the same hypothesis properties; it is built when a C
compiler is there and skipped otherwise (the pure version then runs).
Little-endian hosts only: elsewhere the import is refused.
"""

import sys

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from broky.protocol.chunk_reading import CHUNK_VTABLE, DELIVER_FRAME_START, PUBLISH_FRAME_STARTS
from broky.protocol.located import LOCATED_VTABLE
from broky.protocol.forward import MAX_COALESCED_BYTES, MAX_COALESCED_MESSAGES
from broky.protocol._run_slots cimport new_run
from broky.protocol._runs cimport EncodedRun
from broky.protocol.frames import ForwardPublish

if sys.byteorder != "little":
    raise ImportError("the compiled forwarding reader assumes a little-endian host")

cdef bytes _VTABLE = CHUNK_VTABLE
cdef bytes _LOCATED_VTABLE = LOCATED_VTABLE
cdef bytes _PLAIN = PUBLISH_FRAME_STARTS[0]
cdef bytes _WITH_ACK = PUBLISH_FRAME_STARTS[1]
cdef bytes _DELIVER = DELIVER_FRAME_START
cdef int64_t _MAX_BYTES = MAX_COALESCED_BYTES
cdef int64_t _MAX_MESSAGES = MAX_COALESCED_MESSAGES
cdef int _MAX_SEGMENTS = MAX_COALESCED_MESSAGES  # a run holds at least one message
#: A run read by ``read_chunk_runs`` whose chunk is at most this long holds
#: copies of its bytes, not views of the frame: with a key per message a
#: Publish frame is a thousand runs, and three small copies cost less than
#: three memoryview slices (each a slice object and a ~200-byte view that
#: stays alive until the run's round is done). Longer runs are viewed.
cdef int64_t _COPIED_CHUNK_BYTES = 512

cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    cdef uint32_t value
    memcpy(&value, p, 4)
    return value


cdef inline uint64_t _u64(const uint8_t* p) noexcept nogil:
    cdef uint64_t value
    memcpy(&value, p, 8)
    return value


cdef bint _read_chunk(const uint8_t* buf, int64_t size, int64_t start, int64_t limit,
                      Chunk* out) noexcept:
    """Whether the chunk at ``start`` is laid out as encode_run_chunk lays it
    out (chunks._chunk_layout's checks) within ``limit``; fills ``out``."""
    if start < 0 or start + 48 > size:
        return False
    if memcmp(buf + start, <const uint8_t*>_VTABLE, 16) != 0:
        return False
    if _u32(buf + start + 28) != 12 or _u32(buf + start + 36) != 0:
        return False
    if not _read_vectors(buf, size, start, 40, <int64_t>_u32(buf + start + 24) + 24,
                         <int64_t>_u32(buf + start + 32) + 32, limit, out):
        return False
    out.ts_broker = <int64_t>_u64(buf + start + 16)
    return True


cdef bint _read_located(const uint8_t* buf, int64_t size, int64_t start, Chunk* out,
                        uint32_t* partition, int64_t* base_offset) noexcept:
    """Whether the chunk at ``start`` is laid out as encode_located_chunk
    lays it out (located.read_located_run's checks); fills ``out`` and the
    run's partition and base offset."""
    if start < 0 or start + 72 > size:
        return False
    if <int32_t>_u32(buf + start + 12) != -36 or _u32(buf + start + 36) != 28:
        return False
    if memcmp(buf + start + 48, <const uint8_t*>_LOCATED_VTABLE, 16) != 0:
        return False
    if not _read_vectors(buf, size, start, 64, <int64_t>_u32(buf + start + 32) + 32,
                         <int64_t>_u32(buf + start + 40) + 40, 0, out):
        return False
    out.ts_broker = <int64_t>_u64(buf + start + 16)
    base_offset[0] = <int64_t>_u64(buf + start + 24)
    partition[0] = _u32(buf + start + 44)
    return True


cdef bint _read_vectors(const uint8_t* buf, int64_t size, int64_t start, int64_t sizes_at,
                        int64_t key_at_given, int64_t messages_at_given, int64_t limit,
                        Chunk* out) noexcept:
    """chunks.vectors_layout's checks of the vectors laid out from
    ``sizes_at``; fills ``out`` but its ts_broker."""
    cdef int64_t run_count, sizes_end, messages_at, messages_len, messages_end
    cdef int64_t key_at, key_len, key_end, end, total, i
    cdef uint64_t before
    run_count = _u32(buf + start + sizes_at)
    sizes_end = sizes_at + 4 + 4 * run_count
    messages_at = sizes_end + ((4 - sizes_end) & 7)
    if messages_at_given != messages_at or start + messages_at + 4 > size:
        return False
    before = _u32(buf + start + messages_at - 4)
    messages_len = _u32(buf + start + messages_at)
    if messages_at != sizes_end and before:
        return False
    messages_end = messages_at + 4 + messages_len
    key_at = (messages_end + 3) & ~3
    if key_at_given != key_at or start + key_at + 4 > size:
        return False
    before = _u32(buf + start + key_at - 4)
    key_len = _u32(buf + start + key_at)
    key_end = key_at + 4 + key_len
    end = (key_end + 8) & ~7
    if start + end > size:
        return False
    if (before >> (32 - 8 * (key_at - messages_end))) != 0:
        return False
    if (_u64(buf + start + end - 8) >> (64 - 8 * (end - key_end))) != 0:
        return False
    if run_count == 1:
        if <int64_t>_u32(buf + start + sizes_at + 4) != messages_len:
            return False
    else:
        total = 0
        for i in range(run_count):
            total += _u32(buf + start + sizes_at + 4 + 4 * i)
        if total != messages_len:
            return False
    if limit and messages_len > limit:
        return False
    out.start = buf + start
    out.length = end
    out.key = buf + start + key_at + 4
    out.key_len = key_len
    out.sizes = buf + start + sizes_at + 4
    out.messages = buf + start + messages_at + 4
    out.messages_len = messages_len
    out.count = run_count
    return True


cdef bint _is_forwardable(const uint8_t* frame, int64_t size, bint deliveries) noexcept:
    """An unacked, unstamped Publish header (a Deliver header if
    ``deliveries``) as runs_frame_parts lays it out."""
    cdef bint acked_layout
    if deliveries:
        return (
            size >= 56
            and memcmp(frame, <const uint8_t*>_DELIVER, 36) == 0
            and _u32(frame + 36) == 12
            and _u32(frame + 44) == 8
            and 56 + 4 * <int64_t>_u32(frame + 52) <= size
        )
    acked_layout = size >= 56 and memcmp(frame, <const uint8_t*>_WITH_ACK, 36) == 0
    return (
        size >= 56
        and (acked_layout or memcmp(frame, <const uint8_t*>_PLAIN, 36) == 0)
        and _u32(frame + 36) == 12  # the body table's soffset
        and _u32(frame + 44) == 8  # the runs uoffset
        and frame[48] == 0  # stamp_ts_broker
        and not (acked_layout and frame[49])  # a field only in that layout
        and 56 + 4 * <int64_t>_u32(frame + 52) <= size
    )


cdef bytes _coalesced_chunk(Chunk* group, int n, int64_t count, int64_t messages_len):
    """encode_run_chunk(key, ts_broker, sizes, messages) of the group's runs."""
    cdef int64_t sizes_len = 4 * count
    cdef int64_t sizes_end = 40 + 4 + sizes_len
    cdef int64_t messages_at = sizes_end + ((4 - sizes_end) & 7)
    cdef int64_t messages_end = messages_at + 4 + messages_len
    cdef int64_t key_at = (messages_end + 3) & ~3
    cdef int64_t key_len = group[0].key_len
    cdef int64_t key_end = key_at + 4 + key_len + 1
    cdef int64_t chunk_end = (key_end + 7) & ~7
    cdef bytes chunk = PyBytes_FromStringAndSize(NULL, chunk_end)
    cdef uint8_t* out = <uint8_t*>PyBytes_AS_STRING(chunk)
    cdef uint32_t value
    cdef int64_t at, i
    memset(out, 0, chunk_end)
    # The head: the first run's vtable and soffset, then ts_broker and the
    # key, sizes and messages uoffsets for this layout.
    memcpy(out, group[0].start, 16)
    memcpy(out + 16, &group[0].ts_broker, 8)
    value = <uint32_t>(key_at - 24)
    memcpy(out + 24, &value, 4)
    value = 12
    memcpy(out + 28, &value, 4)
    value = <uint32_t>(messages_at - 32)
    memcpy(out + 32, &value, 4)
    value = <uint32_t>count
    memcpy(out + 40, &value, 4)
    at = 44
    for i in range(n):
        memcpy(out + at, group[i].sizes, 4 * group[i].count)
        at += 4 * group[i].count
    value = <uint32_t>messages_len
    memcpy(out + messages_at, &value, 4)
    at = messages_at + 4
    for i in range(n):
        memcpy(out + at, group[i].messages, group[i].messages_len)
        at += group[i].messages_len
    value = <uint32_t>key_len
    memcpy(out + key_at, &value, 4)
    memcpy(out + key_at + 4, group[0].key, key_len)
    return chunk


#: Key objects seen lately, by a hash of their bytes (slots: _KEY_SLOTS).
#: Why: on short runs every run's key was a new bytes object, allocated,
#: hashed (siphash) by the route lookup, compared by value and freed; a key
#: that comes round again is now the same object, whose hash is cached and
#: which the router's dicts find by identity. A slot holds one key, so a
#: stream of ever-new keys only costs a hash and a compare per run.
cdef enum:
    _KEY_SLOTS = 4096
cdef list _keys = [None] * _KEY_SLOTS


cdef bytes _key(const uint8_t* key, int64_t key_len):
    cdef uint64_t h = 14695981039346656037ULL  # FNV-1a
    cdef int64_t i
    for i in range(key_len):
        h = (h ^ key[i]) * 1099511628211ULL
    return _cached_bytes(
        _keys, <Py_ssize_t>((h ^ (h >> 29)) & (_KEY_SLOTS - 1)), <const char*>key, key_len
    )


#: One-message size tables seen lately, by the message size (slots:
#: _SIZE_SLOTS), for the runs ``read_chunk_runs`` copies out: with a key
#: per message each run's size table was a new 4-byte bytes object, while
#: messages of one size have the same table. Like a key, a table met again
#: is the same object (bytes are immutable: sharing one is not observable).
cdef enum:
    _SIZE_SLOTS = 1024
cdef list _size_tables = [None] * _SIZE_SLOTS


cdef bytes _sizes(const uint8_t* sizes, int64_t count):
    if count != 1:
        return PyBytes_FromStringAndSize(<const char*>sizes, 4 * count)
    return _cached_bytes(
        _size_tables, <Py_ssize_t>(_u32(sizes) & (_SIZE_SLOTS - 1)), <const char*>sizes, 4
    )


cdef bytes _cached_bytes(list cache, Py_ssize_t slot, const char* data, int64_t length):
    """The bytes of ``data``: ``cache[slot]`` if it holds them, else new
    ones, left in that slot (one per slot: a miss costs a compare)."""
    cdef object seen = <object>PyList_GET_ITEM(cache, slot)
    if (
        seen is not None
        and PyBytes_GET_SIZE(seen) == length
        and memcmp(PyBytes_AS_STRING(seen), data, length) == 0
    ):
        return <bytes>seen
    fresh = PyBytes_FromStringAndSize(data, length)
    cache[slot] = fresh
    return fresh


cdef class _Group:
    """Runs gathered for coalescing (see forward._Coalescer)."""
    cdef Chunk* chunks
    cdef int n
    cdef int64_t messages_len
    cdef int64_t count

    def __cinit__(self):
        self.chunks = <Chunk*>PyMem_Malloc(_MAX_SEGMENTS * sizeof(Chunk))
        if self.chunks is NULL:
            raise MemoryError()
        self.n = 0

    def __dealloc__(self):
        PyMem_Free(self.chunks)

    cdef int flush(self, list into) except -1:
        cdef Chunk* first
        if self.n == 0:
            return 0
        first = &self.chunks[0]
        cdef EncodedRun run = EncodedRun.__new__(EncodedRun)
        run.key = _key(first.key, first.key_len)
        if self.n == 1:
            run.count = first.count
            run.chunk = PyBytes_FromStringAndSize(<const char*>first.start, first.length)
        else:
            run.count = self.count
            run.chunk = _coalesced_chunk(self.chunks, self.n, self.count, self.messages_len)
        into.append(run)
        self.n = 0
        self.messages_len = 0
        self.count = 0
        return 0

    cdef int add(self, Chunk* chunk, list into) except -1:
        cdef Chunk* first
        if self.n:
            first = &self.chunks[0]
            if (
                chunk.key_len != first.key_len
                or memcmp(chunk.key, first.key, chunk.key_len) != 0
                or chunk.ts_broker != first.ts_broker
                or self.messages_len + chunk.messages_len > _MAX_BYTES
                or self.count + chunk.count > _MAX_MESSAGES
                or self.n == _MAX_SEGMENTS
            ):
                self.flush(into)
        self.chunks[self.n] = chunk[0]
        self.n += 1
        self.messages_len += chunk.messages_len
        self.count += chunk.count
        return 0


def walk(view, int64_t max_frame_bytes, int64_t limit, decode, bint deliveries=False):
    """See ``broky.protocol.forward.walk_pure``."""
    cdef list frames = []
    cdef object merged = None
    cdef list runs = None
    cdef Py_buffer view_buffer
    cdef const uint8_t* buf
    cdef const uint8_t* frame
    cdef int64_t size, position = 0, length, count, index, start
    cdef uint32_t stream
    cdef bint whole
    cdef Chunk chunk
    cdef _Group group = _Group()
    # The runs of the frame being read, staged (one buffer per walk, grown
    # to the largest frame's run count, not one allocation per frame).
    cdef Chunk* staged = NULL
    cdef Chunk* grown
    cdef int64_t capacity = 0
    PyObject_GetBuffer(view, &view_buffer, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t*>view_buffer.buf
        size = view_buffer.len
        while size - position >= 4:
            length = _u32(buf + position)
            if length > max_frame_bytes or size - position - 4 < length:
                break
            frame = buf + position + 4
            whole = _is_forwardable(frame, length, deliveries)
            if whole:
                # Read every run first: a frame is forwarded whole or decoded whole.
                count = _u32(frame + 52)
                if count > capacity:
                    grown = <Chunk*>PyMem_Realloc(staged, count * sizeof(Chunk))
                    if grown is NULL:
                        raise MemoryError()
                    staged, capacity = grown, count
                for index in range(count):
                    start = 56 + 4 * index + <int64_t>_u32(frame + 56 + 4 * index) - 12
                    if not _read_chunk(frame, length, start, limit, &staged[index]):
                        whole = False
                        break
                if whole:
                    stream = _u32(frame + 40)
                    if merged is None or merged.stream != stream:
                        if merged is not None:
                            group.flush(runs)
                        runs = []
                        merged = ForwardPublish(stream, runs)
                        frames.append(merged)
                    for index in range(count):
                        group.add(&staged[index], runs)
            if not whole:
                if merged is not None:
                    group.flush(runs)
                    merged = None
                frames.append(decode(view[position + 4 : position + 4 + length]))
            position += 4 + length
        if merged is not None:
            group.flush(runs)
    finally:
        PyMem_Free(staged)
        PyBuffer_Release(&view_buffer)
    return frames, position


# Message bytes of a located run up to which ``read_chunk_runs`` copies it
# out of the frame instead of viewing it (see there).
cdef int64_t _COPY_AT_MOST = 4096


def read_chunk_runs(view, Py_ssize_t start, Py_ssize_t count):
    """Compiled twin of ``broky.protocol.located.read_chunk_runs_pure``: for
    each of the ``count`` runs whose uoffsets start at ``start`` (known to lie
    in ``view``), the Run read as an ephemeral or a located chunk, or None
    where the run is laid out neither way (the caller decodes it through its
    vtable)."""
    cdef Py_buffer view_buffer
    cdef const uint8_t* buf
    cdef int64_t size, chunk_start
    cdef Py_ssize_t index
    cdef Chunk chunk
    cdef int64_t messages_at, sizes_at, base_offset
    cdef uint32_t partition
    cdef list runs = []
    cdef object whole, sizes, messages
    PyObject_GetBuffer(view, &view_buffer, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t*>view_buffer.buf
        size = view_buffer.len
        for index in range(count):
            chunk_start = _chunk_at(buf, start + 4 * index)
            if _read_chunk(buf, size, chunk_start, 0, &chunk):
                if chunk.length <= _COPIED_CHUNK_BYTES:  # copies: see _COPIED_CHUNK_BYTES
                    sizes = _sizes(chunk.start + 44, chunk.count)
                    messages = PyBytes_FromStringAndSize(
                        <const char*>chunk.messages, chunk.messages_len
                    )
                    whole = PyBytes_FromStringAndSize(<const char*>chunk.start, chunk.length)
                else:
                    whole = view[chunk_start : chunk_start + chunk.length]
                    messages_at = chunk.messages - chunk.start
                    sizes = whole[44 : 44 + 4 * chunk.count]
                    messages = whole[messages_at : messages_at + chunk.messages_len]
                runs.append(
                    new_run(
                        _key(chunk.key, chunk.key_len),
                        chunk.ts_broker,
                        chunk.count,
                        sizes,
                        messages,
                        whole,
                    )
                )
            elif _read_located(buf, size, chunk_start, &chunk, &partition, &base_offset):
                sizes_at = chunk_start + 68
                messages_at = chunk_start + (chunk.messages - chunk.start)
                # A durable delivery: a consumer reads one per message when
                # keys change on every message (no chunk: never forwarded).
                # A small run's sizes and messages are copied out as bytes:
                # cheaper than two memoryview slices, and not objects the
                # garbage collector tracks (a consumer buffers up to its
                # credit of these); a big run's stay views.
                if chunk.messages_len <= _COPY_AT_MOST:
                    sizes = _sizes(buf + sizes_at, chunk.count)
                    messages = PyBytes_FromStringAndSize(
                        <const char*>buf + messages_at, chunk.messages_len
                    )
                else:
                    sizes = view[sizes_at : sizes_at + 4 * chunk.count]
                    messages = view[messages_at : messages_at + chunk.messages_len]
                runs.append(
                    new_run(
                        _key(chunk.key, chunk.key_len),
                        chunk.ts_broker,
                        chunk.count,
                        sizes,
                        messages,
                        None,
                        partition,
                        base_offset,
                    )
                )
            else:
                runs.append(None)
    finally:
        PyBuffer_Release(&view_buffer)
    return runs


def count_located(view, Py_ssize_t start, Py_ssize_t count):
    """The messages of the ``count`` runs whose uoffsets start at ``start``
    (known to lie in ``view``) when every one is a located chunk
    (``_read_located``: what ``read_chunk_runs`` reads as one), else -1.
    A durable Deliver frame that passes is handed to its consumer whole
    (``frames.LocatedDeliver``), its runs read in place as they are taken."""
    cdef Chunk chunk
    cdef uint32_t partition
    cdef int64_t base_offset, total = 0
    cdef Py_ssize_t index
    cdef Py_buffer view_buffer
    PyObject_GetBuffer(view, &view_buffer, PyBUF_SIMPLE)
    try:
        for index in range(count):
            if not _read_located(
                <const uint8_t*>view_buffer.buf,
                view_buffer.len,
                _chunk_at(<const uint8_t*>view_buffer.buf, start + 4 * index),
                &chunk,
                &partition,
                &base_offset,
            ):
                return -1
            total += chunk.count
    finally:
        PyBuffer_Release(&view_buffer)
    return total
