# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twins of ``chunks.chunk_offsets_pure`` and
``length_offsets_pure``, ``chunks.encode_located_chunk``,
``chunks.encode_run_chunk_from``, ``located.run_index_pure``,
``located.encode_located_runs_pure`` and ``encode_located_blob_pure``:
the runs vector of a Deliver frame, one uoffset per run, is built once per
run of every frame a broker writes, and a subscription's delivery lays out
one located chunk per run. Little-endian hosts only (elsewhere the import
is refused and the pure version runs). Column passes that write no chunk
(a batch's distinct keys, a PublishAck's columns) are
``broky.protocol._columns``."""

import sys

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t
from libc.string cimport memcpy, memset
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_RawFree, PyMem_RawMalloc, PyMem_RawRealloc

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


def length_offsets(lengths, int64_t position):
    """See ``broky.protocol.chunks.length_offsets_pure``."""
    cdef Py_buffer lengths_buffer
    cdef Py_ssize_t count, index
    cdef const uint32_t* table
    cdef bytes packed
    cdef char* out
    cdef int64_t total = 0
    cdef uint32_t offset
    PyObject_GetBuffer(lengths, &lengths_buffer, PyBUF_SIMPLE)
    try:
        if lengths_buffer.len % 4:
            raise ValueError("chunk lengths must be whole uint32s")
        count = lengths_buffer.len // 4
        table = <const uint32_t*>lengths_buffer.buf
        packed = PyBytes_FromStringAndSize(NULL, 4 * count)
        out = PyBytes_AS_STRING(packed)
        for index in range(count):
            offset = <uint32_t>position
            memcpy(out + 4 * index, &offset, 4)
            position += <int64_t>table[index] - 4
            total += table[index]
    finally:
        PyBuffer_Release(&lengths_buffer)
    return packed, total


cdef inline void _put_u32(char* out, int64_t at, uint32_t value) noexcept:
    memcpy(out + at, &value, 4)


# A located chunk's fixed head after its 12 leading zeros: the table's
# soffset (-36), then after ts_broker and base_offset the sizes uoffset (28)
# and, after the partition, the vtable (see ``chunks.encode_located_chunk``).
cdef int32_t _LOCATED_SOFFSET = -36
cdef uint32_t _LOCATED_SIZES_UOFFSET = 28
cdef uint16_t[8] _LOCATED_VTABLE = [16, 36, 20, 4, 24, 28, 32, 12]


cdef inline int64_t _chunk_layout(int64_t sizes_at, int64_t key_len, int64_t sizes_len,
                                  int64_t messages_len, int64_t* messages_at,
                                  int64_t* key_at) noexcept:
    """The length of a chunk whose size table starts at ``sizes_at``, laid
    out as ``chunks._chunk_layout`` lays it out; sets where the messages
    vector and the key string start."""
    cdef int64_t sizes_end = sizes_at + 4 + sizes_len
    messages_at[0] = sizes_end + ((4 - sizes_end) & 7)
    key_at[0] = (messages_at[0] + 4 + messages_len + 3) & ~3
    return (key_at[0] + 4 + key_len + 1 + 7) & ~7


cdef inline void _zeroed_vectors(char* out, int64_t chunk_end, int64_t sizes_at,
                                 int64_t key_len, int64_t sizes_len, int64_t messages_len,
                                 int64_t messages_at, int64_t key_at) noexcept:
    """Zero a chunk of ``chunk_end`` bytes at ``out`` and write its three
    vectors' lengths."""
    memset(out, 0, chunk_end)
    _put_u32(out, sizes_at, <uint32_t>(sizes_len >> 2))
    _put_u32(out, messages_at, <uint32_t>messages_len)
    _put_u32(out, key_at, <uint32_t>key_len)


cdef bytes _chunk_buffer(int64_t sizes_at, int64_t key_len, int64_t sizes_len,
                        int64_t messages_len, int64_t* messages_at, int64_t* key_at):
    """A zeroed chunk (``_chunk_layout``) with its three vectors' lengths
    written; sets where the messages vector and the key string start."""
    cdef int64_t chunk_end = _chunk_layout(
        sizes_at, key_len, sizes_len, messages_len, messages_at, key_at
    )
    cdef bytes chunk = PyBytes_FromStringAndSize(NULL, chunk_end)
    _zeroed_vectors(PyBytes_AS_STRING(chunk), chunk_end, sizes_at, key_len, sizes_len,
                    messages_len, messages_at[0], key_at[0])
    return chunk


