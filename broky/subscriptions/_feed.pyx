# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of the subscription core's delivery side: the fresh-read
loop of ``broky.subscriptions.dispatch.Dispatcher.feed_slots`` and
``broky.subscriptions.round_events``' ``needed_spans_pure``,
``event_bounds_pure`` and ``sort_segments_pure``
(see those modules for what they do and why), with the Deliver events
built and read through their slots. The ack side is
``broky.subscriptions._passes``.
"""

from cpython.dict cimport PyDict_Contains, PyDict_GetItemWithError, PyDict_SetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdlib cimport calloc, free
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF


cdef extern from "Python.h":
    void Py_DecRef(PyObject* value)
    Py_ssize_t PyDict_GET_SIZE(object mapping)
    # A type's allocator alone (``object.__new__`` without its argument
    # checks and its call through ``tp_new_wrapper``).
    ctypedef struct _AllocType "PyTypeObject":
        PyObject* (*tp_alloc)(_AllocType* cls, Py_ssize_t items)
from libc.stdint cimport int64_t

from broky.protocol._run_slots cimport load_slot, slot_offsets, store_slot
from broky.subscriptions._int_bisect cimport span_at

from bisect import insort

#: ``broky.subscriptions.model.Deliver``, imported at the first feed: the
#: model imports the tracker, which loads this module.
cdef object _Deliver = None
cdef object _DeadLetter = None
#: Deliver's slot offsets (consumer, offset, count, stop), when they are
#: plain object slots (``_run_slots.slot_offsets``): an event is then built
#: without its attrs ``__init__`` (a third of a fresh delivery's cost here).
cdef Py_ssize_t _DELIVER_AT[4]
cdef bint _DELIVER_DIRECT = False
cdef tuple _DELIVER_FIELDS = ("consumer", "offset", "count", "stop")
cdef object _ONE = 1


cdef int _load_model() except -1:
    """Import the event classes (at first use: see ``_Deliver``)."""
    global _Deliver, _DeadLetter, _DELIVER_DIRECT
    from broky.subscriptions.model import DeadLetter, Deliver
    # Direct: plain slots, and no ``__new__`` of its own (allocated then).
    _DELIVER_DIRECT = (
        slot_offsets(Deliver, _DELIVER_FIELDS, _DELIVER_AT) and Deliver.__new__ is object.__new__
    )
    _DeadLetter = DeadLetter
    _Deliver = Deliver
    return 0


cdef object _new_deliver(object consumer, object offset, object stop):
    """``Deliver(consumer, offset, 1, stop)``."""
    if not _DELIVER_DIRECT:
        return _Deliver(consumer, offset, _ONE, stop)
    # ``object.__new__(Deliver)`` is this allocation, after a method call
    # and checks that cost more than the event (one per message when keys
    # change on every message).
    cdef PyObject* target = (<_AllocType*>_Deliver).tp_alloc(<_AllocType*>_Deliver, 0)
    if target == NULL:
        raise MemoryError()
    cdef object event = <object>target
    Py_DecRef(target)  # ``event`` holds the one reference
    store_slot(target, _DELIVER_AT[0], consumer)
    store_slot(target, _DELIVER_AT[1], offset)
    store_slot(target, _DELIVER_AT[2], _ONE)
    store_slot(target, _DELIVER_AT[3], stop)
    return event


cdef struct _Room:
    # A consumer's credit and in-flight figures, copied out of its
    # ``Consumer`` for one feed (``_load_rooms``), and whether the feed
    # changed them (``_store_rooms`` writes those back).
    int64_t credit
    int64_t in_flight
    int64_t max_in_flight
    bint touched
    # The consumer's group delivery of this feed (``AckTracker.open_group``,
    # opened at its first offset): its first and last offsets and how many
    # it holds. Left alone by ``_load_rooms``.
    int64_t group_first
    int64_t group_last
    Py_ssize_t group_size


cdef int _load_rooms(_Room* rooms, list states) except -1:
    cdef Py_ssize_t at
    for at in range(len(states)):
        state = states[at]
        rooms[at].credit = state.credit
        rooms[at].in_flight = state.in_flight
        rooms[at].max_in_flight = state.max_in_flight
        rooms[at].touched = False
    return 0


cdef int _store_rooms(_Room* rooms, list states) except -1:
    cdef Py_ssize_t at
    for at in range(len(states)):
        if rooms[at].touched:
            state = states[at]
            state.credit = rooms[at].credit
            state.in_flight = rooms[at].in_flight
            rooms[at].touched = False
    return 0


cdef inline int _set_stop(object event, int64_t stop) except -1:
    """``event.stop = stop`` for a Deliver, through its slot when the
    layout was checked (``_DELIVER_DIRECT``): the old value released."""
    cdef object value = stop
    cdef PyObject** place
    cdef PyObject* old
    if not _DELIVER_DIRECT:
        event.stop = value
        return 0
    place = <PyObject**>((<char*><PyObject*>event) + _DELIVER_AT[3])
    old = place[0]
    Py_INCREF(value)
    place[0] = <PyObject*>value
    Py_DecRef(old)  # NULL-safe
    return 0


cdef inline bint _continues(object last, object owner, object offset) except -1:
    """Whether event ``last`` is a first delivery to ``owner`` that ends
    right before ``offset`` (it then grows instead of a new event)."""
    if type(last) is not _Deliver and not isinstance(last, _Deliver):
        return False
    return _field(last, 3) == offset and _field(last, 0) == owner and _field(last, 2) == _ONE


#: Up to this many consumers, a slot owner's index is found by comparing
#: it with the consumers' ids (the same int objects the slot table holds:
#: ``attach`` stores one object in both) before the dict lookup.
cdef Py_ssize_t _SCANNED = 8


def feed_fresh(dispatcher, int64_t first, list slots, object now):
    """``Dispatcher.feed_slots`` of a key-shared dispatcher for offsets read
    right at its read position with nothing acked ahead (its ``fresh``
    case): the same decisions and the same state, the usual offset (its
    slot's owner has room, nothing of the slot waits) handed out here in C
    as ``_hand_fresh`` does, the others through the dispatcher's own
    methods. The consumers' credit and in-flight counts are C integers
    for the feed (``_Room``: each message read and changed them through
    five attribute accesses), written back before a slow-path call reads
    them and at the end. Each consumer's offsets enter the tracker's
    ``pending`` as they are decided, under one delivery per consumer
    (``open_group``/``close_group``: ``deliver_group`` without a list of
    the offsets and a second dict of them)."""
    if _Deliver is None:
        _load_model()
    cdef dict consumers = dispatcher.consumers
    cdef list states = list(consumers.values())
    cdef list ids = list(consumers)
    # Zeroed: nothing ``touched`` until loaded.
    cdef _Room* rooms = <_Room*>calloc(len(states) + 1, sizeof(_Room))
    if rooms == NULL:
        raise MemoryError()
    cdef dict index_of = {}
    cdef list spans = [None] * len(states)
    cdef list order = []
    cdef Py_ssize_t at, index
    for at, key in enumerate(ids):
        index_of[key] = at
    try:
        _load_rooms(rooms, states)
        _feed_fresh(
            dispatcher, first, slots, now, states, ids, rooms, index_of, spans, order
        )
    finally:
        try:
            # What changed reaches the consumers, even when the loop raised.
            _store_rooms(rooms, states)
            # And every offset entered in ``pending`` gets its delivery's
            # bounds and timer (in the order of the consumers' first
            # offsets, as ``_deliver_groups`` records them).
            close_group = dispatcher.tracker.close_group
            for index in order:
                close_group(
                    spans[index],
                    rooms[index].group_first,
                    rooms[index].group_last + 1,
                    rooms[index].group_size,
                )
        finally:
            free(rooms)


cdef int _feed_fresh(dispatcher, int64_t first, list slots, object now, list states,
                     list ids, _Room* rooms, dict index_of, list spans,
                     list order) except -1:
    """``feed_fresh``'s loop, ``rooms[index]`` standing for the figures
    of ``states[index]``, the consumer ``ids[index]``."""
    tracker = dispatcher.tracker
    cdef dict counts = tracker.counts
    cdef dict due = tracker.due
    # ``pending``: the tracker's ``PendingWindow`` (an ordered tracker's),
    # appended to at the read position through its entries; a dict (a
    # caller's stand-in) through the mapping.
    pending = tracker.pending
    cdef bint windowed = type(pending) is not dict
    cdef list entries = pending.entries if windowed else None
    cdef int64_t entries_base = pending.base if windowed else 0
    cdef list owners = dispatcher.table.owners
    # Per slot with pending offsets, ``[holder, count]`` (``DispatchCore._holds``).
    cdef dict holds = dispatcher._holds
    cdef dict waiting_by_slot = dispatcher._waiting
    cdef list events = dispatcher.events
    cdef int64_t limit = tracker.durable_limit
    cdef Py_ssize_t at, parked = 0, size = len(slots), index, scanned, look, slot_index
    # Each consumer's ``id`` (what its events and holds name), read once a
    # feed rather than once a message.
    cdef list owner_ids = [state.id for state in states]
    cdef Py_ssize_t consumers = len(ids)
    cdef object offset, slot, owner, state, span, held, last, waiting, hold
    # The Deliver this feed appended or grew last, its consumer's index and
    # its stop (``_continues`` without reading its fields).
    cdef object tail = None
    cdef Py_ssize_t tail_index = -1
    cdef int64_t tail_stop = 0
    cdef bint grows
    cdef PyObject* found
    cdef _Room* room
    scanned = consumers if consumers <= _SCANNED else 0
    open_group = tracker.open_group
    try_deliver = dispatcher._try_deliver
    for at in range(size):
        offset = first + at
        slot = slots[at]
        if PyDict_GET_SIZE(waiting_by_slot):
            waiting = waiting_by_slot.get(slot)
            if waiting:
                insort(waiting, offset)
                parked += 1
                continue
        # ``counts`` and ``due`` are empty while nothing was redelivered.
        if (
            first + at < limit
            and not (PyDict_GET_SIZE(counts) and PyDict_Contains(counts, offset))
            and not (PyDict_GET_SIZE(due) and PyDict_Contains(due, offset))
        ):
            slot_index = slot
            if slot_index < 0 or slot_index >= PyList_GET_SIZE(owners):
                raise IndexError("list index out of range")
            owner = <object>PyList_GET_ITEM(owners, slot_index)
            index = -1
            for look in range(scanned):
                if PyList_GET_ITEM(ids, look) == <PyObject*>owner:
                    index = look
                    break
            if index < 0:
                found = PyDict_GetItemWithError(index_of, owner)
                if found != NULL:
                    index = <object>found
            room = NULL if index < 0 else &rooms[index]
            found = PyDict_GetItemWithError(holds, slot)
            if found == NULL:
                hold = None
            else:
                hold = <object>found
                if type(hold) is not list or PyList_GET_SIZE(hold) != 2:
                    raise TypeError("a slot's hold must be a [holder, count] list")
            if (
                room != NULL
                and room.credit > 0
                and room.in_flight < room.max_in_flight
                and (hold is None or <object>PyList_GET_ITEM(hold, 0) == owner)
            ):
                state = states[index]
                owner = <object>PyList_GET_ITEM(owner_ids, index)
                span = spans[index]
                if span is None:
                    span = open_group(owner, now)
                    spans[index] = span
                    order.append(index)
                    room.group_first = first + at
                    room.group_size = 0
                room.group_last = first + at
                room.group_size += 1
                if windowed and first + at - entries_base == PyList_GET_SIZE(entries):
                    entries.append(span)
                else:
                    pending[offset] = span
                if not room.in_flight:
                    state.last_progress = now
                room.in_flight += 1
                room.credit -= 1
                room.touched = True
                # The slot's hold: made with this offset, or one more in it
                # (its holder is this owner already).
                if hold is None:
                    PyDict_SetItem(holds, slot, [owner, _ONE])
                else:
                    (<list>hold)[1] = <object>PyList_GET_ITEM(hold, 1) + 1
                # This feed's last event grows on C checks; another one (the
                # slow path's, or older) is checked through its fields.
                grows = False
                if PyList_GET_SIZE(events):
                    last = <object>PyList_GET_ITEM(events, PyList_GET_SIZE(events) - 1)
                    if last is tail:
                        grows = tail_index == index and tail_stop == first + at
                    elif _continues(last, owner, offset):
                        grows = True
                        tail = last
                        tail_index = index
                tail_stop = first + at + 1
                if grows:
                    _set_stop(tail, tail_stop)
                else:
                    tail = _new_deliver(owner, offset, tail_stop)
                    events.append(tail)
                    tail_index = index
                continue
        # The slow path sees the read position the pure loop would have set.
        tracker.read_position = first + at + 1
        _store_rooms(rooms, states)
        delivered = try_deliver(slot, offset, now)
        _load_rooms(rooms, states)
        if windowed:
            entries_base = pending.base
        if not delivered:
            waiting_by_slot[slot] = [offset]
            parked += 1
    _store_rooms(rooms, states)  # the consumers hold their own figures again
    if tracker.read_position < first + size:
        tracker.read_position = first + size
    if parked:
        dispatcher.parked += parked
    return 0


cdef inline object _field(object event, Py_ssize_t index):
    """Field ``index`` of a Deliver (consumer, offset, count, stop), read
    from its slot when the layout was checked (``_DELIVER_DIRECT``)."""
    cdef PyObject* value
    if _DELIVER_DIRECT:
        value = load_slot(<PyObject*>event, _DELIVER_AT[index])
        if value != NULL:
            return <object>value
    return getattr(event, _DELIVER_FIELDS[index])


def needed_spans(batches):
    cdef list spans = []
    if _Deliver is None:
        _load_model()
    for batch in batches:
        for event in batch:
            if type(event) is _Deliver or isinstance(event, _Deliver):
                spans.append((_field(event, 1), _field(event, 3)))
            elif isinstance(event, _DeadLetter):
                spans.append((event.offset, event.offset + 1))
    return spans


def event_bounds(batches):
    # C integers: two comparisons an event, not two rich compares of ints.
    cdef int64_t low = 0, high = 0, first, stop
    cdef bint found = False
    if _Deliver is None:
        _load_model()
    for batch in batches:
        for event in batch:
            if type(event) is _Deliver or isinstance(event, _Deliver):
                first = _field(event, 1)
                stop = _field(event, 3)
            elif isinstance(event, _DeadLetter):
                first = event.offset
                stop = first + 1
            else:
                continue
            if not found:
                low, high, found = first, stop, True
            else:
                if first < low:
                    low = first
                if stop > high:
                    high = stop
    return (low, high) if found else None


cdef inline object _bound(object given, int64_t value, int64_t wanted):
    """``wanted`` as an int object: ``given`` itself when it is ``value``."""
    if value == wanted:
        return given
    return wanted


cdef class _Cut:
    """One consumer's deliveries being cut along the held spans: its
    segments and lost offsets (``delivery_segments``' answer) and its open
    segment (span index, ranges, where they end)."""
    cdef list segments
    cdef list lost
    cdef list ranges
    cdef list counts
    cdef Py_ssize_t current
    cdef int64_t end


def sort_segments(list events, list bases, list stops):
    cdef dict per_consumer = {}
    cdef dict cuts = {}
    cdef list others = []
    cdef Py_ssize_t held = len(bases), index
    cdef int64_t first, stop, offset, upto, span_stop, redelivered
    cdef int64_t delivered = 0, again = 0
    cdef object consumer, count, last_consumer = None, first_object, stop_object
    cdef _Cut cut = None
    cdef PyObject* found
    if len(stops) != held:
        raise ValueError("held spans' bases and stops differ in length")
    if _Deliver is None:
        _load_model()
    for event in events:
        if type(event) is not _Deliver and not isinstance(event, _Deliver):
            others.append(event)
            continue
        consumer = _field(event, 0)
        first_object = _field(event, 1)
        count = _field(event, 2)
        stop_object = _field(event, 3)
        first = first_object
        stop = stop_object
        delivered += stop - first
        if count is not _ONE and count > 1:
            again += stop - first
        # A consumer's cut found by its id, the last one without a lookup.
        if cut is None or consumer is not last_consumer:
            found = PyDict_GetItemWithError(cuts, consumer)
            if found == NULL:
                cut = _Cut.__new__(_Cut)
                cut.segments = []
                cut.lost = []
                cut.current = -1
                cut.end = 0
                cuts[consumer] = cut
                per_consumer[consumer] = (cut.segments, cut.lost)
            else:
                cut = <_Cut>found
            last_consumer = consumer
        # ``delivery_segments``' step, on this consumer's open segment.
        offset = first
        index = span_at(bases, stops, cut.current, offset)
        while offset < stop:
            if index >= 0 and offset < <int64_t>stops[index]:
                span_stop = stops[index]
                upto = stop if stop < span_stop else span_stop
                # A delivery inside one held span (the usual one) keeps
                # its event's int objects: no new int a bound.
                if index == cut.current and offset >= cut.end:
                    if offset == cut.end:
                        cut.ranges[len(cut.ranges) - 1] = _bound(stop_object, stop, upto)
                    else:
                        cut.ranges.append(_bound(first_object, first, offset))
                        cut.ranges.append(_bound(stop_object, stop, upto))
                else:
                    cut.current = index
                    cut.ranges = [
                        _bound(first_object, first, offset), _bound(stop_object, stop, upto)
                    ]
                    cut.counts = []
                    cut.segments.append((index, cut.ranges, cut.counts))
                cut.end = upto
                if count is not _ONE and count > 1:
                    for redelivered in range(offset, upto):
                        cut.counts.append((redelivered, count))
            else:
                if index + 1 < held and <int64_t>bases[index + 1] < stop:
                    upto = bases[index + 1]
                else:
                    upto = stop
                cut.lost.extend(range(offset, upto))
            offset = upto
            if index + 1 < held and <int64_t>bases[index + 1] <= offset:
                index += 1
    return per_consumer, delivered, again, others
