# Building a Run without its attrs __init__ (see _run_slots.pyx); cimported
# by _forward.pyx, whose chunk reader builds one Run per run it reads. The
# slot helpers serve any class whose fields are __slots__ (the client's
# compiled Delivery builder, broky/client/_deliveries.pyx, uses them too).

from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int64_t

cdef object new_run(object key, int64_t ts_broker, int64_t count, object sizes,
                    object messages, object chunk, object partition=*,
                    object base_offset=*)

cdef bint slot_offsets(type cls, tuple names, Py_ssize_t* out) except -1

# A Run's fields in ``new_run``'s order, for ``run_field``.
cdef enum:
    RUN_KEY = 0
    RUN_TS_BROKER = 1
    RUN_COUNT = 2
    RUN_SIZES = 3
    RUN_MESSAGES = 4
    RUN_PARTITION = 5
    RUN_BASE_OFFSET = 6
    RUN_CHUNK = 7

cdef object run_field(object run, Py_ssize_t field)


cdef inline void store_slot(PyObject* target, Py_ssize_t offset, object value) noexcept:
    """Store ``value`` in a fresh object's empty slot at ``offset``
    (``tp_alloc`` zeroes an object's memory)."""
    cdef PyObject** slot = <PyObject**>((<char*>target) + offset)
    Py_INCREF(value)
    slot[0] = <PyObject*>value


cdef inline PyObject* load_slot(PyObject* source, Py_ssize_t offset) noexcept:
    """The borrowed value in ``source``'s slot at ``offset`` (NULL: unset)."""
    return (<PyObject**>((<char*>source) + offset))[0]
