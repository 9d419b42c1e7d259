"""Queue groups in one router, sans-IO: each message to one member."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.constants import ErrorCode, LinkKind
from broky.protocol.frames import Subscribed
from broky.router.limits import RouterLimits
from broky.router.queues import interest_key, split_interest
from broky.router.router import Router
from tests.router.test_router import Peer, assert_error, make_run, numbered, payloads


def member(router: Router, stream: int, pattern: bytes, queue: bytes, credit: int = 0) -> Peer:
    peer = Peer(router)
    assert router.subscribe(peer.outlet, stream, pattern, credit=credit, queue=queue) is not None
    assert peer.take() == [Subscribed(stream)]
    return peer


def publish_each(router: Router, key: bytes, count: int, first: int = 0) -> None:
    """``count`` single-message runs, each published on its own (one read each)."""
    for number in range(first, first + count):
        router.publish(router.encode([make_run(key, [b"%d" % number])], stamp_ts_broker=False))


def test_each_message_goes_to_one_member_round_robin_and_plain_subscribers_get_all() -> None:
    router = Router()
    members = [member(router, 1, b"jobs.>", b"workers") for _ in range(3)]
    plain = member(router, 7, b"jobs.>", b"")
    publish_each(router, b"jobs.resize", 30)
    got = [payloads(peer.take(), 1) for peer in members]
    assert [len(share) for share in got] == [10, 10, 10]
    assert sorted(int(p) for share in got for p in share) == list(range(30))
    assert payloads(plain.take(), 7) == [b"%d" % n for n in range(30)]
    assert router.statistics().delivered_messages == 60


def test_a_burst_is_cut_into_even_consecutive_slices_one_per_member() -> None:
    router = Router()
    members = [member(router, 1, b"jobs.>", b"w") for _ in range(3)]
    router.publish(router.encode([make_run(b"jobs.a", numbered(0, 10))], stamp_ts_broker=False))
    assert [payloads(peer.take(), 1) for peer in members] == [
        numbered(0, 4),
        numbered(4, 7),
        numbered(7, 10),
    ]
    # The next burst starts with the member after the last one dealt to.
    router.publish(router.encode([make_run(b"jobs.a", numbered(10, 12))], stamp_ts_broker=False))
    assert [payloads(peer.take(), 1) for peer in members] == [
        numbered(10, 11),
        numbered(11, 12),
        [],
    ]


def test_slices_span_the_runs_of_one_batch() -> None:
    router = Router()
    members = [member(router, 1, b"jobs.>", b"w") for _ in range(2)]
    publish_each(router, b"jobs.a", 2)  # route cached: later runs go in one batch
    assert [len(payloads(peer.take(), 1)) for peer in members] == [1, 1]
    runs = [make_run(b"jobs.a", numbered(n, n + 3)) for n in (0, 3, 6)]
    router.publish(router.encode(runs, stamp_ts_broker=False))
    assert [payloads(peer.take(), 1) for peer in members] == [numbered(0, 5), numbered(5, 9)]


def test_groups_are_named_per_pattern_and_each_gets_every_message_once() -> None:
    router = Router()
    a = [member(router, 1, b"jobs.>", b"a") for _ in range(2)]
    b = [member(router, 1, b"jobs.>", b"b") for _ in range(2)]
    # Same name, another pattern: another group.
    other = member(router, 1, b"jobs.*", b"a")
    publish_each(router, b"jobs.x", 10)
    for group in (a, b):
        shares = [payloads(peer.take(), 1) for peer in group]
        assert sorted(int(p) for share in shares for p in share) == list(range(10))
    assert len(payloads(other.take(), 1)) == 10


def test_a_member_out_of_credit_is_skipped_while_others_have_room() -> None:
    router = Router()
    stuck = member(router, 1, b"jobs.>", b"w", credit=2)
    free = member(router, 1, b"jobs.>", b"w")
    publish_each(router, b"jobs.x", 20)
    stuck_got = payloads(stuck.take(), 1)
    assert len(stuck_got) == 2  # its window, then it is passed over
    assert len(payloads(free.take(), 1)) == 18
    assert stuck.subscription(1).pending_messages == 0


def test_members_leaving_hand_the_rest_to_those_left_then_nobody() -> None:
    router = Router()
    first = member(router, 1, b"jobs.>", b"w")
    second = member(router, 1, b"jobs.>", b"w")
    router.unsubscribe(first.outlet, 1)
    publish_each(router, b"jobs.x", 5)
    assert len(payloads(second.take(), 1)) == 5
    router.detach(second.outlet)
    before = router.statistics().dropped_no_subscriber
    publish_each(router, b"jobs.x", 3)
    assert router.statistics().dropped_no_subscriber == before + 3


@pytest.mark.parametrize("queue", [b"a.b", b"*", b">", b"with space", b"\x00", b"q" * 256])
def test_bad_queue_names_are_stream_errors(queue: bytes) -> None:
    router = Router()
    peer = Peer(router)
    assert router.subscribe(peer.outlet, 3, b"jobs.>", queue=queue) is None
    (frame,) = peer.take()
    assert_error(frame, ErrorCode.INVALID_PATTERN, 3)


class Listener:
    """A fake outgoing link: records the interest keys announced to it."""

    def __init__(self, kind: LinkKind) -> None:
        self._kind = kind
        self.keys: list[bytes] = []

    @property
    def kind(self) -> LinkKind:
        return self._kind

    def interest_added(self, pattern: bytes) -> bool:
        self.keys.append(pattern)
        return False

    def interest_removed(self, pattern: bytes) -> None:
        self.keys.remove(pattern)


def test_a_group_is_announced_to_links_as_its_own_interest_key() -> None:
    router = Router()
    link = Listener(LinkKind.LOCAL)
    router.add_link(link)
    first = member(router, 1, b"jobs.>", b"w")
    member(router, 1, b"jobs.>", b"w")
    member(router, 2, b"jobs.>", b"")
    assert link.keys == [b"jobs.> w", b"jobs.>"]
    assert split_interest(interest_key(b"jobs.>", b"w")) == (b"jobs.>", b"w")
    assert split_interest(b"jobs.>") == (b"jobs.>", b"")
    router.detach(first.outlet)
    assert link.keys == [b"jobs.> w", b"jobs.>"]  # one member is left


def link_member(router: Router, stream: int, pattern: bytes, queue: bytes) -> Peer:
    """A peer router's link subscription on this router, for a group."""
    peer = Peer(router)
    peer.outlet.kind = LinkKind.LOCAL
    assert router.subscribe(peer.outlet, stream, pattern, queue=queue) is not None
    peer.take()
    return peer


