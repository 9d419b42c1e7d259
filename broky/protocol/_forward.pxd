# The chunk reader's C-level pieces (see _forward.pyx), cimported by the
# client's compiled delivery builder (broky/client/_deliveries.pyx), which
# reads the located chunks of a durable Deliver frame in place.

from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.string cimport memcpy

cdef struct Chunk:
    # One run chunk as read: pointers into the frame being walked.
    const uint8_t* start
    int64_t length
    const uint8_t* key
    int64_t key_len
    const uint8_t* sizes
    const uint8_t* messages
    int64_t messages_len
    int64_t count
    int64_t ts_broker

cdef bint _read_located(const uint8_t* buf, int64_t size, int64_t start, Chunk* out,
                        uint32_t* partition, int64_t* base_offset) noexcept


cdef inline int64_t _chunk_at(const uint8_t* buf, int64_t slot) noexcept:
    """Where the chunk of the run whose uoffset is at ``slot`` starts: its
    table (the uoffset's target) less the 12 bytes before a chunk's table."""
    cdef uint32_t uoffset
    memcpy(&uoffset, buf + slot, 4)
    return slot + <int64_t>uoffset - 12
