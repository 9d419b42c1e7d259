"""Queue groups: subscriptions that share a pattern's messages, one member each.

A subscription that names a queue (``Subscribe.queue``) joins the group of
that name on its pattern, as in NATS: every message matching the pattern
goes to *one* member of the group, while plain subscriptions on the pattern
still get all of them. Delivery stays at most once, live, and stateless: a
member that leaves takes what was queued for it along; nothing is
redelivered (work that must not be lost is a durable ``shared``
subscription, ``Consume``).

How a group spans routers. A peer router that has members announces the
group over its link as an *interest key* (``interest_key``: the pattern and
the queue name, which no pattern can spell since patterns hold no space).
The link subscribes on its own stream for it, so on the publishing router
the link is one more member of the group; when a run is given to that
member it crosses on the group's stream, and the peer hands it to one of its
own members (``Router.publish_to_group``), never to its plain subscribers
and never back over a link of the same tier. Runs that cross for plain
interest skip the peer's group members: the publishing router has already
chosen for the group. So a message reaches exactly one member however the
members are spread over workers and nodes; a peer with many members counts
as one member on the routers that publish (NATS weighs them, we do not).

Choice: round-robin over the members with room (under half their outbox,
with credit), a whole ``push_many`` batch at a time: consecutive runs of one
read go to one member, so a group of one-message runs spreads per message
and a long run (up to 64 KiB, coalesced) goes to one member whole. When no
member has room the next in turn takes it and its own slow-consumer policy
applies, exactly as for a plain subscriber.
"""

from __future__ import annotations

from typing import Final

import attrs

from broky.protocol.codec import split_run_chunk
from broky.protocol.constants import ErrorCode, LinkKind
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import EncodedRun
from broky.protocol.keys import key_bytes_problem
from broky.router.outbox import Subscription

#: Longest queue name, in UTF-8 bytes.
MAX_QUEUE_BYTES: Final = 255
#: Separates pattern and queue name in an interest key: patterns hold no space.
_SEPARATOR: Final = b" "


def validate_queue(queue: bytes) -> None:
    """Raise RemoteProtocolError (InvalidPattern) unless ``queue`` is a
    usable group name: one key token (no ``.``, ``*``, ``>``), key text."""
    problem = key_bytes_problem(queue)
    if problem is None and len(queue) > MAX_QUEUE_BYTES:
        problem = f"is longer than {MAX_QUEUE_BYTES} bytes"
    if problem is None and any(c in queue for c in b".*>"):
        problem = "holds '.', '*' or '>' (a queue name is one token)"
    if problem is not None:
        raise RemoteProtocolError(f"queue name {queue!r} {problem}", ErrorCode.INVALID_PATTERN)


def interest_key(pattern: bytes, queue: bytes) -> bytes:
    """What a router announces to its peers for a subscription: the pattern,
    or for a queue group member the pattern and the group's name."""
    return pattern + _SEPARATOR + queue if queue else pattern


def split_interest(key: bytes) -> tuple[bytes, bytes]:
    """``(pattern, queue)`` of an interest key (queue b"" for plain interest)."""
    pattern, _, queue = key.partition(_SEPARATOR)
    return pattern, queue


def has_room(member: Subscription) -> bool:
    """Whether a member can take more now without nearing its bounds."""
    return member.pending_bytes < member.high_water_bytes and (
        member.credit is None or member.credit > member.pending_messages
    )


