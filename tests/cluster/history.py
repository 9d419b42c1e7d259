"""A Jepsen-style checker for replicated partitions: acked publishes vs final logs.

Clients publish payloads ``c<client>-<seq>`` with acks and record what was
acked where (``Acked``). After the nemesis has healed and every replica
caught up, the nodes are stopped and their files read. ``check`` then
counts, without stopping at the first problem:

- **lost**: an acked publish missing (or different) at its acked offset on
  a replica of the final ISR;
- **divergent**: an offset two replicas both hold with different bytes;
- **duplicates**: a payload stored more than once in a partition (a retry
  of a publish that had been stored; counted here, and the callers assert
  it is 0 for idempotent publishers);
- **out of order**: one client's acked publishes to a partition at offsets
  that do not grow with its sequence numbers.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping

import attrs

from broky.protocol.message import decode_message

#: (offset, key, message bytes), as LocalNode.records gives them.
Record = tuple[int, bytes, bytes]


@attrs.frozen
class Acked:
    client: int
    seq: int
    partition: int
    offset: int


@attrs.frozen
class Verdict:
    acked: int
    lost: list[str]
    divergent: list[str]
    duplicates: int
    out_of_order: list[str]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.divergent or self.out_of_order)


def payload(client: int, seq: int) -> bytes:
    return b"c%d-%d" % (client, seq)


def _payload_of(message: bytes) -> bytes:
    return decode_message(memoryview(message), "", 0).payload


def check(
    acked: Iterable[Acked],
    replicas: Mapping[str, Mapping[int, list[Record]]],
    in_sync: Iterable[str],
) -> Verdict:
    """See the module docstring; ``replicas`` maps a node to its records per
    partition, ``in_sync`` names the final ISR."""
    acked = list(acked)
    by_offset = {
        node: {
            p: {offset: (key, msg) for offset, key, msg in records} for p, records in parts.items()
        }
        for node, parts in replicas.items()
    }
    divergent: list[str] = []
    nodes = sorted(by_offset)
    partitions = sorted({p for parts in by_offset.values() for p in parts})
    for p in partitions:
        for i, first in enumerate(nodes):
            for second in nodes[i + 1 :]:
                a = by_offset[first].get(p, {})
                b = by_offset[second].get(p, {})
                divergent.extend(
                    f"partition {p} offset {offset}: {first} and {second} differ"
                    for offset in sorted(a.keys() & b.keys())
                    if a[offset] != b[offset]
                )
    lost = []
    for entry in acked:
        want = payload(entry.client, entry.seq)
        for node in in_sync:
            held = by_offset[node].get(entry.partition, {}).get(entry.offset)
            if held is None or _payload_of(held[1]) != want:
                lost.append(
                    f"{want.decode()} acked at {entry.partition}/{entry.offset}, not on {node}"
                )
    duplicates = 0
    reference = max(nodes, key=lambda n: sum(len(r) for r in by_offset[n].values()))
    for records in by_offset[reference].values():
        counts = Counter(_payload_of(msg) for _key, msg in records.values())
        duplicates += sum(n - 1 for n in counts.values() if n > 1)
    out_of_order = []
    per_stream: dict[tuple[int, int], list[Acked]] = {}
    for entry in acked:
        per_stream.setdefault((entry.client, entry.partition), []).append(entry)
    for (client, p), entries in per_stream.items():
        entries.sort(key=lambda e: e.seq)
        for before, after in itertools.pairwise(entries):
            if after.offset <= before.offset:
                out_of_order.append(
                    f"client {client} partition {p}: seq {after.seq} not after {before.seq}"
                )
    return Verdict(len(acked), lost, divergent, duplicates, out_of_order)
