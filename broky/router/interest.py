"""Interest propagation between routers: which patterns to announce to peers.

A router tells each peer which patterns its subscribers hold, so a run
crosses a link only when the other side wants it. What a router announces
depends on the link's kind, which is what keeps forwarding to one hop per
tier (no loops, no duplicates):

============ ================================= ====================================
link kind    patterns announced                 runs received on it go to
============ ================================= ====================================
``LOCAL``    its clients' patterns              its clients only
``CLUSTER``  its clients' and its local         its clients and its local links
             peers' patterns (node interest)    (never to another cluster link)
============ ================================= ====================================

A ``LinkListener`` is the router's handle on one outgoing link (the link
task subscribes on the peer with these patterns). When a client's new
pattern is announced to local links, the client's ``Subscribed`` waits until
every connected local link has confirmed it, so that once ``subscribe``
returns, messages published on any worker of the node reach it.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

import attrs

from broky.protocol.constants import LinkKind


class LinkListener(Protocol):
    """The router's view of one outgoing link."""

    @property
    def kind(self) -> LinkKind:
        """LOCAL or CLUSTER: which interest set the link follows."""

    def interest_added(self, pattern: bytes) -> bool:
        """Announce a pattern; True if a confirmation will follow (the link is up)."""

    def interest_removed(self, pattern: bytes) -> None:
        """Withdraw a pattern."""


#: Subscriptions of each kind count toward these interest sets.
_COUNTS_TOWARD = {
    LinkKind.CLIENT: (LinkKind.LOCAL, LinkKind.CLUSTER),
    LinkKind.LOCAL: (LinkKind.CLUSTER,),
    LinkKind.CLUSTER: (),
    # Another worker's durable requests: only this worker's own partitions.
    LinkKind.DURABLE: (),
}


@attrs.define(eq=False)
class PendingConfirmation:
    """Links yet to confirm a pattern, and the subscriptions waiting on them."""

    links: set[LinkListener]
    waiters: list[object] = attrs.field(factory=list)


class Interest:
    """Pattern reference counts per interest set, and pending confirmations."""

    def __init__(self) -> None:
        self._counts: dict[LinkKind, Counter[bytes]] = {
            LinkKind.LOCAL: Counter(),
            LinkKind.CLUSTER: Counter(),
        }
        self.listeners: list[LinkListener] = []
        self.pending: dict[bytes, PendingConfirmation] = {}

    def patterns(self, kind: LinkKind) -> list[bytes]:
        """The patterns a link of ``kind`` must subscribe to, sorted."""
        return sorted(self._counts[kind])

    def added(self, pattern: bytes, subscriber_kind: LinkKind) -> set[LinkListener]:
        """Count a new subscription; return the links that will confirm it."""
        confirming: set[LinkListener] = set()
        for kind in _COUNTS_TOWARD[subscriber_kind]:
            counts = self._counts[kind]
            counts[pattern] += 1
            if counts[pattern] == 1:
                for listener in self.listeners:
                    if listener.kind is kind and listener.interest_added(pattern):
                        confirming.add(listener)
        return confirming if subscriber_kind is LinkKind.CLIENT else set()

    def removed(self, pattern: bytes, subscriber_kind: LinkKind) -> None:
        """Uncount a subscription; withdraw patterns nobody holds any more."""
        for kind in _COUNTS_TOWARD[subscriber_kind]:
            counts = self._counts[kind]
            counts[pattern] -= 1
            if counts[pattern] <= 0:
                del counts[pattern]
                for listener in self.listeners:
                    if listener.kind is kind:
                        listener.interest_removed(pattern)
