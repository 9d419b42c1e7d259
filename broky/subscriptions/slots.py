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

from typing import Final

import xxhash

#: Slots per subscription: 16 bits of the key hash.
SLOTS: Final = 65536
#: The owner of a slot while no consumer is attached.
NOBODY: Final = -1


def slot_of(sticky_key: bytes) -> int:
    """The slot of a message's sticky key."""
    return xxhash.xxh3_64_intdigest(sticky_key) >> 48


class SlotTable:
    """Slot → consumer id, balanced to within one slot (see the module docstring)."""

    def __init__(self) -> None:
        self._owners: list[int] = [NOBODY] * SLOTS
        #: Slots per consumer, in join order (ties go to earlier joiners).
        self.counts: dict[int, int] = {}

    def owner(self, slot: int) -> int:
        return self._owners[slot]

    def slots_of(self, consumer: int) -> list[int]:
        return [slot for slot, owner in enumerate(self._owners) if owner == consumer]

    def join(self, consumer: int) -> list[tuple[int, int, int]]:
        """Add ``consumer``; returns the moves as ``(slot, old owner, new owner)``."""
        if consumer in self.counts:
            return []
        self.counts[consumer] = 0
        return self._rebalance(set())

    def leave(self, consumer: int) -> list[tuple[int, int, int]]:
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

    def _rebalance(self, gone: set[int]) -> list[tuple[int, int, int]]:
        owners = self._owners
        counts = self.counts
        if not counts:
            orphaned = [(slot, owner, NOBODY) for slot, owner in enumerate(owners) if owner in gone]
            for slot, _, _ in orphaned:
                owners[slot] = NOBODY
            return orphaned
        base, extra = divmod(SLOTS, len(counts))
        # The consumers that already hold the most keep the ``extra`` slots:
        # that is what moves the fewest slots.
        ranked = sorted(counts, key=lambda consumer: -counts[consumer])
        targets = {consumer: base + (rank < extra) for rank, consumer in enumerate(ranked)}
        excess = {consumer: counts[consumer] - targets[consumer] for consumer in counts}
        takers = [consumer for consumer in ranked if excess[consumer] < 0]
        moves: list[tuple[int, int, int]] = []
        if not takers:
            return moves
        taker_index = 0
        for slot, owner in enumerate(owners):
            if owner in gone or owner == NOBODY:
                pass
            elif excess[owner] > 0:
                excess[owner] -= 1
                counts[owner] -= 1
            else:
                continue
            taker = takers[taker_index]
            owners[slot] = taker
            counts[taker] += 1
            excess[taker] += 1
            moves.append((slot, owner, taker))
            if excess[taker] == 0:
                taker_index += 1
                if taker_index == len(takers):
                    break
        return moves
