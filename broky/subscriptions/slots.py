"""The key-shared slot table: which consumer owns each of 65,536 key slots.

A message's slot is the top 16 bits of the 64-bit xxh3 hash of its sticky key
(as Pulsar hashes keys into [0, 65535] since PIP-379). The table assigns every
slot to one consumer, explicitly (no consistent-hash ring): after any join or
leave the counts differ by at most one slot (exact balance), and the fewest
slots move (Pulsar's range splitting left one consumer > 90 % of the keys after
removals, #6791/#10523; rings have collisions, PIP-119).

Moving a slot here says nothing about messages already out: the dispatcher
keeps a moved slot's new messages back until the old owner holds none of that
slot (draining, ``dispatch.py``).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Final

import xxhash

from broky.compiled import compiled_twin
from broky.protocol.codec import u32_array
from broky.storage.batch_reading import RecordBatch
from broky.storage.topics import has_key_partition, key_partition

#: Slots per subscription: 16 bits of the key hash.
SLOTS: Final = 65536
#: The owner of a slot while no consumer is attached.
NOBODY: Final = -1

#: Slots that changed owner in a join or leave: ``(slots, old owner, new
#: owner)``, one per old owner and new owner, not a tuple per slot (a
#: consumer's join or leave moves tens of thousands of slots in every
#: partition of the subscription, and made as many tuples).
Move = tuple[Sequence[int], int, int]
#: The typecode of the slot arrays (``SlotTable``): every slot fits 16 bits.
SLOT_TYPECODE: Final = "H"


def slot_of(sticky_key: bytes) -> int:
    """The slot of a message's sticky key."""
    return xxhash.xxh3_64_intdigest(sticky_key) >> 48


def message_slots_pure(batch: RecordBatch, start: int, stop: int) -> list[int]:
    """The slot of each message in ``[start, stop)`` of a verified record
    batch, read from its columns: the slot of its sticky key, its
    ``key_partition`` or else its run's key.

    Why columns and one list: a key-shared subscription over keys that
    change on every message would otherwise make a run object per message
    to learn its key. Each distinct run key is hashed once per call. The
    compiled twin (``broky.storage._partitions.message_slots``) reads the
    same fields in C and gives the same slots, or raises the same errors;
    it hashes each key where it lies with xxHash's own XXH3 (the vendored
    header, ``vendor/xxhash``), with no bytes object per key.
    """
    view = batch.messages
    size_table = u32_array(batch.sizes)
    known: dict[bytes, int] = {}
    slots: list[int] = []
    offset = batch.base_offset
    message = key_at = position = 0
    for count, key_length in zip(batch.counts, batch.key_lengths, strict=True):
        if offset >= stop:
            break
        if offset + count <= start:
            position += sum(size_table[message : message + count])
        else:
            key = bytes(batch.keys[key_at : key_at + key_length])
            run_slot = known.get(key)
            if run_slot is None:
                run_slot = known[key] = slot_of(key)
            for index in range(message, message + count):
                size = size_table[index]
                if start <= offset + index - message < stop:
                    sticky = (
                        key_partition(view[position : position + size])
                        if has_key_partition(view, position)
                        else b""
                    )
                    slots.append(slot_of(sticky) if sticky else run_slot)
                position += size
        offset += count
        message += count
        key_at += key_length
    return slots


#: :func:`message_slots_pure` compiled, when it is built.
message_slots_compiled: Callable[[RecordBatch, int, int], list[int]] | None = compiled_twin(
    "broky.storage._partitions", "message_slots"
)
message_slots = message_slots_compiled or message_slots_pure


#: Every slot in order, copied (a memcpy) into each new table: built from
#: ``range`` it cost 6.4 ms a table (an int object read per slot), one per
#: partition of every subscription created or loaded, for shared ones too
#: (8 partitions: ~50 ms of each new subscription's first attach).
_EVERY_SLOT: Final = array(SLOT_TYPECODE, range(SLOTS))


