# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A Run built field by field, for the compiled chunk reader (``_forward``).

``Run`` is a frozen attrs class, whose ``__init__`` sets each of its eight
slots through a bound ``object.__setattr__`` call (about half of what
decoding a one-message run costs). Its slots are plain object members
(``__slots__``): where the member descriptors say so, each field is stored
straight at its offset in the new object, which is what the descriptor's
``__set__`` does after finding the descriptor by name
(PyObject_GenericSetAttr, the fallback where the layout is not as checked
below). It lives apart from ``_forward`` because it depends on nothing
there: it knows Run's layout, not the wire's.

A Run built here is untracked by the cycle collector: its fields are bytes,
ints, None and memoryviews of a received frame, none of which can refer
back to a Run, so it can never be part of a cycle. A consumer buffers up to
its credit of runs (one per message when keys change on every message:
tens of thousands per connection), and each collection of the older
generations walked all of them: with 80,000 runs alive, decoding a
one-message run cost 1,445 ns tracked against 333 ns untracked
(``decode_frame`` of 5,000-run Deliver frames, 16 frames kept alive).
"""

from cpython.object cimport PyObject, PyObject_GenericSetAttr

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void* op)
from libc.stdint cimport int64_t

from broky.protocol.frames import Run

cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        const char* name
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    int T_OBJECT_EX
    int READONLY

cdef object _RUN_NEW = Run.__new__
cdef str _KEY = "key"
cdef str _TS_BROKER = "ts_broker"
cdef str _COUNT = "count"
cdef str _SIZES = "sizes"
cdef str _MESSAGES = "messages"
cdef str _PARTITION = "partition"
cdef str _BASE_OFFSET = "base_offset"
cdef str _CHUNK = "chunk"
cdef object _ZERO = 0
cdef object _NO_OFFSET = -1

#: Run's eight field offsets in the field order of ``new_run``, or all -1.
cdef Py_ssize_t _OFFSETS[8]


cdef bint slot_offsets(type cls, tuple names, Py_ssize_t* out) except -1:
    """Fill ``out`` with the offsets of ``names`` in ``cls`` when every one
    is a writable object slot of ``cls``'s own (a member descriptor in its
    ``__dict__``), all distinct; False, ``out`` untouched, otherwise
    (another Python, another attrs): the caller keeps a generic path."""
    cdef PyMemberDef* member
    slots = cls.__dict__
    found = []
    for name in names:
        descriptor = slots.get(name)
        if descriptor is None or type(descriptor).__name__ != "member_descriptor":
            return False
        member = (<PyMemberDescrObject*><PyObject*>descriptor).d_member
        if member.type != T_OBJECT_EX or member.flags & READONLY or member.offset <= 0:
            return False
        if member.offset + <Py_ssize_t>sizeof(PyObject*) > cls.__basicsize__:
            return False
        found.append(member.offset)
    if len(set(found)) != len(names):
        return False
    for index in range(len(names)):
        out[index] = found[index]
    return True


cdef tuple _NAMES = (
    _KEY, _TS_BROKER, _COUNT, _SIZES, _MESSAGES, _PARTITION, _BASE_OFFSET, _CHUNK
)
cdef bint _DIRECT = slot_offsets(Run, _NAMES, _OFFSETS)
#: Whether ``new_run`` stores at the offsets (see ``slot_offsets``).
DIRECT_SLOTS = _DIRECT


cdef object new_run(object key, int64_t ts_broker, int64_t count, object sizes,
                    object messages, object chunk, object partition=_ZERO,
                    object base_offset=_NO_OFFSET):
    """The Run of these fields, as ``Run(...)`` builds it but without its
    per-field attribute lookups."""
    cdef object run = _RUN_NEW(Run)
    cdef PyObject* target = <PyObject*>run
    if _DIRECT:
        store_slot(target, _OFFSETS[0], key)
        store_slot(target, _OFFSETS[1], ts_broker)
        store_slot(target, _OFFSETS[2], count)
        store_slot(target, _OFFSETS[3], sizes)
        store_slot(target, _OFFSETS[4], messages)
        store_slot(target, _OFFSETS[5], partition)
        store_slot(target, _OFFSETS[6], base_offset)
        store_slot(target, _OFFSETS[7], chunk)
        # Out of the cycle collector's sight: see the module docstring.
        PyObject_GC_UnTrack(target)
        return run
    PyObject_GenericSetAttr(run, _KEY, key)
    PyObject_GenericSetAttr(run, _TS_BROKER, ts_broker)
    PyObject_GenericSetAttr(run, _COUNT, count)
    PyObject_GenericSetAttr(run, _SIZES, sizes)
    PyObject_GenericSetAttr(run, _MESSAGES, messages)
    PyObject_GenericSetAttr(run, _PARTITION, partition)
    PyObject_GenericSetAttr(run, _BASE_OFFSET, base_offset)
    PyObject_GenericSetAttr(run, _CHUNK, chunk)
    return run


cdef object run_field(object run, Py_ssize_t field):
    """Field ``field`` (``RUN_KEY`` ... ``RUN_CHUNK``) of ``run``: loaded
    from its slot for a ``Run`` where the layout was checked, by name
    otherwise. The compiled passes over a round's runs (the batch encoder,
    the partition grouping, the unrouted count) read a few fields of every
    run; a generic attribute read costs a type lookup and a descriptor call
    each, several times the load."""
    cdef PyObject* value
    if _DIRECT and type(run) is Run:
        value = (<PyObject**>((<char*><PyObject*>run) + _OFFSETS[field]))[0]
        if value != NULL:
            return <object>value
    return getattr(run, _NAMES[field])
