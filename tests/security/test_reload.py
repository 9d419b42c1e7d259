"""Reloading users and permissions into a running broker (Broker.reload and
SIGHUP): new logins and live connections follow the new tables at once.

Hashes use scrypt cost 2**10 (a few ms) so that the tests stay fast.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trustme

import broky
from broky import (
    AuthenticationError,
    Broker,
    BrokyError,
    Config,
    ConfigError,
    ErrorCode,
    PublishRefused,
    SubscriptionError,
)
from broky.reload import needs_restart, reread
from broky.security.auth import TRUSTED, Authenticator, Principal, parse_users
from broky.security.passwords import hash_secret, hash_token
from broky.security.tls import client_context
from tests.conftest import StartBroker, address_of, eventually
from tests.mesh.test_nodes import nodes, take
from tests.security.helpers import connect_fails, write_cert

HASHES = {secret: hash_secret(secret, log_n=10) for secret in ("a-pw", "b-pw", "a-new-pw")}


def user(name: str, password: str, **permissions: object) -> dict[str, object]:
    return {"name": name, "password_hash": HASHES[password], **permissions}


def config(*tables: Mapping[str, object], **settings: object) -> Config:
    values: dict[str, object] = {"port": 0, **settings, "users": parse_users(list(tables))}
    return Config(**values)  # type: ignore[arg-type]


@asynccontextmanager
async def logged_in(
    address: str, name: str, password: str
) -> AsyncIterator[tuple[broky.Client, broky.Subscription]]:
    """A client of ``name``, subscribed to ``x.>``."""
    async with (
        broky.connect(address, user=name, password=password) as client,
        client.subscription("x.>") as inbox,
    ):
        yield client, inbox


@asynccontextmanager
async def both_logged_in(
    address: str,
) -> AsyncIterator[tuple[broky.Client, broky.Subscription, broky.Client, broky.Subscription]]:
    """alice and bob, each with its client and its ``x.>`` subscription."""
    async with (
        logged_in(address, "alice", "a-pw") as (alice, alice_inbox),
        logged_in(address, "bob", "b-pw") as (bob, bob_inbox),
    ):
        yield alice, alice_inbox, bob, bob_inbox


@pytest.fixture
async def alice_and_bob(start_broker: StartBroker) -> Broker:
    """A broker with users alice and bob, full permissions."""
    return await start_broker(config(user("alice", "a-pw"), user("bob", "b-pw")))


async def test_a_new_user_logs_in_after_a_reload(start_broker: StartBroker) -> None:
    broker = await start_broker(config(user("alice", "a-pw")))
    address = address_of(broker)
    with trio.fail_after(10):
        with pytest.raises(AuthenticationError):
            async with broky.connect(address, user="bob", password="b-pw"):
                pass  # pragma: no cover
        broker.reload(config(user("alice", "a-pw"), user("bob", "b-pw")))
        async with (
            broky.connect(address, user="bob", password="b-pw") as bob,
            broky.connect(address, user="alice", password="a-pw") as alice,
            alice.subscription("x.>") as inbox,
        ):
            await bob.publish("x.hello", b"from bob")
            await bob.flush()
            assert await take(inbox, 1) == [b"from bob"]


async def test_a_removed_user_is_disconnected_and_others_carry_on(alice_and_bob: Broker) -> None:
    broker = alice_and_bob
    address = address_of(broker)
    with trio.fail_after(10):
        async with both_logged_in(address) as (alice, inbox, _, bob_inbox):
            broker.reload(config(user("alice", "a-pw")))
            with pytest.raises(
                AuthenticationError,
                match="closed the connection: the credentials of 'bob' were revoked by a "
                "configuration reload",
            ):
                await take(bob_inbox, 1)
            await eventually(lambda: broker.statistics().connections_current == 1)
            assert broker.statistics().connections_closed["authentication_failed"] == 1
            await alice.publish("x.still", b"alice carries on")
            await alice.flush()
            assert await take(inbox, 1) == [b"alice carries on"]
        with pytest.raises(AuthenticationError):
            async with broky.connect(address, user="bob", password="b-pw"):
                pass  # pragma: no cover


async def test_a_rotated_password_closes_the_connections_that_used_the_old_one(
    alice_and_bob: Broker,
) -> None:
    broker = alice_and_bob
    address = address_of(broker)
    with trio.fail_after(10):
        async with both_logged_in(address) as (_, old_inbox, bob, _):
            # bob's table is unchanged (same hash): bob stays.
            broker.reload(config(user("alice", "a-new-pw"), user("bob", "b-pw")))
            with pytest.raises(BrokyError, match="'alice' were revoked"):
                await take(old_inbox, 1)
            await bob.flush()
            async with broky.connect(address, user="alice", password="a-new-pw"):
                pass
            with pytest.raises(AuthenticationError):
                async with broky.connect(address, user="alice", password="a-pw"):
                    pass  # pragma: no cover


async def test_narrowed_permissions_apply_to_live_connections(start_broker: StartBroker) -> None:
    wide = user("alice", "a-pw", publish=["orders.>", "audit.>"], subscribe=["orders.>"])
    broker = await start_broker(config(wide, user("bob", "b-pw")))
    address = address_of(broker)
    with trio.fail_after(10):
        async with (
            broky.connect(address, user="alice", password="a-pw") as alice,
            alice.subscription("orders.eu.*") as europe,
            alice.subscription("orders.>") as everything,
            broky.connect(address, user="bob", password="b-pw") as bob,
        ):
            narrow = user("alice", "a-pw", publish=["orders.>"], subscribe=["orders.eu.>"])
            broker.reload(config(narrow, user("bob", "b-pw")))
            # The subscription the new rules refuse ends; the others stay.
            with pytest.raises(SubscriptionError) as ended:
                await take(everything, 1)
            assert ended.value.code is ErrorCode.PERMISSION_DENIED
            assert "configuration reload" in str(ended.value)
            await alice.publish("audit.x", b"now denied")
            await alice.publish("orders.eu.1", b"allowed")
            with pytest.raises(PublishRefused):
                await alice.flush()
            await bob.publish("orders.eu.2", b"from bob")
            await bob.flush()
            assert await take(europe, 2) == [b"allowed", b"from bob"]
    assert broker.statistics().connections_closed.get("authentication_failed", 0) == 0


async def test_a_reload_is_advised_on_sys(alice_and_bob: Broker) -> None:
    broker = alice_and_bob
    address = address_of(broker)
    with trio.fail_after(10):
        async with (
            broker.connect() as watcher,
            watcher.subscription("$SYS.events.config.reloaded") as advisories,
            logged_in(address, "alice", "a-pw") as (_, alice_inbox),
            logged_in(address, "bob", "b-pw"),
        ):
            broker.reload(config(user("alice", "a-pw", subscribe=["y.>"])))
            advisory = json.loads((await anext(advisories)).payload)
            with pytest.raises(SubscriptionError):
                await take(alice_inbox, 1)
    assert advisory["kind"] == "config.reloaded"
    assert advisory["users"] == 1
    assert advisory["connections_revoked"] == 1  # bob
    assert advisory["subscriptions_ended"] == 1  # alice's x.>
    assert advisory["certificates"] == []


async def test_closing_anonymous_access_disconnects_anonymous_clients(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(config(user("alice", "a-pw"), allow_anonymous=True))
    address = address_of(broker)
    with trio.fail_after(10):
        async with (
            broky.connect(address) as guest,
            guest.subscription("x.>") as inbox,
            broker.connect() as embedded,  # in-process: trusted, untouched
            embedded.subscription("x.>") as embedded_inbox,
        ):
            broker.reload(config(user("alice", "a-pw"), allow_anonymous=False))
            with pytest.raises(BrokyError, match="'anonymous' were revoked"):
                await take(inbox, 1)
            await embedded.publish("x.y", b"embedded")
            await embedded.flush()
            assert await take(embedded_inbox, 1) == [b"embedded"]
        with pytest.raises(AuthenticationError):
            async with broky.connect(address):
                pass  # pragma: no cover


async def test_a_login_checked_during_a_reload_meets_the_new_users(alice_and_bob: Broker) -> None:
    """A slow check started under the old users ends under the new ones."""
    broker = alice_and_bob
    reloaded = trio.Event()
    check = broker.authenticator._check

    def slow_check(user: str, password: str, token: str) -> object:
        trio.from_thread.run(reloaded.wait)
        return check(user, password, token)

    broker.authenticator._check = slow_check  # type: ignore[method-assign,assignment]

    async def reload_midway() -> None:
        await eventually(lambda: broker.statistics().connections_current == 1)
        broker.reload(config(user("alice", "a-pw")))
        reloaded.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reload_midway)
            assert "wrong user, password or token" in await refusal(
                address_of(broker), user="bob", password="b-pw"
            )


async def refusal(address: str, user: str, password: str) -> str:
    """Why the broker refuses this login."""
    try:
        async with broky.connect(address, user=user, password=password):
            pass
    except AuthenticationError as exc:
        return str(exc)
    raise AssertionError(f"{user} was let in")


# --- reread: what a SIGHUP loads -------------------------------------------------------


def test_reread_applies_users_and_names_what_needs_a_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    running = config(user("alice", "a-pw"))
    loaded = config(user("bob", "b-pw"), allow_anonymous=True, max_connections=5, port=7000)
    with caplog.at_level(logging.INFO, logger="broky.reload"):
        applied = reread(lambda: loaded, running)
    assert applied is not None
    assert applied.users == loaded.users
    assert applied.allow_anonymous is True
    assert applied.max_connections == running.max_connections  # needs a restart
    assert needs_restart(running, loaded) == ["port", "max_connections"]
    assert "port, max_connections changed and take effect at the next restart" in caplog.text


def test_an_invalid_reload_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> Config:
        raise ConfigError("users[0].name is required")

    assert reread(broken, config(user("alice", "a-pw"))) is None
    assert "configuration reload failed, nothing changed: users[0].name" in caplog.text
    # Dropping every user of a non-loopback listener is refused by the exposure rule.
    exposed = config(user("alice", "a-pw"), host="0.0.0.0")
    assert reread(lambda: Config(port=0), exposed) is None
    assert "refusing to listen on host '0.0.0.0' without authentication" in caplog.text


def test_a_refused_reload_leaves_the_broker_as_it_was() -> None:
    exposed = Broker(config(user("alice", "a-pw"), host="0.0.0.0"))  # never started
    before = exposed.authenticator
    with pytest.raises(ConfigError, match="without authentication"):
        exposed.reload(Config(port=0))
    assert exposed.authenticator is before
    assert exposed.config.users


# --- SIGHUP to `broky serve` ------------------------------------------------------------


def write_users(path: Path, *tables: Mapping[str, object]) -> str:
    """A config file of ``[[users]]`` tables (strings and lists of strings)."""
    lines = []
    for table in tables:
        lines.append("[[users]]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
async def test_sighup_reloads_users_in_every_worker(tmp_path: Path, workers: int) -> None:
    path = tmp_path / "broky.toml"
    settings = write_users(path, user("alice", "a-pw"), user("bob", "b-pw"))
    with nodes() as start, trio.fail_after(40):
        node = start(["--workers", str(workers), "--config", settings])
        async with broky.connect(node.address, user="bob", password="b-pw") as bob:
            write_users(path, user("alice", "a-pw"))
            node.process.send_signal(signal.SIGHUP)
            with pytest.raises(BrokyError, match="revoked by a configuration reload"):
                await flush_until_closed(bob)
        await refused_in_a_row(node.address, "bob", "b-pw", 8 * workers)
        for _ in range(4 * workers):
            async with broky.connect(node.address, user="alice", password="a-pw"):
                pass
        # A broken file is refused and changes nothing.
        path.write_text("[[users]]\nname = 3\n")
        node.process.send_signal(signal.SIGHUP)
        await trio.sleep(0.2)
        async with broky.connect(node.address, user="alice", password="a-pw"):
            pass
        # SIGHUP to the whole process group (pkill -HUP) leaves the workers be.
        pids = node.workers()
        assert len(pids) == (workers if workers > 1 else 0)  # one worker: no supervisor
        os.killpg(node.process.pid, signal.SIGHUP)
        await trio.sleep(0.3)
        assert node.workers() == pids
        assert node.process.poll() is None
        for _ in range(4 * workers):
            async with broky.connect(node.address, user="alice", password="a-pw"):
                pass


async def refused_in_a_row(address: str, name: str, password: str, count: int) -> None:
    """Log in until ``count`` attempts in a row are refused. Each worker
    applies a reload as it reads it from its pipe, moments apart; a worker
    that never does keeps breaking the run until the caller's deadline."""
    in_a_row = 0
    while in_a_row < count:
        try:
            async with broky.connect(address, user=name, password=password):
                in_a_row = 0
        except AuthenticationError:
            in_a_row += 1