class SlotTable:
    """Slot → consumer id, balanced to within one slot (see the module docstring).

    Each owner's slots are also kept as a list (``NOBODY``'s too), so a join
    or leave touches only the slots it moves (the newcomer's share, the
    leaver's slots), never all 65,536: a consumer attaching to a key-shared
    subscription over many partitions pays one rebalance per partition.
    Those lists, and the moves, are ``array("H")``s, not lists of ints:
    a rebalance copies tens of thousands of slots several times (sliced,
    extended, dealt), and as ints every copy touched each slot's int
    object (a reference count each, cache misses over 2 MiB of ints per
    partition); as arrays each copy is a memcpy of 2 bytes a slot. 4 joins
    and 4 leaves over 8 partitions were ~5 % of a key-shared broker's
    samples in ``bench_consumers`` (py-spy, the joins are in its timed
    phase).
    """

    def __init__(self) -> None:
        #: Slot → owner; read it, change it only through join and leave.
        self.owners: list[int] = [NOBODY] * SLOTS
        #: Slots per consumer, in join order (ties go to earlier joiners).
        self.counts: dict[int, int] = {}
        #: Each owner's slots, in the order it got them.
        self._slots: dict[int, array[int]] = {NOBODY: _EVERY_SLOT[:]}

    def owner(self, slot: int) -> int:
        return self.owners[slot]

    def slots_of(self, consumer: int) -> list[int]:
        return sorted(self._slots.get(consumer, ()))

    def join(self, consumer: int) -> list[Move]:
        """Add ``consumer``; returns the moves (see :data:`Move`)."""
        if consumer in self.counts:
            return []
        self.counts[consumer] = 0
        self._slots[consumer] = array(SLOT_TYPECODE)
        return self._rebalance(set())

    def leave(self, consumer: int) -> list[Move]:
        """Remove ``consumer``; its slots go to the others (or to nobody)."""
        if consumer not in self.counts:
            return []
        del self.counts[consumer]
        return self._rebalance({consumer})

    def spread(self) -> tuple[int, int]:
        """The fewest and most slots any consumer owns (0, 0 with none)."""
        if not self.counts:
            return (0, 0)
        return (min(self.counts.values()), max(self.counts.values()))

    def _rebalance(self, gone: set[int]) -> list[Move]:
        owners = self.owners
        counts = self.counts
        held = self._slots
        # The slots that must move: the leavers', the unowned ones, and
        # (below) what each remaining consumer holds above its target, with
        # whose they were as (owner, how many) pieces of ``free``. Moved in
        # slices, C-speed, not slot by slot.
        free = array(SLOT_TYPECODE)
        sources: list[tuple[int, int]] = []
        for owner in (*sorted(gone), NOBODY):
            slots = held.pop(owner, None)
            if slots is None:
                slots = array(SLOT_TYPECODE)
            free.extend(slots)
            sources.append((owner, len(slots)))
        if not counts:
            _assign(owners, free, NOBODY)
            held[NOBODY] = free
            return [
                move for move in _moves(free, sources, 0, len(free), NOBODY) if move[1] != NOBODY
            ]
        base, extra = divmod(SLOTS, len(counts))
        # The consumers that already hold the most keep the ``extra`` slots:
        # that is what moves the fewest slots.
        ranked = sorted(counts, key=lambda consumer: -counts[consumer])
        targets = {consumer: base + (rank < extra) for rank, consumer in enumerate(ranked)}
        for consumer in ranked:
            excess = counts[consumer] - targets[consumer]
            if excess > 0:
                mine = held[consumer]
                free.extend(mine[-excess:])
                sources.append((consumer, excess))
                del mine[-excess:]
                counts[consumer] -= excess
        moves: list[Move] = []
        taken = 0
        for consumer in ranked:
            wanted = targets[consumer] - counts[consumer]
            if wanted <= 0:
                continue
            slots = free[taken : taken + wanted]
            _assign(owners, slots, consumer)
            held[consumer].extend(slots)
            moves.extend(_moves(free, sources, taken, taken + wanted, consumer))
            counts[consumer] += wanted
            taken += wanted
        return moves


def _moves(
    free: array[int], sources: list[tuple[int, int]], first: int, stop: int, new: int
) -> list[Move]:
    """The moves of ``free[first:stop]`` to ``new``: one per piece of
    ``free`` that one old owner gave (``sources``, in ``free``'s order)."""
    moves: list[Move] = []
    at = 0
    for old, count in sources:
        low, high = max(at, first), min(at + count, stop)
        if low < high:
            moves.append((free[low:high], old, new))
        at += count
    return moves


def assign_pure(owners: list[int], slots: Sequence[int], owner: int) -> None:
    """``owners[slot] = owner`` for every slot (each an index of
    ``owners``), without a Python step each. A join or leave moves tens of
    thousands of slots in every partition of the subscription: the
    compiled twin (``broky.subscriptions._passes.assign``) stores each with
    one pointer write (8 partitions' 4 joins and 4 leaves: 69 ms of CPU
    here, 23 ms compiled). ``slots``: a list, or an ``array("H")`` (the
    table's), which the compiled twin reads as C integers."""
    deque(map(owners.__setitem__, slots, repeat(owner)), maxlen=0)


#: :func:`assign_pure` compiled, when it is built.
assign_compiled: Callable[[list[int], Sequence[int], int], None] | None = compiled_twin(
    "broky.subscriptions._passes", "assign"
)
assign = assign_compiled or assign_pure


def _assign(owners: list[int], slots: array[int], owner: int) -> None:
    """:func:`assign`; every slot at once (the first join's and the last
    leave's) as one list fill where the compiled twin is missing (it
    stores them faster than a fill, which builds a second list)."""
    if assign_compiled is None and len(slots) == len(owners):
        owners[:] = repeat(owner, len(owners))
    else:
        assign(owners, slots, owner)
