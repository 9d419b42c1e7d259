# Bisection over a list of Python ints read as int64 (the held spans'
# bases and stops, acked ranges' bounds): ``bisect`` without its call
# overhead and rich comparisons. Inline, cimported by _passes.pyx and
# _feed.pyx; there is no module behind this file.

from libc.stdint cimport int64_t


cdef inline Py_ssize_t bisect_left(list values, int64_t target) except -1:
    cdef Py_ssize_t low = 0, high = len(values), middle
    while low < high:
        middle = (low + high) // 2
        if <int64_t>values[middle] < target:
            low = middle + 1
        else:
            high = middle
    return low


cdef inline Py_ssize_t bisect_right(list values, int64_t target) except -1:
    cdef Py_ssize_t low = 0, high = len(values), middle
    while low < high:
        middle = (low + high) // 2
        if target < <int64_t>values[middle]:
            high = middle
        else:
            low = middle + 1
    return low