cdef inline int64_t _write_located(char* out, const char* key, int64_t key_len,
                                   int64_t ts_broker, const char* sizes, int64_t sizes_len,
                                   const char* messages, int64_t messages_len,
                                   uint32_t partition, int64_t base_offset,
                                   int64_t chunk_end, int64_t messages_at,
                                   int64_t key_at) noexcept:
    """The located chunk of one run written at ``out`` (``chunk_end`` bytes,
    laid out by ``_chunk_layout`` from 64); returns its length."""
    _zeroed_vectors(out, chunk_end, 64, key_len, sizes_len, messages_len, messages_at, key_at)
    memcpy(out + 12, &_LOCATED_SOFFSET, 4)
    memcpy(out + 16, &ts_broker, 8)
    memcpy(out + 24, &base_offset, 8)
    _put_u32(out, 32, <uint32_t>(key_at - 32))
    _put_u32(out, 36, _LOCATED_SIZES_UOFFSET)
    _put_u32(out, 40, <uint32_t>(messages_at - 40))
    _put_u32(out, 44, partition)
    memcpy(out + 48, _LOCATED_VTABLE, 16)
    memcpy(out + 68, sizes, sizes_len)
    memcpy(out + messages_at + 4, messages, messages_len)
    memcpy(out + key_at + 4, key, key_len)
    return chunk_end


cdef bytes _located(const char* key, int64_t key_len, int64_t ts_broker,
                    const char* sizes, int64_t sizes_len,
                    const char* messages, int64_t messages_len,
                    uint32_t partition, int64_t base_offset):
    """The located chunk of one run, written into one new buffer."""
    cdef int64_t messages_at, key_at
    cdef int64_t chunk_end = _chunk_layout(
        64, key_len, sizes_len, messages_len, &messages_at, &key_at
    )
    cdef bytes chunk = PyBytes_FromStringAndSize(NULL, chunk_end)
    _write_located(PyBytes_AS_STRING(chunk), key, key_len, ts_broker, sizes, sizes_len,
                   messages, messages_len, partition, base_offset, chunk_end, messages_at,
                   key_at)
    return chunk


cdef struct _Blob:
    # ``encode_located_blob``'s output as it grows: the chunks back to
    # back, and each one's length (uint32s).
    char* data
    Py_ssize_t used
    Py_ssize_t capacity
    uint32_t* lengths
    Py_ssize_t count
    Py_ssize_t slots


cdef int _blob_grow(_Blob* blob, Py_ssize_t more) except -1:
    """Room in ``blob`` for ``more`` bytes and one more length (doubling)."""
    cdef Py_ssize_t wanted
    cdef void* grown
    if blob.used + more > blob.capacity:
        wanted = 2 * blob.capacity
        if wanted < blob.used + more:
            wanted = blob.used + more
        grown = PyMem_RawRealloc(blob.data, wanted)
        if grown == NULL:
            raise MemoryError()
        blob.data = <char*>grown
        blob.capacity = wanted
    if blob.count == blob.slots:
        wanted = 2 * blob.slots if blob.slots else 1024
        grown = PyMem_RawRealloc(blob.lengths, 4 * wanted)
        if grown == NULL:
            raise MemoryError()
        blob.lengths = <uint32_t*>grown
        blob.slots = wanted
    return 0


cdef int _blob_located(_Blob* blob, const char* key, int64_t key_len, int64_t ts_broker,
                       const char* sizes, int64_t sizes_len,
                       const char* messages, int64_t messages_len,
                       uint32_t partition, int64_t base_offset) except -1:
    """``_located``'s chunk written at the end of ``blob`` and its length
    noted: the same bytes, no object per chunk."""
    cdef int64_t messages_at, key_at
    cdef int64_t chunk_end = _chunk_layout(
        64, key_len, sizes_len, messages_len, &messages_at, &key_at
    )
    if blob.used + chunk_end > blob.capacity or blob.count == blob.slots:
        _blob_grow(blob, chunk_end)
    blob.used += _write_located(blob.data + blob.used, key, key_len, ts_broker, sizes,
                                sizes_len, messages, messages_len, partition, base_offset,
                                chunk_end, messages_at, key_at)
    blob.lengths[blob.count] = <uint32_t>chunk_end
    blob.count += 1
    return 0


#: A blob's first buffer: ``_BLOB_PER_RANGE`` bytes a range asked for (a
#: located chunk of a 100-byte message is about 200 bytes), at least
#: ``_BLOB_FIRST`` (from the C heap, below its mmap threshold: what is not
#: used costs nothing), grown by doubling past it.
cdef Py_ssize_t _BLOB_PER_RANGE = 512
cdef Py_ssize_t _BLOB_FIRST = 64 * 1024


