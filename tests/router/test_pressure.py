"""The pressure of draining subscribers on readers, sans-IO (broky.router.pressure)."""

from __future__ import annotations

from broky.protocol.constants import SlowConsumerPolicy
from broky.protocol.frames import Run
from broky.protocol.message import encode_message, pack_sizes
from broky.router.limits import RouterLimits
from broky.router.pressure import (
    LOCAL_LINK_STALL_SECONDS,
    MAX_WRITE_STALL_SECONDS,
    RECHECK_SECONDS,
    WRITE_STALL_SECONDS,
)
from broky.router.router import Router
from tests.router.test_router import Peer

OUTBOX_BYTES = 64 * 1024


def _slow(peer: Peer) -> bool:
    """A call, not an attribute read, so mypy does not narrow it across calls."""
    return peer.outlet.slow


def _router() -> Router:
    return Router(RouterLimits(outbox_bytes=OUTBOX_BYTES, write_batch_bytes=8 * 1024))


def _publish(router: Router, key: bytes, payload_bytes: int) -> None:
    message = encode_message(bytes(payload_bytes))
    run = Run(key, 0, 1, pack_sizes([len(message)]), message)
    router.publish(router.encode([run], False))


def _subscribe(router: Router, pattern: bytes = b"p.>", credit: int = 0) -> Peer:
    peer = Peer(router)
    router.subscribe(peer.outlet, 1, pattern, SlowConsumerPolicy.DROP, credit)
    peer.take()  # the Subscribed confirmation
    return peer


def test_an_outbox_past_half_full_presses_and_a_quarter_full_releases() -> None:
    router = _router()
    peer = _subscribe(router)
    pressure = router.pressure
    while not pressure.outlets:
        _publish(router, b"p.x", 1000)
    assert peer.outlet.pressed
    assert peer.subscription(1).pending_bytes > OUTBOX_BYTES // 2
    # A draining subscriber (its writer is between writes) holds readers.
    assert pressure.wait_seconds(now=0.0) == RECHECK_SECONDS
    woken: list[str] = []
    pressure.on_relief(lambda: woken.append("reader"))
    while pressure.outlets:
        assert peer.take()
    assert peer.subscription(1).pending_bytes <= OUTBOX_BYTES // 4
    assert woken == ["reader"]
    assert pressure.wait_seconds(now=0.0) is None
    assert router.counters.dropped_slow_consumer == 0


def test_a_write_blocked_past_the_stall_marks_the_subscriber_slow() -> None:
    router = _router()
    peer = _subscribe(router)
    while not router.pressure.outlets:
        _publish(router, b"p.x", 1000)
    peer.outlet.write_started = 10.0
    assert router.pressure.wait_seconds(now=10.0) == RECHECK_SECONDS
    assert not _slow(peer)
    assert router.pressure.wait_seconds(now=10.01 + WRITE_STALL_SECONDS) is None
    assert _slow(peer)
    # Slow: its outbox overflows and drops for it alone, nobody waits.
    for _ in range(200):
        _publish(router, b"p.x", 1000)
    assert router.counters.dropped_slow_consumer > 0
    assert router.pressure.wait_seconds(now=20.0) is None
    # The blocked write completes at last; a slow write leaves it slow...
    peer.outlet.wrote(WRITE_STALL_SECONDS * 3)
    assert _slow(peer)
    # ...a quick one shows its socket drains again: readers wait for it.
    peer.outlet.wrote(WRITE_STALL_SECONDS / 10)
    assert not _slow(peer)
    assert router.pressure.wait_seconds(now=30.0) == RECHECK_SECONDS


def test_a_subscriber_out_of_credit_holds_no_reader() -> None:
    router = _router()
    peer = _subscribe(router, credit=5)
    for _ in range(40):
        _publish(router, b"p.x", 1000)
    peer.take()  # its 5 messages of credit; the rest waits for a Flow
    assert peer.outlet.pressed
    assert not peer.outlet.deliverable
    assert router.pressure.wait_seconds(now=0.0) is None
    router.grant(peer.outlet, 1, 100)
    assert router.pressure.wait_seconds(now=0.0) == RECHECK_SECONDS


def test_a_closed_connection_leaves_the_pressure() -> None:
    router = _router()
    peer = _subscribe(router)
    while not router.pressure.outlets:
        _publish(router, b"p.x", 1000)
    router.detach(peer.outlet)
    assert not router.pressure.outlets
    assert router.pressure.wait_seconds(now=0.0) is None


def test_a_blocked_write_whose_socket_has_room_waits_for_the_loop_not_the_peer() -> None:
    # Readers busy with big batches can keep a writer from the loop for
    # longer than the stall: its socket still has room, the peer reads.
    router = _router()
    peer = _subscribe(router)
    while not router.pressure.outlets:
        _publish(router, b"p.x", 1000)
    peer.outlet.writable = lambda: True
    peer.outlet.write_started = 10.0
    assert router.pressure.wait_seconds(now=10.0 + 2 * WRITE_STALL_SECONDS) is not None
    assert not _slow(peer)
    assert router.pressure.wait_seconds(now=10.01 + MAX_WRITE_STALL_SECONDS) is None
    assert _slow(peer)  # however much room: a write that long is a slow peer


def test_a_link_to_another_worker_is_slow_only_after_the_local_stall() -> None:
    """Such a link is part of the broker: while it falls behind, readers
    pause (publishers slow down) instead of its runs being dropped, until
    LOCAL_LINK_STALL_SECONDS say the other worker stopped."""
    router = _router()
    peer = _subscribe(router)
    outlet = peer.outlet
    outlet.local_link = True
    outlet.write_stall_seconds = outlet.max_write_stall_seconds = LOCAL_LINK_STALL_SECONDS
    _publish(router, b"p.k", router.limits.outbox_bytes // 2 + 1)
    outlet.write_started = 10.0
    outlet.writable = lambda: False  # its socket is full
    pressure = router.pressure
    assert pressure.wait_seconds(10.0 + 1.0) is not None  # a client would be slow by now
    assert not outlet.slow
    # A link reader never waits for a link back to a worker (no cycle).
    assert pressure.wait_seconds(10.0 + 1.0, local_links=False) is None
    assert pressure.wait_seconds(10.0 + LOCAL_LINK_STALL_SECONDS) is None
    assert outlet.slow
