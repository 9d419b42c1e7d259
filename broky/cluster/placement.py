"""Placement: which nodes hold a copy of each topic partition.

A token ring of vbuckets, as in the seed design (Couchbase's model): every
partition ``(topic, p)`` belongs to vbucket ``(xxh3(topic) + p) mod V``, so a
topic's partitions spread over consecutive vbuckets, and each vbucket has a
replica set of ``replication_factor`` distinct nodes whose first entry is
the preferred leader. The vbucket map is *explicit*, stored in etcd and
changed from its previous state, not re-derived from membership each time:
a node whose lease blips must not move data.

``place`` is the one balancer, pure and deterministic (the same inputs give
the same map on every node and version): keep every replica that is still
on a live node; give each missing replica to the least-loaded node; then
move replicas from the most- to the least-loaded node until replica counts
differ by at most one; then swap replica order until leader counts differ
by at most one where a swap can do it. Ties break by rendezvous hashing of
(vbucket, node), so a change of membership moves few replicas: when a node
joins, only the joining node gains replicas, about its fair share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

import xxhash

#: Vbuckets per cluster. Fixed when the cluster is created (it is in the
#: cluster's config key): it bounds how finely load can be balanced (256
#: keeps replica counts within 1 of even up to 256 nodes) and is the number
#: of state keys in etcd, a few hundred bytes each.
DEFAULT_VBUCKETS = 256

#: The replica set of each vbucket, index = vbucket; first = preferred leader.
VbucketMap = list[tuple[str, ...]]


def vbucket_of(topic: str, partition: int, vbuckets: int) -> int:
    """The vbucket partition ``partition`` of ``topic`` belongs to."""
    if vbuckets < 1:
        raise ValueError(f"vbuckets must be >= 1, got {vbuckets}")
    return (xxhash.xxh3_64_intdigest(topic.encode()) + partition) % vbuckets


def _affinity(vbucket: int, node: str) -> int:
    """Rendezvous weight of ``node`` for ``vbucket``: breaks ties so that a
    node's share does not depend on which other nodes exist."""
    return xxhash.xxh3_64_intdigest(f"{vbucket}\x00{node}".encode())


def place(
    current: Sequence[Sequence[str]] | None,
    nodes: Collection[str],
    vbuckets: int,
    replication_factor: int,
) -> VbucketMap:
    """The vbucket map for ``nodes``, changed as little as balance allows
    from ``current`` (None: a new cluster).

    Each replica set has ``min(replication_factor, len(nodes))`` distinct
    nodes; with no nodes every set is empty."""
    if vbuckets < 1 or replication_factor < 1:
        raise ValueError(
            f"vbuckets and replication_factor must be >= 1, got {vbuckets}, {replication_factor}"
        )
    live = sorted(set(nodes))
    width = min(replication_factor, len(live))
    alive = set(live)
    replicas: list[list[str]] = []
    for vbucket in range(vbuckets):
        kept: list[str] = []
        old = current[vbucket] if current is not None and vbucket < len(current) else ()
        for node in old:
            if node in alive and node not in kept:
                kept.append(node)
        replicas.append(kept)
    load = Counter(dict.fromkeys(live, 0))
    for kept in replicas:
        load.update(kept)
    # Too many replicas (the replication factor went down): drop the copies
    # on the most-loaded nodes, never the preferred leader first.
    for vbucket, kept in enumerate(replicas):
        while len(kept) > width:
            victim = max(kept[1:], key=lambda node: (load[node], _affinity(vbucket, node)))
            kept.remove(victim)
            load[victim] -= 1
    # Missing replicas go to the least-loaded nodes.
    for vbucket, kept in enumerate(replicas):
        while len(kept) < width:
            chosen = min(
                (node for node in live if node not in kept),
                key=lambda node: (load[node], -_affinity(vbucket, node)),
            )
            kept.append(chosen)
            load[chosen] += 1
    _balance_replicas(replicas, live, load)
    _balance_leaders(replicas, live)
    return [tuple(kept) for kept in replicas]


def _balance_replicas(replicas: list[list[str]], live: list[str], load: Counter[str]) -> None:
    """Move replicas from the most- to the least-loaded node until counts
    differ by at most one. A node with more replicas than another always
    holds one the other lacks, so each step exists; each lowers the sum of
    squared loads, so the loop ends."""
    while live:
        heavy = max(live, key=lambda node: (load[node], node))
        light = min(live, key=lambda node: (load[node], node))
        if load[heavy] - load[light] <= 1:
            return
        vbucket = max(
            (v for v, kept in enumerate(replicas) if heavy in kept and light not in kept),
            key=lambda v: _affinity(v, light),
        )
        kept = replicas[vbucket]
        kept[kept.index(heavy)] = light  # same position: a leader stays first
        load[heavy] -= 1
        load[light] += 1


def _balance_leaders(replicas: list[list[str]], live: list[str]) -> None:
    """Swap a replica set's order so a less-leading replica leads, while
    that brings two nodes' leader counts closer (no data moves). Each swap
    lowers the sum of squared leader counts, so the loop ends."""
    leads = Counter(dict.fromkeys(live, 0))
    leads.update(kept[0] for kept in replicas if kept)
    while True:
        swap = None
        for vbucket, kept in enumerate(replicas):
            if not kept:
                continue
            leader = kept[0]
            follower = min(kept[1:], key=lambda node: (leads[node], node), default=None)
            if follower is not None and leads[leader] - leads[follower] >= 2:
                swap = (vbucket, kept.index(follower))
                break
        if swap is None:
            return
        vbucket, position = swap
        kept = replicas[vbucket]
        leads[kept[0]] -= 1
        leads[kept[position]] += 1
        kept[0], kept[position] = kept[position], kept[0]


def moved(before: Sequence[Sequence[str]], after: Sequence[Sequence[str]]) -> int:
    """How many replicas ``after`` places on a node that did not hold that
    vbucket in ``before`` (each is a copy of the vbucket's data to make)."""
    return sum(len(set(new) - set(old)) for old, new in zip(before, after, strict=True))