def encode_located_chunk(bytes key, int64_t ts_broker, sizes, messages,
                         uint32_t partition, int64_t base_offset):
    """See ``broky.protocol.chunks.encode_located_chunk``: the same bytes,
    written into one buffer instead of packed and joined from ten parts (a
    key-shared delivery lays out one of these per message)."""
    cdef Py_buffer sizes_buffer
    cdef Py_buffer messages_buffer
    PyObject_GetBuffer(sizes, &sizes_buffer, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(messages, &messages_buffer, PyBUF_SIMPLE)
        try:
            return _located(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), ts_broker,
                            <const char*>sizes_buffer.buf, sizes_buffer.len,
                            <const char*>messages_buffer.buf, messages_buffer.len,
                            partition, base_offset)
        finally:
            PyBuffer_Release(&messages_buffer)
    finally:
        PyBuffer_Release(&sizes_buffer)


def run_index(counts, key_lengths, sizes):
    """See ``broky.protocol.located.run_index_pure``: the same int64 columns,
    in one pass over the run table in C."""
    cdef Py_ssize_t runs = len(counts), run
    cdef Py_buffer sizes_buffer
    cdef bytes packed = PyBytes_FromStringAndSize(NULL, 24 * (runs + 1))
    cdef int64_t* out = <int64_t*>PyBytes_AS_STRING(packed)
    cdef int64_t message = 0, key_at = 0, position = 0, count, key_length, i
    cdef const uint32_t* table
    if len(key_lengths) != runs:
        raise ValueError("run columns of different lengths")
    PyObject_GetBuffer(sizes, &sizes_buffer, PyBUF_SIMPLE)
    try:
        table = <const uint32_t*>sizes_buffer.buf
        for run in range(runs):
            out[run] = message
            out[runs + 1 + run] = key_at
            out[2 * (runs + 1) + run] = position
            count = counts[run]
            key_length = key_lengths[run]
            if count < 0 or key_length < 0 or 4 * (message + count) > sizes_buffer.len:
                raise ValueError("run table runs past the batch")
            for i in range(count):
                position += table[message + i]
            message += count
            key_at += key_length
        out[runs] = message
        out[2 * runs + 1] = key_at
        out[3 * runs + 2] = position
    finally:
        PyBuffer_Release(&sizes_buffer)
    return packed


# Messages ahead of the walk from which ``encode_located_runs`` bisects the
# index for the next range's run instead of stepping over the runs between.
cdef int64_t _JUMP = 16


def encode_located_runs(ts_brokers, counts, key_lengths, keys, sizes, messages,
                        int64_t base_offset, ranges, uint32_t partition, run_starts=None):
    """See ``broky.protocol.located.encode_located_runs_pure``: the same
    chunks, each written by ``_located`` straight from the columns' buffers,
    with no Python object per run but its chunk. A run table or size table
    that runs past its buffer raises ValueError (a verified batch never
    does); so does an index (``run_starts``) of another length than the
    run table's."""
    return _encode_runs(ts_brokers, counts, key_lengths, keys, sizes, messages,
                        base_offset, ranges, partition, run_starts, NULL)


