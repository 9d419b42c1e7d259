"""The fair login queue (broky.security.admission) and a login flood over real sockets."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import broky
from broky import Config
from broky.protocol.codec import encode_frame
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Hello
from broky.protocol.framing import encode_preamble
from broky.security import admission
from broky.security.admission import (
    FREE_FAILURES,
    KEYS_PER_SOURCE,
    PENDING_PER_KEY,
    LoginQueue,
    LoginRefused,
)
from broky.security.auth import parse_users
from broky.security.passwords import hash_secret
from tests.conftest import StartBroker, address_of, raw_connection


class Gate:
    """Checks that run only when the test lets them, recording their order."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.release = trio.Semaphore(0)

    def check(self, name: str) -> bool:
        trio.from_thread.run(self.release.acquire)
        self.ran.append(name)
        return True


async def _attempt(queue: LoginQueue, gate: Gate, source: str, user: str) -> None:
    await queue.check(source, user, lambda: gate.check(f"{source}/{user}"))


async def test_threads_go_round_robin_over_sources_then_users() -> None:
    queue, gate = LoginQueue(threads=1), Gate()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_attempt, queue, gate, "flood", "u0")
            await trio.testing.wait_all_tasks_blocked()
            for index in range(1, 10):  # one source with many queued logins...
                nursery.start_soon(_attempt, queue, gate, "flood", f"u{index}")
                await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(_attempt, queue, gate, "flood", "u1")  # a second try of u1
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(_attempt, queue, gate, "real", "bob")  # ...then another source
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(12):
                gate.release.release()
    # The other source goes third (one turn of the queue), not twelfth;
    # within a source, users take turns.
    assert gate.ran[:3] == ["flood/u0", "flood/u1", "real/bob"]
    assert gate.ran[3:] == [f"flood/u{index}" for index in range(2, 10)] + ["flood/u1"]


async def test_over_budget_attempts_are_refused_without_a_check() -> None:
    queue, gate = LoginQueue(threads=1), Gate()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(PENDING_PER_KEY):
                nursery.start_soon(_attempt, queue, gate, "peer", "alice")
                await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(LoginRefused, match="in progress from peer"):
                await _attempt(queue, gate, "peer", "alice")
            for index in range(KEYS_PER_SOURCE - 1):
                nursery.start_soon(_attempt, queue, gate, "peer", f"user{index}")
                await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(LoginRefused, match="in progress from peer"):
                await _attempt(queue, gate, "peer", "one-too-many")
            # Another source is not affected.
            nursery.start_soon(_attempt, queue, gate, "elsewhere", "alice")
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(PENDING_PER_KEY + KEYS_PER_SOURCE):
                gate.release.release()
    assert len(gate.ran) == PENDING_PER_KEY + KEYS_PER_SOURCE
    assert queue.refused == 2


async def test_failures_cool_down_one_key_and_a_success_forgets_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue = LoginQueue()
    for _ in range(FREE_FAILURES):
        await queue.check("peer", "alice", lambda: False)
        queue.failed("peer", "alice")
    with pytest.raises(LoginRefused, match="retry in 1 s"):
        await queue.check("peer", "alice", lambda: False)
    # The same user from elsewhere, and another user from the same peer, go on.
    assert await queue.check("elsewhere", "alice", lambda: True)
    assert await queue.check("peer", "bob", lambda: True)
    await trio.sleep(1.0)
    await queue.check("peer", "alice", lambda: False)
    queue.failed("peer", "alice")
    with pytest.raises(LoginRefused, match="retry in 2 s"):
        await queue.check("peer", "alice", lambda: False)
    await trio.sleep(2.0)
    assert await queue.check("peer", "alice", lambda: True)
    queue.succeeded("peer", "alice")
    await queue.check("peer", "alice", lambda: False)
    queue.failed("peer", "alice")
    assert await queue.check("peer", "alice", lambda: True)  # one failure: no cool-down


async def test_a_cancelled_wait_gives_its_turn_away() -> None:
    queue, gate = LoginQueue(threads=1), Gate()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_attempt, queue, gate, "a", "first")
            await trio.testing.wait_all_tasks_blocked()
            with trio.CancelScope() as scope:
                nursery.start_soon(_attempt, queue, gate, "b", "second")
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
            async with trio.open_nursery() as waiting:
                waiting.start_soon(_attempt, queue, gate, "c", "gives-up")
                await trio.testing.wait_all_tasks_blocked()
                waiting.cancel_scope.cancel()
            nursery.start_soon(_attempt, queue, gate, "d", "third")
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(3):
                gate.release.release()
    assert gate.ran == ["a/first", "b/second", "d/third"]


def test_remembered_failures_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "TRACKED_KEYS", 10)
    queue = LoginQueue()

    async def fail_many() -> None:
        for index in range(100):
            queue.failed(f"peer{index}", "alice")

    trio.run(fail_many)
    assert len(queue._failures) == 10


@pytest.mark.slow
async def test_a_login_flood_does_not_lock_out_a_first_time_login(
    start_broker: StartBroker,
) -> None:
    # 200 connections retrying a wrong password at once, at the default
    # scrypt cost (~0.1 s a check, two at a time): queued first come first
    # served, they kept a real user's first login waiting past the 5 s
    # handshake timeout.
    password = "bob's real password"
    users = parse_users(
        [
            {"name": "alice", "password_hash": hash_secret("alice's password")},
            {"name": "bob", "password_hash": hash_secret(password)},
        ]
    )
    broker = await start_broker(Config(port=0, users=users))
    refusals: list[str] = []

    async def guess(stop: trio.Event) -> None:
        for attempt in range(5):
            if stop.is_set():
                return
            async with raw_connection(broker) as raw:
                hello = Hello(client_name="flood", user="alice", password=f"guess-{attempt}")
                await raw.send(encode_preamble() + encode_frame(hello))
                error = await raw.receive_error()
                assert error.code is ErrorCode.AUTHENTICATION_FAILED
                refusals.append(error.message)

    with trio.fail_after(60):
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(guess, stop)
            await trio.sleep(0.5)  # the flood is in full swing
            with trio.fail_after(broker.config.handshake_timeout):
                async with broky.connect(
                    address_of(broker), user="bob", password=password
                ) as client:
                    assert client.server is not None
                    assert client.server.principal == "bob"
            stop.set()
    assert any("too many" in message for message in refusals)
    assert broker.authenticator.logins.refused > 0
