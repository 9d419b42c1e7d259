# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of the subscription core's bulk passes on the ack side:
``broky.subscriptions.ack_pass``'s ``take_acked_pure`` and
``merge_acked_pure``, ``broky.subscriptions.slots.assign_pure``,
``broky.subscriptions.settle_ranges.gather_ranges_pure`` and
``broky.subscriptions.delivery``'s ``delivery_segments_pure`` and
``span_bounds_pure``, and ``broky.subscriptions.image.put_pairs_pure``
(see those modules for what they do and why): the same
loops with C-level dict and list calls and int64 arithmetic, so an acked
offset costs a few dict operations at C speed rather than a dozen bytecodes
each, and a moved slot one pointer store. Offsets are int64 (the wire's
width); one outside it raises OverflowError, where the pure twins would go
on. The delivery side (the fresh-read loop and the round's event passes)
is ``broky.subscriptions._feed``.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.dict cimport PyDict_Contains, PyDict_DelItem, PyDict_GetItemWithError, PyDict_SetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF


cdef extern from "Python.h":
    void Py_DecRef(PyObject* value)
    Py_ssize_t PyDict_GET_SIZE(object mapping)
from libc.stdint cimport INT64_MAX, int64_t

from broky.subscriptions._int_bisect cimport bisect_left, bisect_right, span_at

from broky.protocol.constants import SettleKind

cdef object _ZERO = 0
#: What ``dict.pop`` gives for a key it does not hold (no value stored is this).
cdef object _ABSENT = object()
cdef object _ACK = SettleKind.ACK


cdef inline object _window_pop(list entries, int64_t base, object offset):
    """``PendingWindow.pop(offset, _ABSENT)`` on its ``entries`` from
    ``base``: one index load and store (the window's reference passes to
    the caller)."""
    cdef int64_t at = <int64_t>offset - base
    cdef PyObject* found
    cdef object value
    if at < 0 or at >= PyList_GET_SIZE(entries):
        return _ABSENT
    found = PyList_GET_ITEM(entries, <Py_ssize_t>at)
    if found == <PyObject*>None:
        return _ABSENT
    value = <object>found
    Py_INCREF(None)
    PyList_SET_ITEM(entries, <Py_ssize_t>at, None)
    Py_DecRef(found)
    return value


def take_acked(dict counts, pending, dict due, offsets, tuple slots=None):
    # ``pending``: a dict, or an ordered tracker's ``PendingWindow``
    # (``broky.subscriptions.pending_window``), read through its entries.
    cdef bint windowed = type(pending) is not dict
    cdef dict pending_dict = None if windowed else pending
    cdef list entries = None
    cdef int64_t entries_base = 0
    if windowed:
        entries = pending.entries
        entries_base = pending.base
    cdef list done = []
    cdef list ended = []
    cdef list waiting = []
    cdef dict lost = {}
    cdef object held
    cdef object last_held = None
    cdef Py_ssize_t run = 0
    cdef list window = None
    cdef int64_t base = 0
    cdef dict holds = None
    cdef bint freeing = slots is not None
    # Whether ``done`` is ascending as built (a settle's ranges come in
    # order): the final sort, rich compares of ints, is then skipped.
    cdef bint ascending = True
    cdef int64_t last_done = -1, value
    if freeing:
        window, base, holds = slots
        if window is None or holds is None:
            raise TypeError("take_acked's slot maps must be a list, an int and a dict")
    for offset in offsets:
        # One lookup that takes the delivery out (a look, then a delete,
        # probed the table twice: most acked offsets are pending).
        if windowed:
            held = _window_pop(entries, entries_base, offset)
        else:
            held = pending_dict.pop(offset, _ABSENT)
        if held is _ABSENT:
            if not PyDict_GET_SIZE(counts) or PyDict_GetItemWithError(counts, offset) == NULL:
                continue
            PyDict_DelItem(counts, offset)
            value = offset
            if value <= last_done:
                ascending = False
            last_done = value
            done.append(offset)
            if PyDict_Contains(due, offset):
                waiting.append(offset)
            continue
        # A group's offsets have no count entry (``AckTracker.counts``),
        # and ``counts`` is empty while nothing was redelivered.
        if PyDict_GET_SIZE(counts) and PyDict_GetItemWithError(counts, offset) != NULL:
            PyDict_DelItem(counts, offset)
        value = offset
        if value <= last_done:
            ascending = False
        last_done = value
        done.append(offset)
        ended.append(offset)
        if freeing:
            _free_slot(window, base, holds, offset)
        # Consecutive offsets mostly share one delivery (a group): counted
        # as a run, one dict update per run.
        if held is last_held:
            run += 1
            continue
        if run:
            lost[last_held] = lost.get(last_held, _ZERO) + run
        last_held = held
        run = 1
    if run:
        lost[last_held] = lost.get(last_held, _ZERO) + run
    if not ascending:
        done.sort()
    return done, ended, lost, waiting


cdef inline int _free_slot(list window, int64_t base, dict holds, object offset) except -1:
    """``offset``'s slot holds one offset less (``holds``: slot ->
    ``[holder, count]``, changed in place); a slot holding none loses its
    entry, hence its holder. Its slot is read from the window (0 outside it)."""
    cdef int64_t at = <int64_t>offset - base
    cdef object slot = _ZERO
    if 0 <= at < PyList_GET_SIZE(window):
        slot = <object>PyList_GET_ITEM(window, <Py_ssize_t>at)
    cdef PyObject* found = PyDict_GetItemWithError(holds, slot)
    if found == NULL:
        return 0
    if type(<object>found) is not list or PyList_GET_SIZE(<object>found) != 2:
        raise TypeError("a slot's hold must be a [holder, count] list")
    cdef list hold = <list>found
    cdef Py_ssize_t held = <object>PyList_GET_ITEM(hold, 1)
    if held > 1:
        hold[1] = held - 1
        return 0
    PyDict_DelItem(holds, slot)
    return 0


def held_after(list window, int64_t base, object slot, int64_t offset, pending):
    # See ``ack_pass.held_after_pure``. A slot is compared by identity
    # first (the window's ints are often the very object), then by value;
    # ``pending``, a ``PendingWindow``, is read through its entries.
    cdef list later = []
    cdef Py_ssize_t at, size = PyList_GET_SIZE(window)
    cdef int64_t wanted = slot, position, entries_base = 0
    cdef PyObject* item
    cdef list entries = None
    cdef bint windowed = type(pending) is not dict and hasattr(pending, "entries")
    if windowed:
        entries = pending.entries
        entries_base = pending.base
    at = offset + 1 - base if offset + 1 - base > 0 else 0
    while at < size:
        item = PyList_GET_ITEM(window, at)
        if item == <PyObject*>slot or <int64_t><object>item == wanted:
            position = base + at
            if windowed:
                if (0 <= position - entries_base < PyList_GET_SIZE(entries)
                        and PyList_GET_ITEM(entries, <Py_ssize_t>(position - entries_base))
                        != <PyObject*>None):
                    later.append(position)
            elif position in pending:
                later.append(position)
        at += 1
    return later


cdef struct _Open:
    # The merged range being built: [first, last], when ``opened``, with
    # the int objects that hold those bounds (borrowed from the ranges or
    # the offsets: every bound of a merge is one of theirs, so the merged
    # lists take those objects and no int is made per range or offset).
    bint opened
    int64_t first
    int64_t last
    PyObject* first_object
    PyObject* last_object


cdef inline int _take(_Open* open_range, list firsts, list lasts, int64_t first,
                      int64_t last, object first_object, object last_object) except -1:
    """Add ``[first, last]`` (ranges come by ascending first; the objects
    hold the same bounds) to the merge: it joins the open range when it
    touches it, else closes it."""
    if open_range.opened and first <= open_range.last + 1:
        if last > open_range.last:
            open_range.last = last
            open_range.last_object = <PyObject*>last_object
        return 0
    if open_range.opened:
        firsts.append(<object>open_range.first_object)
        lasts.append(<object>open_range.last_object)
    open_range.opened = True
    open_range.first = first
    open_range.last = last
    open_range.first_object = <PyObject*>first_object
    open_range.last_object = <PyObject*>last_object
    return 0


def merge_acked(list firsts, list lasts, object cursor, list offsets):
    cdef Py_ssize_t count = len(offsets)
    if count == 0:
        return cursor
    cdef int64_t position = cursor
    cdef int64_t lowest = offsets[0]
    cdef int64_t highest = offsets[count - 1]
    cdef Py_ssize_t low = bisect_left(lasts, lowest - 1)
    cdef Py_ssize_t high = bisect_right(firsts, highest + 1)
    cdef Py_ssize_t index = low, at, drop
    cdef int64_t offset, first
    cdef object offset_object, first_object, last_object
    cdef list merged_firsts = []
    cdef list merged_lasts = []
    cdef _Open open_range
    open_range.opened = False
    for at in range(count):
        offset_object = <object>PyList_GET_ITEM(offsets, at)
        offset = offset_object
        while index < high:
            first_object = <object>PyList_GET_ITEM(firsts, index)
            first = first_object
            if first >= offset:
                break
            last_object = <object>PyList_GET_ITEM(lasts, index)
            _take(&open_range, merged_firsts, merged_lasts, first, last_object,
                  first_object, last_object)
            index += 1
        _take(&open_range, merged_firsts, merged_lasts, offset, offset,
              offset_object, offset_object)
    while index < high:
        first_object = <object>PyList_GET_ITEM(firsts, index)
        last_object = <object>PyList_GET_ITEM(lasts, index)
        _take(&open_range, merged_firsts, merged_lasts, first_object, last_object,
              first_object, last_object)
        index += 1
    merged_firsts.append(<object>open_range.first_object)
    merged_lasts.append(<object>open_range.last_object)
    firsts[low:high] = merged_firsts
    lasts[low:high] = merged_lasts
    # The ranges the cursor reaches leave in one cut (a front delete
    # each moved the rest of both lists).
    drop = 0
    while drop < PyList_GET_SIZE(firsts) and <int64_t>firsts[drop] <= position:
        position = max(position, <int64_t>lasts[drop] + 1)
        drop += 1
    if drop:
        del firsts[:drop]
        del lasts[:drop]
    return position


def assign(list owners, slots, object owner):
    # The table's slots come as an ``array("H")`` (read as C integers:
    # no int object touched per slot); a list as before.
    if type(slots) is not list:
        _assign_array(owners, slots, owner)
        return
    cdef list given = slots
    cdef Py_ssize_t size = PyList_GET_SIZE(owners), at, slot
    # Checked first: a slot that is no index of ``owners`` raises
    # IndexError with nothing changed (the callers never pass one).
    for at in range(PyList_GET_SIZE(given)):
        slot = <object>PyList_GET_ITEM(given, at)
        if slot < 0 or slot >= size:
            raise IndexError("list assignment index out of range")
    for at in range(PyList_GET_SIZE(given)):
        slot = <object>PyList_GET_ITEM(given, at)
        _store_owner(owners, slot, owner)


cdef int _assign_array(list owners, const unsigned short[:] slots, object owner) except -1:
    """``assign`` over an ``array("H")``."""
    cdef Py_ssize_t size = PyList_GET_SIZE(owners), at
    for at in range(slots.shape[0]):
        if slots[at] >= size:
            raise IndexError("list assignment index out of range")
    for at in range(slots.shape[0]):
        _store_owner(owners, slots[at], owner)
    return 0


cdef inline void _store_owner(list owners, Py_ssize_t slot, object owner):
    """``owners[slot] = owner`` (``slot`` checked): one pointer store."""
    cdef PyObject* old = PyList_GET_ITEM(owners, slot)
    Py_INCREF(owner)
    PyList_SET_ITEM(owners, slot, owner)
    Py_DecRef(old)


def gather_ranges(frame, tracker_of):
    cdef bint acking = frame.kind is _ACK
    cdef tuple numbers = frame.partitions
    cdef tuple firsts = frame.first_offsets
    cdef tuple lasts = frame.last_offsets
    cdef Py_ssize_t count = len(numbers), at
    cdef dict spans = {}
    cdef dict found = {}
    cdef int64_t first, last, cursor = 0, position = 0
    cdef object unconfirmed = 0
    cdef list singles = None
    cdef list ranges = None
    cdef object number, entry, tracker, last_number = None
    if len(firsts) != count or len(lasts) != count:
        raise ValueError("a settle's partitions and offsets differ in length")
    for at in range(count):
        number = numbers[at]
        # A settle's ranges come grouped by partition: the last one's
        # entry is kept in locals, the others looked up.
        if last_number is None or number != last_number:
            entry = found.get(number, found)
            if entry is found:
                tracker = tracker_of(number)
                if tracker is None:
                    entry = None
                else:
                    entry = (tracker.cursor, tracker.read_position, [])
                    spans[number] = [entry[2]]
                found[number] = entry
            last_number = number
            if entry is None:
                singles = None
            else:
                cursor, position, singles = entry
                ranges = spans[number]
        if singles is None:
            continue
        first = firsts[at]
        last = lasts[at]
        if acking and first == last and cursor <= first < position:
            singles.append(firsts[at])
            continue
        if last < position:
            ranges.append(range(first if first > cursor else cursor, last + 1))
            continue
        ranges.append(range(first if first > cursor else cursor, position))
        # In Python ints: ``last + 1`` may pass int64 (the wire's width).
        unconfirmed += lasts[at] + 1 - (first if first > position else position)
    return spans, unconfirmed


def span_bounds(list spans):
    cdef Py_ssize_t at, count = PyList_GET_SIZE(spans)
    cdef int64_t low = 0, high = 0, first, stop
    cdef object span
    if count == 0:
        raise ValueError("no spans to bound")
    for at in range(count):
        span = <object>PyList_GET_ITEM(spans, at)
        if type(span) is tuple and PyTuple_GET_SIZE(span) == 2:
            first = <object>PyTuple_GET_ITEM(span, 0)
            stop = <object>PyTuple_GET_ITEM(span, 1)
        else:
            first, stop = span
        if at == 0 or first < low:
            low = first
        if at == 0 or stop > high:
            high = stop
    return low, high


def delivery_segments(deliveries, list bases, list stops):
    cdef list segments = []
    cdef list lost = []
    cdef list ranges = None
    cdef list counts = None
    cdef Py_ssize_t held = len(bases), index, current = -1
    cdef int64_t first, stop, offset, upto, span_stop, redelivered
    cdef object count
    if len(stops) != held:
        raise ValueError("held spans' bases and stops differ in length")
    for delivery in deliveries:
        # Deliveries come as tuples: read in place (a generic unpack
        # iterates the tuple, once per delivery); any other triple unpacks.
        if type(delivery) is tuple and PyTuple_GET_SIZE(delivery) == 3:
            first = <object>PyTuple_GET_ITEM(delivery, 0)
            stop = <object>PyTuple_GET_ITEM(delivery, 1)
            count = <object>PyTuple_GET_ITEM(delivery, 2)
        else:
            first, stop, count = delivery
        offset = first
        index = span_at(bases, stops, current, offset)
        while offset < stop:
            if index >= 0 and offset < <int64_t>stops[index]:
                span_stop = stops[index]
                upto = stop if stop < span_stop else span_stop
                if index == current and offset >= <int64_t>ranges[len(ranges) - 1]:
                    if offset == <int64_t>ranges[len(ranges) - 1]:
                        ranges[len(ranges) - 1] = upto
                    else:
                        ranges.append(offset)
                        ranges.append(upto)
                else:
                    current = index
                    ranges = [offset, upto]
                    counts = []
                    segments.append((index, ranges, counts))
                if count > 1:
                    for redelivered in range(offset, upto):
                        counts.append((redelivered, count))
            else:
                if index + 1 < held and <int64_t>bases[index + 1] < stop:
                    upto = bases[index + 1]
                else:
                    upto = stop
                lost.extend(range(offset, upto))
            offset = upto
            if index + 1 < held and <int64_t>bases[index + 1] <= offset:
                index += 1
    return segments, lost


cdef inline Py_ssize_t _varint(unsigned char* out, int64_t value) except -1:
    """``value`` as an unsigned LEB128 varint at ``out``; its length."""
    cdef Py_ssize_t length = 0
    if value < 0:
        raise ValueError(f"negative value {value} in a subscription image")
    while value >= 0x80:
        out[length] = <unsigned char>((value & 0x7F) | 0x80)
        value >>= 7
        length += 1
    out[length] = <unsigned char>value
    return length + 1


def put_pairs(bytearray out, int64_t previous, pairs, bint ranges):
    """See ``broky.subscriptions.image.put_pairs_pure``. ``pairs``: a tuple
    of pairs, or ``acked_ranges.RangePairs`` (read through its columns:
    no tuple per range)."""
    cdef list firsts = None
    cdef list seconds = None
    cdef tuple given = None
    cdef Py_ssize_t count, index, length = 0
    cdef object pair
    cdef int64_t first, second
    if type(pairs) is tuple:
        given = pairs
        count = PyTuple_GET_SIZE(given)
    else:
        firsts = pairs.firsts
        seconds = pairs.lasts
        count = PyList_GET_SIZE(firsts)
        if PyList_GET_SIZE(seconds) != count:
            raise ValueError("range columns of different lengths")
    # Two varints of at most 10 bytes per pair.
    cdef bytearray buffer = bytearray(20 * count)
    cdef unsigned char* data = <unsigned char*>PyByteArray_AS_STRING(buffer)
    for index in range(count):
        if given is not None:
            pair = <object>PyTuple_GET_ITEM(given, index)
            first, second = pair
        else:
            first = <object>PyList_GET_ITEM(firsts, index)
            second = <object>PyList_GET_ITEM(seconds, index)
        length += _varint(data + length, first - previous)
        if ranges:
            length += _varint(data + length, second - first)
            if second == INT64_MAX:
                if index + 1 < count:
                    raise OverflowError("an acked range past the int64 offsets")
                break
            previous = second + 1
        else:
            length += _varint(data + length, second)
            previous = first
    out += buffer[:length]
