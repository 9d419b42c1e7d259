# Bisection over a list of Python ints read as int64 (the held spans'
# bases and stops, acked ranges' bounds): ``bisect`` without its call
# overhead and rich comparisons, and the held-span lookup built on it.
# Inline, cimported by _passes.pyx and _feed.pyx; there is no module
# behind this file.

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


cdef inline Py_ssize_t span_at(
    list bases, list stops, Py_ssize_t current, int64_t offset
) except -2:
    """The held span ``offset`` may lie in: ``current`` when it holds it (a
    consumer's deliveries mostly go up one span after another, and the spans
    are sorted and disjoint: no bisection), else the last span starting at
    or below it (-1: none). The caller still checks ``offset`` against that
    span's stop."""
    if (
        current >= 0
        and <int64_t>bases[current] <= offset
        and offset < <int64_t>stops[current]
    ):
        return current
    return bisect_right(bases, offset) - 1