def test_a_peer_router_is_one_member_and_its_runs_for_the_group_reach_one_local_member() -> None:
    router = Router()
    local = member(router, 1, b"jobs.>", b"w")
    peer_link = link_member(router, 9, b"jobs.>", b"w")
    publish_each(router, b"jobs.x", 10)
    assert len(payloads(local.take(), 1)) == 5
    assert len(payloads(peer_link.take(), 9)) == 5  # crossed on the group's stream
    # Runs from a link for plain interest skip group members: the sending
    # router chose for the group already.
    router.publish(
        router.encode([make_run(b"jobs.x", [b"plain"])], stamp_ts_broker=False),
        source=LinkKind.LOCAL,
    )
    assert payloads(local.take(), 1) == []
    # Runs a peer chose this router for go to one local member, never back
    # over a link of the tier they came from.
    runs = router.encode([make_run(b"jobs.x", [b"g1", b"g2"])], stamp_ts_broker=False)
    assert router.publish_to_group(runs, interest_key(b"jobs.>", b"w"), LinkKind.LOCAL) == 2
    assert payloads(local.take(), 1) == [b"g1", b"g2"]
    assert payloads(peer_link.take(), 9) == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("join"), st.sampled_from([b"a", b"b"]), st.integers(0, 3)),
            st.tuples(st.just("leave"), st.integers(0, 7), st.just(0)),
            st.tuples(st.just("publish"), st.integers(1, 5), st.just(0)),
            st.tuples(st.just("burst"), st.integers(1, 9), st.just(0)),
        ),
        max_size=40,
    )
)
def test_every_message_reaches_exactly_one_member_of_each_group(
    steps: list[tuple[str, object, int]],
) -> None:
    """Any interleaving of joins (with small credit windows), leaves and
    publishes: each message reaches one member of each group that had
    members, and a plain subscriber all of them."""
    router = Router(RouterLimits())
    plain = member(router, 99, b"jobs.>", b"")
    members: list[tuple[bytes, Peer]] = []
    received: Counter[tuple[bytes, bytes]] = Counter()
    expected: Counter[tuple[bytes, bytes]] = Counter()
    number = 0

    def collect(group: bytes, peer: Peer) -> None:
        for payload in payloads(peer.take(), 1):
            received[group, payload] += 1

    def drain(group: bytes, peer: Peer) -> None:
        if peer.outlet.subscriptions[1].credit is not None:
            router.grant(peer.outlet, 1, 1_000)
        collect(group, peer)

    for step, value, credit in steps:
        if step == "join":
            assert isinstance(value, bytes)
            members.append((value, member(router, 1, b"jobs.>", value, credit=credit)))
        elif step == "leave" and members:
            assert isinstance(value, int)
            group, peer = members.pop(value % len(members))
            # A member that leaves loses what was queued for it (at most
            # once): this one drains first, so the count stays exact.
            drain(group, peer)
            router.detach(peer.outlet)
        elif step in ("publish", "burst"):
            assert isinstance(value, int)
            groups = {group for group, _ in members}
            if step == "publish":
                publish_each(router, b"jobs.k", value, number)
            else:  # one run of ``value`` messages, dealt out in slices
                run = make_run(b"jobs.k", numbered(number, number + value))
                router.publish(router.encode([run], stamp_ts_broker=False))
            for n in range(number, number + value):
                for group in groups:
                    expected[group, b"%d" % n] += 1
            number += value
            for group, peer in members:
                collect(group, peer)
                # Give each windowed member its credit back, as a client would.
                subscription = peer.outlet.subscriptions[1]
                if subscription.credit is not None:
                    router.grant(peer.outlet, 1, 4)
                collect(group, peer)
    for group, peer in members:
        drain(group, peer)
    assert received == expected
    assert payloads(plain.take(), 99) == [b"%d" % n for n in range(number)]