async def flush_until_closed(client: broky.Client) -> None:
    """Flush until the broker closes the connection (a reload reaching it)."""
    while True:
        await client.flush()
        await trio.sleep(0.02)


@pytest.mark.slow
def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    with nodes() as start:
        node = start(["--workers", "2"])
        workers = node.workers()
        assert len(workers) == 2
        os.kill(node.process.pid, signal.SIGKILL)  # the supervisor alone
        node.process.wait(5)
        deadline = time.monotonic() + 15
        alive = workers
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in workers if _running(pid)]
        assert not alive, f"orphaned workers still serve: {alive}"


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, reaped by init later, is not)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def test_revalidate_follows_each_kind_of_credential() -> None:
    """Unit check of Authenticator.revalidate: permissions follow the new
    table; a changed password, token or certificate identity revokes."""
    token = hash_token("generated-token-" + "x" * 40)
    before = Authenticator(
        parse_users(
            [
                {"name": "svc", "certificate": "svc.example", "publish": ["a.>"]},
                {"name": "bot", "token_hash": token},
                user("alice", "a-pw"),
            ]
        )
    )
    after = Authenticator(
        parse_users(
            [
                {"name": "svc", "certificate": "svc.example", "publish": ["b.>"]},
                {"name": "bot", "token_hash": hash_token("another-token-" + "y" * 40)},
                user("alice", "a-pw", subscribe=["x.>"]),
            ]
        )
    )
    svc = after.revalidate(Principal("svc", None), before)
    assert svc is not None
    assert svc.permissions is not None
    assert svc.permissions.publish == (b"b.>",)
    assert after.revalidate(Principal("bot", None), before) is None
    alice = after.revalidate(Principal("alice", None), before)
    assert alice is not None
    assert alice.permissions is not None
    assert alice.permissions.subscribe == (b"x.>",)
    moved = Authenticator(parse_users([{"name": "svc", "certificate": "svc2.example"}]))
    assert moved.revalidate(Principal("svc", None), before) is None
    assert moved.revalidate(Principal("ghost", None), before) is None
    assert Authenticator(()).revalidate(Principal("svc", None), before) == TRUSTED