def encode_located_blob(ts_brokers, counts, key_lengths, keys, sizes, messages,
                        int64_t base_offset, ranges, uint32_t partition, run_starts=None):
    """See ``broky.protocol.located.encode_located_blob_pure``: the chunks
    of ``encode_located_runs`` written back to back into one buffer, and
    their lengths (packed little-endian uint32s). Why: a key-shared
    consumer's delivery is a chunk a message, and a bytes object each (made,
    measured, listed, joined into the frame and freed) cost more than the
    chunk's own bytes; the same checks and errors as ``encode_located_runs``."""
    cdef _Blob blob
    blob.used = blob.count = blob.slots = 0
    blob.lengths = NULL
    blob.capacity = _BLOB_PER_RANGE * (len(ranges) // 2 + 1)
    if blob.capacity < _BLOB_FIRST:
        blob.capacity = _BLOB_FIRST
    blob.data = <char*>PyMem_RawMalloc(blob.capacity)
    if blob.data == NULL:
        raise MemoryError()
    try:
        _encode_runs(ts_brokers, counts, key_lengths, keys, sizes, messages,
                     base_offset, ranges, partition, run_starts, &blob)
        if not blob.count:
            return b"", b""
        return (
            PyBytes_FromStringAndSize(blob.data, blob.used),
            PyBytes_FromStringAndSize(<char*>blob.lengths, 4 * blob.count),
        )
    finally:
        PyMem_RawFree(blob.data)
        PyMem_RawFree(blob.lengths)


cdef object _encode_runs(ts_brokers, counts, key_lengths, keys, sizes, messages,
                         int64_t base_offset, ranges, uint32_t partition, run_starts,
                         _Blob* blob):
    """``encode_located_runs`` (``blob`` NULL: a list of chunks) or
    ``encode_located_blob`` (the chunks into ``blob``)."""
    cdef Py_buffer index_buffer
    cdef list bounds = list(ranges)
    cdef Py_ssize_t runs = len(counts), pairs = len(bounds) // 2, i
    cdef const int64_t* starts = NULL
    cdef int64_t* wanted = NULL
    if len(ts_brokers) != runs or len(key_lengths) != runs:
        raise ValueError("run columns of different lengths")
    if len(bounds) % 2:
        raise ValueError("ranges must be (start, stop) pairs")
    wanted = <int64_t*>PyMem_Malloc(8 * len(bounds) + 8)
    if wanted == NULL:
        raise MemoryError()
    try:
        for i in range(2 * pairs):
            wanted[i] = bounds[i]
        if run_starts is not None:
            PyObject_GetBuffer(run_starts, &index_buffer, PyBUF_SIMPLE)
            if index_buffer.len != 24 * (runs + 1):
                PyBuffer_Release(&index_buffer)
                raise ValueError("a run index of another batch's length")
            starts = <const int64_t*>index_buffer.buf
        try:
            return _located_runs(ts_brokers, counts, key_lengths, keys, sizes, messages,
                                 base_offset, wanted, pairs, partition, starts, runs, blob)
        finally:
            if starts != NULL:
                PyBuffer_Release(&index_buffer)
    finally:
        PyMem_Free(wanted)


cdef list _located_runs(ts_brokers, counts, key_lengths, keys, sizes, messages,
                        int64_t base_offset, const int64_t* wanted, Py_ssize_t pairs,
                        uint32_t partition, const int64_t* starts, Py_ssize_t runs,
                        _Blob* blob):
    """``encode_located_runs`` with the ranges as ``pairs`` C pairs. With
    ``starts`` (``run_index``'s columns), the walk goes straight to the run
    where the next range begins (by bisection when it begins ``_JUMP`` or
    more messages ahead, else by a scan of the index's message starts) and
    reads that run's count, key length and byte end from the index, not
    from the run table's Python ints and the sizes: a key-shared
    consumer's share of a batch over many keys is a message here and
    there, so most runs are passed over, at ~1 ns each this way against
    ~25 ns a step through the run table."""
    cdef Py_buffer keys_buffer
    cdef Py_buffer sizes_buffer
    cdef Py_buffer messages_buffer
    cdef Py_ssize_t pair = 0, later, low, high, middle, index = 0, columns = runs + 1
    cdef int64_t end = 0, count, key_length, first, last, offset = base_offset
    cdef int64_t message = 0, key_at = 0, position = 0
    cdef int64_t run_at, at, length, i, range_start, range_stop, target
    cdef const uint32_t* table
    cdef list chunks = []
    PyObject_GetBuffer(keys, &keys_buffer, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(sizes, &sizes_buffer, PyBUF_SIMPLE)
        try:
            PyObject_GetBuffer(messages, &messages_buffer, PyBUF_SIMPLE)
            try:
                table = <const uint32_t*>sizes_buffer.buf
                while index < runs:
                    while pair < pairs and wanted[2 * pair + 1] <= offset:
                        pair += 1
                    if pair == pairs:
                        break
                    target = wanted[2 * pair] - base_offset
                    if starts != NULL and target > message:
                        # To the last run that begins at or before the range.
                        if target - message >= _JUMP:
                            low, high = index, runs - 1
                            while low < high:
                                middle = (low + high + 1) // 2
                                if starts[middle] <= target:
                                    low = middle
                                else:
                                    high = middle - 1
                            index = low
                        else:
                            while index + 1 < runs and starts[index + 1] <= target:
                                index += 1
                        message = starts[index]
                        key_at = starts[columns + index]
                        position = starts[2 * columns + index]
                        offset = base_offset + message
                    if starts != NULL:
                        count = starts[index + 1] - message
                        key_length = starts[columns + index + 1] - key_at
                        end = starts[2 * columns + index + 1]
                        if (message < 0 or key_at < 0 or position < 0
                                or end < position or end > messages_buffer.len):
                            raise ValueError("a run index past the batch")
                    else:
                        count = counts[index]
                        key_length = key_lengths[index]
                    if (count < 0 or key_length < 0 or key_at + key_length > keys_buffer.len
                            or 4 * (message + count) > sizes_buffer.len):
                        raise ValueError("run table runs past the batch")
                    run_at = position
                    if starts != NULL:
                        position = end
                    else:
                        for i in range(count):
                            position += table[message + i]
                        if position > messages_buffer.len:
                            raise ValueError("size table runs past the messages")
                    end = offset + count
                    later = pair
                    while later < pairs:
                        range_start = wanted[2 * later]
                        if range_start >= end:
                            break
                        range_stop = wanted[2 * later + 1]
                        later += 1
                        first = (range_start if range_start > offset else offset) - offset
                        last = (range_stop if range_stop < end else end) - offset
                        if first >= last:
                            continue
                        at = run_at
                        for i in range(first):
                            at += table[message + i]
                        length = 0
                        for i in range(first, last):
                            length += table[message + i]
                        if at + length > position:
                            raise ValueError("size table runs past the run")
                        if blob != NULL:
                            _blob_located(
                                blob, <const char*>keys_buffer.buf + key_at, key_length,
                                ts_brokers[index],
                                <const char*>sizes_buffer.buf + 4 * (message + first),
                                4 * (last - first),
                                <const char*>messages_buffer.buf + at, length,
                                partition, offset + first)
                            continue
                        chunks.append(_located(
                            <const char*>keys_buffer.buf + key_at, key_length,
                            ts_brokers[index],
                            <const char*>sizes_buffer.buf + 4 * (message + first),
                            4 * (last - first),
                            <const char*>messages_buffer.buf + at, length,
                            partition, offset + first))
                    offset = end
                    message += count
                    key_at += key_length
                    index += 1
                return chunks
            finally:
                PyBuffer_Release(&messages_buffer)
        finally:
            PyBuffer_Release(&sizes_buffer)
    finally:
        PyBuffer_Release(&keys_buffer)


# A run chunk's fixed head (see ``chunks.encode_run_chunk``): its vtable
# (size 12, table size 28, key@12 ts@4 sizes@16 messages@20), the table's
# soffset (12) and, after ts_broker and the key uoffset, the sizes uoffset.
cdef uint16_t[6] _RUN_VTABLE = [12, 28, 12, 4, 16, 20]
cdef int32_t _RUN_SOFFSET = 12
cdef uint32_t _RUN_SIZES_UOFFSET = 12


def encode_run_chunk_from(bytes key, list sizes, list messages):
    """See ``broky.protocol.chunks.encode_run_chunk_from_pure``: the chunk
    of a run given as its message sizes and message buffers, written into
    one new buffer (a client publishing one message per key closes a run
    per message). A size that disagrees with its message raises ValueError."""
    cdef Py_ssize_t count = len(sizes), index
    cdef int64_t messages_len = 0, size, at
    cdef uint32_t size32
    cdef Py_buffer message
    if len(messages) != count:
        raise ValueError("a run's sizes and messages differ in number")
    for index in range(count):
        size = sizes[index]
        if size != len(messages[index]):
            raise ValueError("a run's message size disagrees with its message")
        messages_len += size
    cdef int64_t key_len = PyBytes_GET_SIZE(key)
    cdef int64_t messages_at, key_at
    cdef bytes chunk = _chunk_buffer(40, key_len, 4 * count, messages_len, &messages_at, &key_at)
    cdef char* out = PyBytes_AS_STRING(chunk)
    memcpy(out, _RUN_VTABLE, 12)
    memcpy(out + 12, &_RUN_SOFFSET, 4)
    _put_u32(out, 24, <uint32_t>(key_at - 24))
    _put_u32(out, 28, _RUN_SIZES_UOFFSET)
    _put_u32(out, 32, <uint32_t>(messages_at - 32))
    at = messages_at + 4
    for index in range(count):
        size32 = <uint32_t>sizes[index]
        memcpy(out + 44 + 4 * index, &size32, 4)
        PyObject_GetBuffer(messages[index], &message, PyBUF_SIMPLE)
        try:
            if message.len != size32:
                raise ValueError("a run's message changed size while being encoded")
            memcpy(out + at, message.buf, message.len)
        finally:
            PyBuffer_Release(&message)
        at += size32
    memcpy(out + key_at + 4, PyBytes_AS_STRING(key), key_len)
    return chunk
