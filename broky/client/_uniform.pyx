# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of ``broky.client.decoding.uniform_messages_pure``: a run of
equal messages in the fixed layout, cut into ``Message`` tuples in one pass.

The pure version works with C-level builtins (``struct.iter_unpack``,
``zip``, ``map``) but still builds a 5-tuple per message to unpack it and a
9-tuple per message to zip the columns, then copies that into the
``Message``: about 45% of a batch subscriber's CPU (cProfile of
``bench_client --source feeder``). Here each message's fixed bytes are
checked in place and its ``Message`` is allocated once and filled.
Little-endian hosts only (elsewhere the import is refused and the pure
version runs).
"""

import sys

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.long cimport PyLong_FromLongLong
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM
from libc.stdint cimport int64_t, uint32_t
from libc.string cimport memcmp, memcpy

from broky.client._fixed_layout cimport (
    LENGTH_AT, PAYLOAD_AT, PAYLOAD_UOFFSET, PREFIX_BYTES, STAMP_AT, UOFFSET_AT, PyType_GenericAlloc,
)

if sys.byteorder != "little":
    raise ImportError("the compiled run cutter assumes a little-endian host")

# The fields of a Message.
cdef enum:
    FIELDS = 9

cdef inline void _set(object message, Py_ssize_t index, object value):
    Py_INCREF(value)  # PyTuple_SET_ITEM steals a reference
    PyTuple_SET_ITEM(message, index, value)


def uniform_messages(
    messages,
    Py_ssize_t count,
    Py_ssize_t size,
    bytes prefix,
    object key,
    object ts_broker,
    object partition,
    int64_t base_offset,
    type message_type,
):
    """See ``broky.client.decoding.uniform_messages_pure``."""
    cdef const unsigned char[::1] data = messages
    cdef const unsigned char* start
    cdef const unsigned char* expected = prefix
    cdef uint32_t uoffset, length, payload_length
    cdef int64_t stamp
    cdef Py_ssize_t index
    cdef PyTypeObject* cls = <PyTypeObject*>message_type
    if (
        count < 1 or size < PAYLOAD_AT or len(prefix) != PREFIX_BYTES
        or data.shape[0] != count * size
    ):
        return None
    memcpy(&payload_length, &data[0] + LENGTH_AT, 4)
    if payload_length > size - PAYLOAD_AT:
        return None
    for index in range(count):
        start = &data[0] + index * size
        memcpy(&uoffset, start + UOFFSET_AT, 4)
        memcpy(&length, start + LENGTH_AT, 4)
        if (
            memcmp(start, expected, PREFIX_BYTES) != 0
            or uoffset != PAYLOAD_UOFFSET
            or length != payload_length
        ):
            return None
    cdef list result = [None] * count
    cdef object empty = b""
    cdef object tags = ()
    cdef object message
    cdef object ephemeral = -1
    for index in range(count):
        start = &data[0] + index * size
        memcpy(&stamp, start + STAMP_AT, 8)
        # A new reference, and <object> takes one more: give that one back.
        message = <object>PyType_GenericAlloc(cls, FIELDS)
        Py_DECREF(message)
        _set(message, 0, key)
        _set(message, 1, PyBytes_FromStringAndSize(<const char*>start + PAYLOAD_AT, payload_length))
        _set(message, 2, empty)
        _set(message, 3, PyLong_FromLongLong(stamp))
        _set(message, 4, ts_broker)
        _set(message, 5, empty)
        _set(message, 6, tags)
        if base_offset < 0:
            _set(message, 7, ephemeral)
            _set(message, 8, ephemeral)
        else:
            _set(message, 7, partition)
            _set(message, 8, PyLong_FromLongLong(base_offset + index))
        result[index] = message
    return result