@attrs.define(eq=False)
class QueueGroup:
    """The members of one group on one pattern, as seen from one kind of
    source (see ``Groups``): an object a route holds like a subscription,
    whose ``push_many`` deals the batch out over the members."""

    members: list[Subscription] = attrs.field(factory=list)
    _turn: int = 0

    def push_many(self, runs: list[EncodedRun], messages: int, size: int) -> None:
        """Deal ``runs`` out in turn: a batch of one message (the common
        case for work items) goes whole to the next member with room; a
        bigger one is cut into consecutive, even slices, one per member with
        room, so a burst does not land on one member. A route holds a group
        only while it has members (a member leaving clears the route
        caches), so there is always one."""
        ready = self.ready()
        assert ready, "a cached route holds an empty queue group"
        if messages <= 1 or len(ready) == 1:
            self._served(ready[0])
            ready[0].push_many(runs, messages, size)
            return
        takers = ready[:messages]
        self._served(takers[-1])
        base, extra = divmod(messages, len(takers))
        slices = iter(takers)
        taker = next(slices)
        quota = base + (extra > 0)
        dealt = 0
        batch: list[EncodedRun] = []
        batch_messages = batch_bytes = 0
        for whole in runs:
            rest = whole
            while rest.count:
                if rest.count <= quota - batch_messages:
                    piece, rest = rest, _EMPTY
                else:
                    head, tail = split_run_chunk(rest.chunk, quota - batch_messages)
                    piece = EncodedRun(rest.key, quota - batch_messages, head)
                    rest = EncodedRun(rest.key, rest.count - piece.count, tail)
                batch.append(piece)
                batch_messages += piece.count
                batch_bytes += len(piece.chunk)
                if batch_messages == quota:
                    taker.push_many(batch, batch_messages, batch_bytes)
                    dealt += 1
                    batch, batch_messages, batch_bytes = [], 0, 0
                    taker = next(slices, taker)
                    quota = base + (extra > dealt)

    def ready(self) -> list[Subscription]:
        """The members to deal to, in turn from the next one: those with
        room, or when none has, the next one alone (its slow-consumer
        policy then applies)."""
        members = self.members
        count = len(members)
        if not count:
            return []
        turn = self._turn % count
        in_turn = members[turn:] + members[:turn]
        return [member for member in in_turn if has_room(member)] or in_turn[:1]

    def _served(self, last: Subscription) -> None:
        """The next batch starts after ``last``, the last member dealt to."""
        self._turn = self.members.index(last) + 1


#: A run of no messages: what is left of a run once dealt out.
_EMPTY: Final = EncodedRun(b"", 0, b"")

#: What a cached route holds: subscriptions, and groups standing for their members.
Receiver = Subscription | QueueGroup

#: Who may receive a run from each kind of source: the one-hop rule of
#: ``broky.router.interest``, applied to group members.
_MEMBER_KINDS: Final = {
    LinkKind.CLIENT: frozenset((LinkKind.CLIENT, LinkKind.LOCAL, LinkKind.CLUSTER)),
    LinkKind.CLUSTER: frozenset((LinkKind.CLIENT, LinkKind.LOCAL)),
    LinkKind.LOCAL: frozenset((LinkKind.CLIENT,)),
    LinkKind.DURABLE: frozenset((LinkKind.CLIENT,)),
}


class Groups:
    """Every queue group of one router, by (pattern, queue) and source kind.

    One ``QueueGroup`` per source kind, each listing the members a run from
    that source may reach, so routes cached per source hold a stable object
    (the router interns route tuples by identity).
    """

    def __init__(self) -> None:
        self._groups: dict[tuple[bytes, bytes], dict[LinkKind, QueueGroup]] = {}

    def join(self, member: Subscription) -> None:
        """Add a subscription that names a queue to its group."""
        views = self._groups.setdefault(
            (member.pattern, member.queue), {kind: QueueGroup() for kind in _MEMBER_KINDS}
        )
        for source, view in views.items():
            if member.outlet.kind in _MEMBER_KINDS[source]:
                view.members.append(member)

    def leave(self, member: Subscription) -> None:
        """Remove a member; a group without members is forgotten."""
        name = (member.pattern, member.queue)
        views = self._groups.get(name)
        if views is None:
            return
        for view in views.values():
            if member in view.members:
                view.members.remove(member)
        if not any(view.members for view in views.values()):
            del self._groups[name]

    def view(self, pattern: bytes, queue: bytes, source: LinkKind) -> QueueGroup | None:
        """The group as a run from ``source`` sees it (None: no such group)."""
        views = self._groups.get((pattern, queue))
        return None if views is None else views[source]

    def __len__(self) -> int:
        return len(self._groups)
