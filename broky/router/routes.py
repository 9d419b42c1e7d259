"""Routes: which subscriptions a run on a key reaches, and the router's caches of them.

The router owns one RouteCache; nothing else reads or changes it. A route
depends on the subscription index, so the caches follow the index's
generation and are emptied whole when it moves (or a subscription is
dropped), never patched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from broky.protocol.constants import LinkKind
from broky.router.matcher import SubscriptionIndex
from broky.router.outbox import Outlet, Subscription
from broky.router.queues import Groups, QueueGroup, Receiver

#: Which subscriptions a run may reach, by where the run came from (one hop
#: per tier: see broky.router.interest).
_ELIGIBLE: Final = {
    LinkKind.CLIENT: frozenset(
        (LinkKind.CLIENT, LinkKind.LOCAL, LinkKind.CLUSTER, LinkKind.DURABLE)
    ),
    LinkKind.CLUSTER: frozenset((LinkKind.CLIENT, LinkKind.LOCAL)),
    LinkKind.LOCAL: frozenset((LinkKind.CLIENT,)),
    LinkKind.DURABLE: frozenset((LinkKind.CLIENT,)),
}
#: Keys cached per source kind. Every run of a key out of the cache costs a
#: trip through Python (match, intern, maybe a clear), ~3 us against ~0.15
#: in the compiled loop, so the cache holds the working set of real
#: many-key traffic (device and order ids): 131,072 keys, ~10-15 MB per
#: source kind at typical key lengths; it is cleared whole when full.
ROUTE_CACHE_SIZE: Final = 131_072
#: ... and at most this many key bytes, so that a flood of unique long keys
#: (up to 1 KiB each) cannot make the cache grow past ~10 MB either.
ROUTE_CACHE_KEY_BYTES: Final = 8 * 1024 * 1024


def find_route(
    index: SubscriptionIndex[Subscription],
    groups: Groups,
    durable_keys: Callable[[bytes], bool] | None,
    key: bytes,
    source: LinkKind,
) -> tuple[Receiver, ...]:
    """Subscriptions a run from ``source`` reaches: the eligible plain
    matches, with at most one subscription per link (a peer gets a run
    once for all its plain interest), then, for a run from a client,
    each matching queue group once (its member may be a link too, on
    the group's own stream: see broky.router.queues). ``durable_keys`` is
    ``Router.durable_keys``. Raises RemoteProtocolError for an invalid key."""
    eligible = _ELIGIBLE[source]
    route: list[Subscription] = []
    links: set[Outlet] = set()
    durable = durable_keys is not None and durable_keys(key)
    found_groups: list[QueueGroup] = []
    for subscription in index.match(key):
        outlet = subscription.outlet
        kind = outlet.kind
        if kind not in eligible:
            continue
        if subscription.queue:
            # A run from a peer crossed for plain interest: its router
            # chose for the groups already (publish_to_group brings the
            # runs it chose us for).
            if source is LinkKind.CLIENT:
                group = groups.view(subscription.pattern, subscription.queue, source)
                if group is not None and group not in found_groups:
                    found_groups.append(group)
            continue
        if durable_keys is not None and (
            (kind is LinkKind.LOCAL and durable) or (kind is LinkKind.DURABLE and not durable)
        ):
            continue
        if kind is LinkKind.DURABLE:
            route.append(subscription)  # one per forwarded client subscription
            continue
        if outlet.kind is not LinkKind.CLIENT:
            if outlet in links:
                continue
            links.add(outlet)
        route.append(subscription)
    return (*route, *found_groups)


class RouteCache:
    """The routes of recently seen keys, one cache per source kind, bounded
    in entries and key bytes (ROUTE_CACHE_SIZE, ROUTE_CACHE_KEY_BYTES)."""

    def __init__(self) -> None:
        #: Cached routes by source kind: what ``fan_out`` walks.
        self.by_source: dict[LinkKind, dict[bytes, tuple[Receiver, ...]]] = {
            kind: {} for kind in LinkKind
        }
        #: Key bytes held by each route cache (bounded with its entries).
        self._key_bytes = dict.fromkeys(LinkKind, 0)
        #: The subscription index generation the caches follow (-1: none yet).
        self.generation = -1
        #: One tuple object per distinct route: keys with the same
        #: subscribers share it, so ``publish`` tells by identity that
        #: consecutive runs go to the same place and queues them together.
        self._tuples: dict[tuple[Receiver, ...], tuple[Receiver, ...]] = {}

    def intern(self, route: tuple[Receiver, ...]) -> tuple[Receiver, ...]:
        """The one shared tuple equal to ``route``."""
        return self._tuples.setdefault(route, route)

    def remember(self, source: LinkKind, key: bytes, route: tuple[Receiver, ...]) -> None:
        """Cache a key's route, within the cache's bounds (entries and key bytes)."""
        routes = self.by_source[source]
        cached_bytes = self._key_bytes[source] + len(key)
        if len(routes) >= ROUTE_CACHE_SIZE or cached_bytes > ROUTE_CACHE_KEY_BYTES:
            routes.clear()
            cached_bytes = len(key)
        self._key_bytes[source] = cached_bytes
        routes[key] = route

    def clear(self, generation: int) -> None:
        """Empty the caches and note the index generation they follow."""
        for cached in self.by_source.values():
            cached.clear()
        self._key_bytes = dict.fromkeys(LinkKind, 0)
        self._tuples.clear()
        self.generation = generation
