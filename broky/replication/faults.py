"""Cutting a node's replication links on a signal: the fault tests' link partition.

Network namespaces would cut links for real (wave2 §1.1), but need root
and a namespace, veth pair and addresses per node and for etcd. This cuts
only Broky's replication links, both directions, while the node keeps its
etcd lease: a follower cut off from its leader, or a leader cut off from
its followers (Kafka's "the ISR shrinks to the leader" case), each still
seeing etcd. It is off unless the environment has BROKY_FAULT_SIGNALS=1
(the test harness sets it); then SIGUSR1 cuts and SIGUSR2 heals.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import trio

log = logging.getLogger("broky.replication")

#: The environment switch that lets SIGUSR1/SIGUSR2 cut and heal links.
ENVIRONMENT = "BROKY_FAULT_SIGNALS"


class LinkSwitch:
    """Whether this node's replication links are cut, and the live ones."""

    def __init__(self) -> None:
        self.cut = False
        self._links: set[trio.CancelScope] = set()
        self._healed = trio.Event()

    @contextmanager
    def link(self) -> Iterator[None]:
        """Run one live link's work; cutting cancels it (it must then close)."""
        with trio.CancelScope() as scope:
            if self.cut:
                scope.cancel()
            self._links.add(scope)
            try:
                yield
            finally:
                self._links.discard(scope)

    async def wait_healed(self) -> None:
        while self.cut:
            await self._healed.wait()

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if cut:
            for scope in self._links:
                scope.cancel()
        else:
            self._healed.set()
            self._healed = trio.Event()

    @staticmethod
    def enabled() -> bool:
        return os.environ.get(ENVIRONMENT) == "1"

    async def follow_signals(self) -> None:
        """SIGUSR1 cuts, SIGUSR2 heals (only when ``enabled``)."""
        with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2) as signals:
            async for signum in signals:
                self.set_cut(signum == signal.SIGUSR1)
                log.warning("replication links %s (fault signal)", "cut" if self.cut else "healed")
