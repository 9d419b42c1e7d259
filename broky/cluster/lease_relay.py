"""A node's lease, relayed from the process that holds it to the node's workers.

With several worker processes, the node's membership (its lease, its life,
its turn as controller) lives in the supervisor, but the partitions and so
their leadership live in the workers (broky.durable.ownership). A worker
leading a partition must stop acking once the node's lease may have expired
(broky.replication.gate), and must know the node's life (node epoch) to
hold a leadership term. The supervisor therefore sends each worker, every
``RELAY_INTERVAL``, one line on the pipe it already keeps open to it
(broky.mesh.pipe.SupervisorPipe): the node epoch and the lease's
``valid_until``.

``valid_until`` crosses processes as ``time.monotonic()`` (CLOCK_MONOTONIC,
one clock for every process of the machine), not as trio time, whose origin
is private to each process. A late or lost line only makes a worker stop
acking earlier, never later: it keeps the last deadline it was told, which
is itself a lower bound of the lease's expiry in etcd. A paused or dead
supervisor therefore stops its workers' acks within a TTL, as it should:
its lease is not being renewed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import trio

from broky.cluster.node import ClusterNode

#: Seconds between two relayed lines: a tenth of the default 1 s TTL, so a
#: worker learns of each renewal (every TTL/3) well before its old deadline.
RELAY_INTERVAL: Final = 0.1
#: The key of a relayed line's JSON object (a reload line has "config").
LINE_KEY: Final = "lease"


@attrs.frozen
class LeaseState:
    #: The node's life; 0 between lives (no lease).
    node_epoch: int = 0
    #: ``time.monotonic()`` before which the lease is surely alive in etcd.
    valid_until: float = 0.0

    def line(self) -> bytes:
        payload = {LINE_KEY: {"epoch": self.node_epoch, "valid_until": self.valid_until}}
        return json.dumps(payload).encode() + b"\n"

    @classmethod
    def from_json(cls, fields: Any) -> LeaseState:
        """ValueError for anything else."""
        try:
            return cls(int(fields["epoch"]), float(fields["valid_until"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a lease line: {fields!r:.80}") from exc


def lease_state(node: ClusterNode) -> LeaseState:
    """``node``'s life and lease deadline now, on the shared clock."""
    epoch = node.node_epoch()
    if epoch == 0:
        return LeaseState()
    left = node.lease_deadline() - trio.current_time()
    return LeaseState(epoch, time.monotonic() + left)


async def relay(node: ClusterNode, send: Callable[[bytes], Awaitable[None]]) -> None:
    """Send ``node``'s lease state every RELAY_INTERVAL, until cancelled."""
    while True:
        await send(lease_state(node).line())
        await trio.sleep(RELAY_INTERVAL)


class RelayedLease:
    """A worker's copy of its node's lease (see the module docstring)."""

    def __init__(self) -> None:
        self.state = LeaseState()

    def update(self, state: LeaseState) -> None:
        self.state = state

    def node_epoch(self) -> int:
        return self.state.node_epoch

    def lease_valid(self) -> bool:
        state = self.state
        return state.node_epoch > 0 and time.monotonic() < state.valid_until
