"""Held spans for the tests of the delivery cuts (pure and compiled)."""

from __future__ import annotations


def held_spans(layout: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The bases and stops of spans laid out as ``(gap before, length)``
    pairs from offset 0: sorted and disjoint, as a dispatcher holds them."""
    bases: list[int] = []
    stops: list[int] = []
    position = 0
    for gap, length in layout:
        bases.append(position + gap)
        stops.append(position + gap + length)
        position += gap + length
    return bases, stops
