"""Moving vbuckets between nodes (rebalancing), as data: the steps of a move.

When a node joins, or is removed for good (``broky cluster remove-node``),
the controller computes the balanced map (broky.cluster.placement, which
moves as few replicas as it can) and takes each vbucket that must change
there in steps, one etcd compare-and-swap per step (Kafka's KIP-455
reassignment, Couchbase's vbucket takeover):

1. **start**: record the ``target`` replica set in the vbucket's state;
2. **add**: the target's nodes that are not replicas yet join ``replicas``
   (not the ISR): the replica set is briefly larger than the replication
   factor, and each new replica catches up by the ordinary follower fetch;
3. **wait**: the leader adds each new replica to the ISR once it holds
   everything below the high watermark (broky.cluster.isr's rule 4), so a
   move never makes a replica count before it has the data;
4. **lead**: once every target node is in the ISR, the target's first node
   (the preferred leader) takes over if it does not lead yet: a new leader
   epoch, chosen from the ISR like any election, so there are never two
   leaders and the old one is fenced;
5. **drop**: the replicas outside the target leave ``replicas`` and the
   ISR, and ``target`` is cleared: the move is complete; a dropped replica
   deletes its copy only now (broky.replication.dropped).

The ISR never shrinks because of a move: step 5 needs every target node in
sync, so the ISR after it is the whole target (``replication_factor``
nodes, at least ``min_insync`` as the cluster is configured). A node that
is down is not removed: the nodes the map may use are the live ones plus
those already holding replicas, minus the decommissioned ones, so a down
node's replicas wait for it as before. At most ``max_moves`` vbuckets move
at once, so catching up does not starve live traffic.

A move whose new replica dies waits for it to come back; removing that
node for good re-plans the move (its target is replaced).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs

from broky.cluster.placement import place
from broky.cluster.settings import ClusterSettings
from broky.cluster.state import VbucketState, after_membership

#: Vbuckets moving at once: each new replica fetches its vbucket's whole
#: log from the leader, so a few at a time keep catch-up traffic (and the
#: leaders' disk reads) a small share next to live publishes.
DEFAULT_MAX_MOVES = 4


def next_step(state: VbucketState, live: Mapping[str, int]) -> VbucketState | None:
    """The next write of the move ``state`` is in (None: nothing to do yet,
    or no move). ``live`` maps each live node to its current life."""
    target = state.target
    if not target:
        return None
    adding = tuple(node for node in target if node not in state.replicas)
    if adding:
        if any(node not in live for node in adding):
            return None  # a new replica must be alive to catch up
        return attrs.evolve(state, replicas=state.replicas + adding)
    in_sync = {node for node, life in state.isr if live.get(node) == life}
    if not set(target) <= in_sync:
        return None  # catching up: the leader adds them to the ISR
    preferred = target[0]
    if state.leader != preferred:
        return attrs.evolve(state, leader=preferred, epoch=state.epoch + 1)
    isr = tuple(entry for entry in state.isr if entry[0] in target)
    return VbucketState(target, preferred, state.epoch, isr)


def usable_nodes(
    states: Mapping[int, VbucketState], live: Collection[str], decommissioned: Collection[str]
) -> set[str]:
    """The nodes the map may place replicas on: the live ones and those
    holding replicas (down, not gone), minus the decommissioned ones."""
    holding = {node for state in states.values() for node in (*state.replicas, *state.target)}
    return (set(live) | holding) - set(decommissioned)


def plan_moves(
    states: Mapping[int, VbucketState],
    live: Mapping[str, int],
    decommissioned: Collection[str],
    settings: ClusterSettings,
    max_moves: int = DEFAULT_MAX_MOVES,
) -> dict[int, VbucketState]:
    """Moves to start or re-plan now: the new state (with its ``target``)
    of each vbucket whose placement must change, at most ``max_moves``
    moving in all. Nothing while the map is incomplete (the first
    placement comes first) or while too few nodes would remain to keep
    ``replication_factor`` copies (a removal then waits for a new node)."""
    vbuckets = settings.vbuckets
    if len(states) < vbuckets:
        return {}
    nodes = usable_nodes(states, live, decommissioned)
    if len(nodes) < settings.replication_factor:
        return {}
    # Moves in flight count at their target, unless it names a node that
    # may no longer be used: that move is planned again.
    replanned = {v for v, s in states.items() if s.target and not set(s.target) <= nodes}
    current = [
        states[v].target if states[v].target and v not in replanned else states[v].replicas
        for v in range(vbuckets)
    ]
    goal = place(current, nodes, vbuckets, settings.replication_factor)
    moving = sum(1 for s in states.values() if s.target)
    started: dict[int, VbucketState] = {}
    for vbucket in range(vbuckets):
        state = states[vbucket]
        if state.target and vbucket not in replanned:
            continue
        wanted = goal[vbucket]
        if vbucket in replanned:
            started[vbucket] = attrs.evolve(state, target=wanted)
            continue
        if wanted == state.replicas or moving >= max_moves:
            continue
        if state.leader is None or any(node not in live for node in wanted):
            continue  # offline, or a target node is down: wait for it
        started[vbucket] = attrs.evolve(state, target=wanted)
        moving += 1
    return started


def changes(
    states: Mapping[int, VbucketState],
    live: Mapping[str, int],
    decommissioned: Collection[str],
    settings: ClusterSettings,
    max_moves: int = DEFAULT_MAX_MOVES,
) -> dict[int, VbucketState]:
    """Everything the controller writes for a placed map, one new state per
    vbucket: membership first (broky.cluster.state.after_membership: dead
    nodes leave the ISR, failovers), else the next step of its move; then
    the moves to start, whose first step (adding the new replicas) goes in
    the same write."""
    written: dict[int, VbucketState] = {}
    for vbucket, state in states.items():
        changed = after_membership(state, live) or next_step(state, live)
        if changed is not None:
            written[vbucket] = changed
    unchanged = {v: s for v, s in states.items() if v not in written}
    starts = plan_moves(unchanged, live, decommissioned, settings, max_moves)
    for vbucket, started in starts.items():
        written[vbucket] = next_step(started, live) or started
    return written
