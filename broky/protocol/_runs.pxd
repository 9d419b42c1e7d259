# The compiled run type (see _runs.pyx); cimported by the other compiled
# hot-path modules so that they read a run's fields without attribute lookups.

cdef class EncodedRun:
    cdef public object key
    cdef public Py_ssize_t count
    cdef public object chunk
