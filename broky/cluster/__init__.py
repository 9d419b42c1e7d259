"""A replicated cluster whose metadata lives in etcd.

Membership, placement, partition leaders, epochs and in-sync replica sets
are keys in etcd, changed only by compare-and-swap transactions; etcd is the
consensus, Broky writes none of its own. Leases say who *should* lead
(liveness); the leader epoch, checked by whoever receives a leader's
writes, says who *can* (safety) — etcd's Jepsen analysis found that leases
alone cannot give mutual exclusion.
"""
