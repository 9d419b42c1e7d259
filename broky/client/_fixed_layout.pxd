# What the client's compiled decoders (_uniform.pyx, _deliveries.pyx) share:
# the fixed message layout ``encode_message`` writes for a payload-only
# message (see broky.client.decoding) and the allocator they build objects
# with. Declarations only: there is no module behind this file.

from cpython.object cimport PyObject, PyTypeObject

cdef extern from "Python.h":
    PyObject* PyType_GenericAlloc(PyTypeObject* type, Py_ssize_t items) except NULL

# Offsets in the fixed layout: ts_producer, the payload's uoffset and
# length, its bytes; the uoffset every such message has; the prefix's size.
cdef enum:
    STAMP_AT = 24
    UOFFSET_AT = 32
    LENGTH_AT = 48
    PAYLOAD_AT = 52
    PAYLOAD_UOFFSET = 16
    PREFIX_BYTES = 24
