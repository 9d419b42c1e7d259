# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of ``broky.router.fanout.fan_out_pure`` (see that module)."""

from cpython cimport array
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_GET_ITEM, PyList_SET_ITEM
from cpython.object cimport PyObject, Py_SIZE
from cpython.ref cimport Py_INCREF, Py_DECREF

from broky.protocol._run_slots cimport (
    RUN_CHUNK, RUN_COUNT, RUN_KEY, RUN_MESSAGES, RUN_SIZES, run_field,
)
from broky.protocol._runs cimport EncodedRun

#: The run type this module reads as C fields; the Python side uses it only
#: if it is the one ``broky.protocol.frames`` hands out.
RUN_TYPE = EncodedRun


cdef inline void _add(list figures, Py_ssize_t index, Py_ssize_t amount) except *:
    old = <object>PyList_GET_ITEM(figures, index)
    new = old + amount
    Py_INCREF(new)
    Py_DECREF(old)
    PyList_SET_ITEM(figures, index, new)


cdef int _flush(tuple route, list batch, Py_ssize_t messages, Py_ssize_t size) except -1:
    for subscription in route:
        subscription.push_many(batch, messages, size)
    return 0


#: broky.router.fanout.ADMIT_EVERY (the twins' property test holds them equal).
cdef Py_ssize_t ADMIT_EVERY = 64


cdef inline int _tally(dict table, list passed, object key, Py_ssize_t count,
                       Py_ssize_t size) except -1:
    """``broky.router.fanout.tally``: add a run to ``key``'s figures if the
    key is tracked, else count it as passed; 0 when it is the
    ``ADMIT_EVERY``-th untracked run, due for admission (``passed`` reset)."""
    cdef PyObject* found = PyDict_GetItem(table, key)
    cdef array.array figures
    if found is not NULL:
        figures = <array.array?><object>found
        if figures.ob_descr.typecode != b'q' or Py_SIZE(figures) < 2:
            raise TypeError("topic figures must be array('q') pairs")
        figures.data.as_longlongs[0] += count
        figures.data.as_longlongs[1] += size
    elif <Py_ssize_t>passed[0] < ADMIT_EVERY - 1:
        _add(passed, 0, 1)
    else:
        passed[0] = 0
        return 0
    return 1


def fan_out(runs, Py_ssize_t start, routes, topics, list passed):
    """See ``broky.router.fanout.fan_out_pure``."""
    cdef Py_ssize_t stop = len(runs), position, count, size
    cdef Py_ssize_t published_runs = 0, published_messages = 0, unrouted = 0
    cdef Py_ssize_t batch_messages = 0, batch_bytes = 0
    cdef list batch = None
    cdef tuple batch_route = None
    cdef tuple subscriptions
    cdef PyObject* found
    cdef dict topic_table = topics
    cdef dict route_table = routes
    cdef bint counting = topics is not None
    cdef EncodedRun run
    for position in range(start, stop):
        run = <EncodedRun?>runs[position]
        key = run.key
        found = PyDict_GetItem(route_table, key)
        if found is NULL:
            stop = position
            break
        subscriptions = <tuple>found
        count = run.count
        size = len(run.chunk)
        if counting and not _tally(topic_table, passed, key, count, size):
            stop = position
            break
        published_runs += 1
        published_messages += count
        if not subscriptions:
            unrouted += count
        elif subscriptions is batch_route:
            batch.append(run)
            batch_messages += count
            batch_bytes += size
        else:
            if batch is not None:
                _flush(batch_route, batch, batch_messages, batch_bytes)
            batch = [run]
            batch_route = subscriptions
            batch_messages = count
            batch_bytes = size
    if batch is not None:
        _flush(batch_route, batch, batch_messages, batch_bytes)
    return stop, published_runs, published_messages, unrouted


def sweep(runs, Py_ssize_t budget, Py_ssize_t frame_room):
    """See ``broky.router.sweep.sweep_pure``."""
    cdef list chunks = []
    cdef Py_ssize_t taken_bytes = 0, taken_messages = 0, count, index
    cdef bytes chunk
    cdef EncodedRun run
    for item in runs:
        run = <EncodedRun?>item
        chunk = run.chunk
        taken_bytes += len(chunk)
        taken_messages += run.count
        chunks.append(chunk)
        if taken_bytes >= budget:
            break
    count = len(chunks)
    if taken_bytes + 4 * count > frame_room:
        return None
    if count == len(runs):
        runs.clear()
    else:
        popleft = runs.popleft
        for index in range(count):
            popleft()
    return chunks, taken_bytes, taken_messages


cdef inline Py_ssize_t _durable_size(
    Py_ssize_t sizes_at, Py_ssize_t key_len, Py_ssize_t sizes_len, Py_ssize_t messages_len
):
    """``broky.protocol.chunks._chunk_layout(sizes_at, ...)[-1]``: a durable
    chunk's length from its vectors' lengths."""
    cdef Py_ssize_t sizes_end = sizes_at + 4 + sizes_len
    cdef Py_ssize_t messages_at = sizes_end + ((4 - sizes_end) & 7)
    cdef Py_ssize_t messages_end = messages_at + 4 + messages_len
    cdef Py_ssize_t key_at = (messages_end + 3) & ~3
    cdef Py_ssize_t key_end = key_at + 4 + key_len + 1
    return (key_end + 7) & ~7


def count_unrouted(Py_ssize_t shift, Py_ssize_t sizes_at, runs, dict table, list passed, admit):
    """See ``broky.router.unrouted.count_unrouted_pure`` (``shift`` and
    ``sizes_at``: broky.protocol.chunks' ``DURABLE_CHUNK_SHIFT`` and
    ``DURABLE_SIZES_AT``, bound by the caller)."""
    cdef Py_ssize_t messages = 0, count, size
    for run in runs:  # fields loaded at their slots (``run_field``): once per run
        key = run_field(run, RUN_KEY)
        count = run_field(run, RUN_COUNT)
        chunk = run_field(run, RUN_CHUNK)
        if chunk is not None:
            size = len(chunk) + shift
        else:
            size = _durable_size(
                sizes_at, len(key), len(run_field(run, RUN_SIZES)),
                len(run_field(run, RUN_MESSAGES)),
            )
        messages += count
        if not _tally(table, passed, key, count, size):
            admit(key, count, size)
    return messages