# --- renewed certificates --------------------------------------------------------------


async def test_a_reload_serves_a_renewed_certificate(
    start_broker: StartBroker, tmp_path: Path
) -> None:
    """The certificate files are replaced in place (as a renewal does) and
    loaded again: new handshakes get the new certificate, and a connection
    made before keeps working."""
    old_ca, new_ca = trustme.CA(), trustme.CA()
    files = write_cert(old_ca, tmp_path, "server", "127.0.0.1")
    tls = Config(port=0, tls_cert=files.cert, tls_key=files.key)
    broker = await start_broker(tls)
    address = address_of(broker)
    trusts_old = client_context(ca=files.ca)
    renewed = write_cert(new_ca, tmp_path, "renewed", "127.0.0.1")
    trusts_new = client_context(ca=renewed.ca)
    with trio.fail_after(10):
        async with broky.connect(address, ssl_context=trusts_old) as before:
            assert "CERTIFICATE_VERIFY_FAILED" in await connect_fails(address, trusts_new)
            shutil.copyfile(renewed.cert, files.cert)
            shutil.copyfile(renewed.key, files.key)
            applied = reread(lambda: tls, broker.config)
            assert applied is not None
            broker.reload(applied)
            async with broky.connect(address, ssl_context=trusts_new):
                pass
            assert "CERTIFICATE_VERIFY_FAILED" in await connect_fails(address, trusts_old)
            await before.flush()  # made with the old certificate, still up


def test_unloadable_certificates_refuse_the_reload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = write_cert(trustme.CA(), tmp_path, "server", "127.0.0.1")
    running = Config(port=0, tls_cert=files.cert, tls_key=files.key)
    Path(files.key).write_text("not a key")
    assert reread(lambda: running, running) is None
    assert "cannot load tls_cert/tls_key" in caplog.text


def test_turning_tls_on_or_off_needs_a_restart(tmp_path: Path) -> None:
    files = write_cert(trustme.CA(), tmp_path, "server", "127.0.0.1")
    plain = Config(port=0)
    tls = Config(port=0, tls_cert=files.cert, tls_key=files.key)
    assert needs_restart(plain, tls) == ["tls_cert", "tls_key"]
    assert needs_restart(tls, plain) == ["tls_cert", "tls_key"]
    moved = Config(port=0, tls_cert=files.cert + ".new", tls_key=files.key)
    assert needs_restart(tls, moved) == []  # new paths, loaded at the reload
