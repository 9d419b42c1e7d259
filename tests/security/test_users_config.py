"""``[[users]]`` tables, the exposure rule, and the Authenticator's decisions.

Every bad table is refused with a ConfigError naming ``users[i]`` and the key;
a broker never listens beyond loopback with nobody to authenticate unless the
operator says so; credentials are checked slowly once and then remembered,
failures never.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import pytest
import trio

from broky import Config, ConfigError
from broky.cli import build_parser, load_config
from broky.config import is_loopback
from broky.security.acl import Permissions
from broky.security.auth import (
    TRUSTED,
    AuthConfigError,
    AuthenticationFailed,
    Authenticator,
    Principal,
    User,
    parse_users,
)
from broky.security.passwords import hash_secret

PASSWORD: Final = "hunter2"
TOKEN: Final = "ops-token-3f9a"
PASSWORD_HASH: Final = hash_secret(PASSWORD, log_n=10)
TOKEN_HASH: Final = hash_secret(TOKEN, log_n=10)
FAILED: Final = "authentication failed: wrong user, password or token"

ALICE: Final = {
    "name": "alice",
    "password_hash": PASSWORD_HASH,
    "publish": ["orders.>"],
    "subscribe": ["orders.>", "payments.*.done"],
    "subscribe_deny": ["orders.internal.>"],
}
OPS: Final = {"name": "ops", "token_hash": TOKEN_HASH, "subscribe": [">", "$SYS.>"], "publish": []}
ANONYMOUS: Final = {"name": "anonymous", "publish": ["public.>"], "subscribe": ["public.>"]}

ALICE_PERMISSIONS: Final = Permissions(
    publish=(b"orders.>",),
    subscribe=(b"orders.>", b"payments.*.done"),
    subscribe_deny=(b"orders.internal.>",),
)
OPS_PERMISSIONS: Final = Permissions(publish=(), subscribe=(b">", b"$SYS.>"))
ANONYMOUS_PERMISSIONS: Final = Permissions(publish=(b"public.>",), subscribe=(b"public.>",))


def test_valid_users_parse_into_hashes_and_permissions() -> None:
    node = {"name": "node-b", "token_hash": TOKEN_HASH, "link": True}
    both = {"name": "both", "password_hash": PASSWORD_HASH, "token_hash": TOKEN_HASH}
    alice, ops, node_b, both_user, anonymous = parse_users([ALICE, OPS, node, both, ANONYMOUS])

    assert alice.name == "alice"
    assert alice.token is None
    assert alice.password is not None
    assert alice.password.matches(PASSWORD)
    assert alice.permissions == ALICE_PERMISSIONS

    assert ops.password is None
    assert ops.token is not None
    assert ops.token.matches(TOKEN)
    assert ops.permissions == OPS_PERMISSIONS

    # Lists left out take the defaults: everything but $SYS, no links.
    assert node_b.permissions == Permissions(link=True)
    assert both_user.permissions == Permissions()
    assert both_user.password is not None
    assert both_user.token is not None

    assert anonymous == User("anonymous", None, None, ANONYMOUS_PERMISSIONS)


def test_users_load_from_a_toml_file_with_the_other_settings(tmp_path: Path) -> None:
    path = tmp_path / "broky.toml"
    path.write_text(
        f"""
host = "0.0.0.0"
cluster_listen = "0.0.0.0:7800"
cluster_token = "{TOKEN}"
max_connections = 500
max_message_bytes = 65536
max_pending_bytes = 1048576

[[users]]
name = "alice"
password_hash = "{PASSWORD_HASH}"
publish = ["orders.>"]
subscribe = ["orders.>", "payments.*.done"]
subscribe_deny = ["orders.internal.>"]

[[users]]
name = "ops"
token_hash = "{TOKEN_HASH}"
subscribe = [">", "$SYS.>"]
publish = []
"""
    )
    config = Config.from_toml(path)
    assert [user.name for user in config.users] == ["alice", "ops"]
    assert [user.permissions for user in config.users] == [ALICE_PERMISSIONS, OPS_PERMISSIONS]
    assert config.users == parse_users([ALICE, OPS])
    assert config.cluster_token == TOKEN
    assert (config.max_connections, config.max_message_bytes, config.max_pending_bytes) == (
        500,
        65536,
        1048576,
    )
    assert config.allow_anonymous is None
    assert config.connection_settings.max_message_bytes == 65536
    assert config.router_limits.max_pending_bytes == 1048576


def test_users_given_as_user_objects_are_kept() -> None:
    users = parse_users([ALICE])
    assert Config.from_mapping({"users": users}).users == users
    assert Config.from_mapping({"users": list(users)}).users == users


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            {"name": "bob", "password": PASSWORD},
            r"^users\[1\]: unknown key 'password'; accepted: certificate, link, "
            r"max_connections, max_ingress_bytes_per_second, name, password_hash, publish, "
            r"publish_deny, subscribe, subscribe_deny, token_hash$",
        ),
        (
            {"name": "bob", "password_hash": PASSWORD_HASH, "publish": "orders.>"},
            r"^users\[1\]\.publish has the wrong type: 'orders\.>'$",
        ),
        (
            {"name": "bob", "password_hash": PASSWORD_HASH, "link": "yes"},
            r"^users\[1\]\.link has the wrong type: 'yes'$",
        ),
        ({"name": 7, "password_hash": PASSWORD_HASH}, r"^users\[1\]\.name has the wrong type: 7$"),
        ({"password_hash": PASSWORD_HASH}, r"^users\[1\]\.name is required$"),
        ({"name": "", "password_hash": PASSWORD_HASH}, r"^users\[1\]\.name is required$"),
        (
            {"name": "alice", "token_hash": TOKEN_HASH},
            r"^users\[1\]\.name 'alice' is used twice$",
        ),
        ({"name": "bob"}, r"^users\[1\] \(bob\) needs password_hash, token_hash or certificate$"),
        (
            {"name": "bob", "password_hash": "", "publish": []},
            r"^users\[1\] \(bob\) needs password_hash, token_hash or certificate$",
        ),
        (
            {"name": "anonymous", "token_hash": TOKEN_HASH},
            r"^users\[1\]: the 'anonymous' user .* takes no password_hash, token_hash "
            r"or certificate$",
        ),
        (
            {"name": "bob", "password_hash": PASSWORD},
            r"^users\[1\]\.password_hash: not an scrypt hash",
        ),
        (
            {"name": "bob", "token_hash": PASSWORD_HASH.replace("ln=10", "ln=99")},
            r"^users\[1\]\.token_hash: scrypt parameters out of range",
        ),
        (
            {"name": "bob", "password_hash": PASSWORD_HASH, "subscribe": ["a.>.b"]},
            r"^users\[1\]\.subscribe: pattern b'a\.>\.b': '>' may only be the last token$",
        ),
        (
            {"name": "bob", "password_hash": PASSWORD_HASH, "publish_deny": ["a", "b*"]},
            r"^users\[1\]\.publish_deny: pattern b'b\*': wildcards must be whole tokens$",
        ),
        (
            {"name": "bob", "password_hash": PASSWORD_HASH, "subscribe_deny": [""]},
            r"^users\[1\]\.subscribe_deny: pattern must be 1\.\.",
        ),
        (
            {"name": "bob", "password_hash": PASSWORD_HASH, "publish": ["a", 1]},
            r"^users\[1\]\.publish must be a list of pattern strings$",
        ),
        ("bob", r"^users\[1\] must be a table$"),
    ],
)
def test_a_bad_table_is_named_by_index_and_key(table: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_mapping({"users": [ALICE, table]})
    with pytest.raises(AuthConfigError, match=message):
        parse_users([ALICE, table])  # type: ignore[list-item]


def test_a_bad_table_in_a_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broky.toml"
    path.write_text(f'[[users]]\nname = "bob"\npassword_hash = "{PASSWORD_HASH}"\nadmin = true\n')
    with pytest.raises(ConfigError, match=r"^users\[0\]: unknown key 'admin'"):
        Config.from_toml(path)


def test_users_must_be_an_array_of_tables(tmp_path: Path) -> None:
    path = tmp_path / "broky.toml"
    path.write_text(f'[users]\nname = "bob"\npassword_hash = "{PASSWORD_HASH}"\n')
    with pytest.raises(ConfigError, match=r"^users must be an array of tables \(\[\[users\]\]\)$"):
        Config.from_toml(path)


def test_a_scalar_users_setting_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^users must be an array of tables"):
        Config.from_mapping({"users": 5})


# The exposure rule.

EXPOSED_HOSTS: Final = ["0.0.0.0", "", "::", "10.1.2.3", "broker.example.com", "localhost.evil"]
LOOPBACK_HOSTS: Final = ["localhost", "127.0.0.1", "127.8.9.10", "::1", "[::1]"]


@pytest.mark.parametrize("host", EXPOSED_HOSTS)
def test_listening_beyond_loopback_without_authentication_is_refused(host: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"^refusing to listen on host {re.escape(repr(host))} without"
    ) as caught:
        Config(host=host)
    message = str(caught.value)
    for remedy in ("[[users]]", "tls_client_ca", "allow_anonymous = true"):
        assert remedy in message


def test_the_refusal_comes_from_a_file_too(tmp_path: Path) -> None:
    path = tmp_path / "broky.toml"
    path.write_text('host = "0.0.0.0"\n')
    with pytest.raises(
        ConfigError, match=r"refusing to listen on host '0\.0\.0\.0'.*allow_anonymous"
    ):
        Config.from_toml(path)


@pytest.mark.parametrize(
    "settings",
    [
        {"listen": False},
        {"allow_anonymous": True},
        {"users": parse_users([ALICE])},
        {"users": parse_users([ANONYMOUS])},
        # Paths are only read by tls_context(), so these need not exist.
        {"tls_cert": "cert.pem", "tls_key": "key.pem", "tls_client_ca": "ca.pem"},
    ],
    ids=["not-listening", "allow-anonymous", "users", "only-anonymous-user", "mtls"],
)
def test_an_exposed_host_is_accepted_with_authentication_or_consent(
    settings: dict[str, Any],
) -> None:
    config = Config(host="0.0.0.0", **settings)
    assert config.host == "0.0.0.0"


def test_client_certificate_paths_are_read_only_when_the_listener_starts(tmp_path: Path) -> None:
    config = Config(
        host="0.0.0.0",
        tls_cert=str(tmp_path / "cert.pem"),
        tls_key=str(tmp_path / "key.pem"),
        tls_client_ca=str(tmp_path / "ca.pem"),
    )
    with pytest.raises(ConfigError, match=r"^tls_cert: no such file "):
        config.tls_context()


def test_tls_without_client_certificates_does_not_authenticate() -> None:
    with pytest.raises(ConfigError, match=r"^refusing to listen on host '0\.0\.0\.0'"):
        Config(host="0.0.0.0", tls_cert="cert.pem", tls_key="key.pem")


@pytest.mark.parametrize("host", LOOPBACK_HOSTS)
def test_loopback_needs_no_authentication(host: str) -> None:
    assert is_loopback(host)
    assert Config(host=host).host == host
    assert Config(cluster_listen=f"{host}:7800").cluster_listen == f"{host}:7800"


@pytest.mark.parametrize("host", EXPOSED_HOSTS)
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_an_exposed_cluster_listener_is_refused_the_same_way() -> None:
    client_certificates = {"tls_cert": "c.pem", "tls_key": "k.pem", "tls_client_ca": "ca.pem"}
    # Client certificates guard the client listener, not the cluster one.
    for settings in ({}, {"listen": False}, client_certificates):
        with pytest.raises(
            ConfigError,
            match=r"^refusing to listen on cluster_listen '0\.0\.0\.0:7800' without authentication"
            r".*allow_anonymous = true",
        ):
            Config(cluster_listen="0.0.0.0:7800", **settings)
    assert Config(cluster_listen="0.0.0.0:7800", allow_anonymous=True).cluster_listen
    with_users = Config.from_mapping({"cluster_listen": "0.0.0.0:7800", "users": [OPS]})
    assert with_users.cluster_listen


def test_both_exposed_listeners_are_named() -> None:
    with pytest.raises(
        ConfigError, match=r"^refusing to listen on host '::' and cluster_listen '\[::\]:7800' "
    ):
        Config(host="::", cluster_listen="[::]:7800")


@pytest.mark.parametrize("value", [True, False])
def test_allow_anonymous_loads_from_a_file(tmp_path: Path, value: bool) -> None:
    path = tmp_path / "broky.toml"
    path.write_text(
        f'host = "0.0.0.0"\nallow_anonymous = {str(value).lower()}\n'
        f'[[users]]\nname = "bob"\npassword_hash = "{PASSWORD_HASH}"\n'
    )
    assert Config.from_toml(path).allow_anonymous is value


def test_refusing_anonymous_without_users_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"allow_anonymous = false needs \[\[users\]\]"):
        Config(allow_anonymous=False)


# The Authenticator (hash_checks: tests/security/conftest.py).


def authenticator(*tables: dict[str, Any], allow_anonymous: bool | None = None) -> Authenticator:
    return Authenticator(parse_users(list(tables)), allow_anonymous)


async def refusal(auth: Authenticator, user: str, password: str, token: str) -> str:
    with pytest.raises(AuthenticationFailed) as caught:
        await auth.authenticate(user, password, token)
    return str(caught.value)


async def test_a_good_password_names_the_user() -> None:
    with trio.fail_after(5):
        auth = authenticator(ALICE, OPS)
        principal = await auth.authenticate("alice", PASSWORD, "")
        assert principal == Principal("alice", ALICE_PERMISSIONS)
        assert not principal.may_link
        assert auth.failures == 0


async def test_every_wrong_credential_gets_the_same_answer() -> None:
    with trio.fail_after(5):
        auth = authenticator(ALICE, OPS)
        wrong = [
            ("alice", "hunter3", ""),  # wrong password
            ("mallory", PASSWORD, ""),  # unknown user
            ("alice", "", ""),  # no password
            ("", PASSWORD, ""),  # no user
            ("ops", TOKEN, ""),  # a token user has no password
            ("anonymous", "", ""),  # the anonymous table is not a login
        ]
        for user, password, token in wrong:
            assert await refusal(auth, user, password, token) == FAILED, user
        assert auth.failures == len(wrong)


async def test_an_unknown_user_costs_a_hash_like_a_known_one(hash_checks: list[str]) -> None:
    with trio.fail_after(5):
        auth = authenticator(ALICE)
        await refusal(auth, "mallory", "guess", "")
        await refusal(auth, "alice", "guess", "")
        assert hash_checks == ["guess", "guess"]


async def test_a_token_names_its_user() -> None:
    with trio.fail_after(5):
        auth = authenticator(ALICE, OPS)
        assert await auth.authenticate("", "", TOKEN) == Principal("ops", OPS_PERMISSIONS)
        assert await refusal(auth, "", "", "wrong-token") == FAILED
        assert await refusal(auth, "", "", PASSWORD) == FAILED  # alice's password is no token


async def test_a_token_with_a_user_or_password_is_refused() -> None:
    with trio.fail_after(5):
        auth = authenticator(ALICE, OPS)
        for user, password in [("ops", ""), ("", PASSWORD), ("alice", PASSWORD), ("ops", TOKEN)]:
            assert await refusal(auth, user, password, TOKEN) == FAILED, (user, password)


@pytest.mark.parametrize("allow_anonymous", [None, False])
async def test_anonymous_is_refused_once_users_exist(allow_anonymous: bool | None) -> None:
    with trio.fail_after(5):
        auth = authenticator(ALICE, ANONYMOUS, allow_anonymous=allow_anonymous)
        assert not auth.allow_anonymous
        message = await refusal(auth, "", "", "")
        assert message == "this broker requires credentials (user and password, or token)"
        assert auth.failures == 1


async def test_allowed_anonymous_gets_the_anonymous_users_permissions() -> None:
    with trio.fail_after(5):
        auth = authenticator(ALICE, ANONYMOUS, allow_anonymous=True)
        assert await auth.authenticate("", "", "") == Principal("anonymous", ANONYMOUS_PERMISSIONS)
        # Credentials are still checked, not waved through as anonymous.
        assert await auth.authenticate("alice", PASSWORD, "") == Principal(
            "alice", ALICE_PERMISSIONS
        )
        assert await refusal(auth, "alice", "hunter3", "") == FAILED


async def test_allowed_anonymous_without_an_anonymous_user_gets_default_permissions() -> None:
    with trio.fail_after(5):
        auth = authenticator(ALICE, allow_anonymous=True)
        principal = await auth.authenticate("", "", "")
        assert principal == Principal("anonymous", Permissions())
        assert not principal.may_link  # no router links, and `>` grants no $SYS


async def test_without_users_everyone_is_trusted(hash_checks: list[str]) -> None:
    with trio.fail_after(5):
        auth = Authenticator(())
        assert not auth.enabled
        assert auth.allow_anonymous
        assert await auth.authenticate("", "", "") is TRUSTED
        assert await auth.authenticate("alice", "anything", "") is TRUSTED
        assert await auth.authenticate("", "", "any-token") is TRUSTED
        assert hash_checks == []


async def test_a_success_is_remembered_and_a_failure_never(hash_checks: list[str]) -> None:
    with trio.fail_after(5):
        auth = authenticator(ALICE, OPS)
        first = await auth.authenticate("alice", PASSWORD, "")
        assert await auth.authenticate("alice", PASSWORD, "") == first
        assert await auth.authenticate("", "", TOKEN) == Principal("ops", OPS_PERMISSIONS)
        assert await auth.authenticate("", "", TOKEN) == Principal("ops", OPS_PERMISSIONS)
        assert hash_checks == [PASSWORD, TOKEN]

        hash_checks.clear()
        for _ in range(2):
            assert await refusal(auth, "alice", "hunter3", "") == FAILED
            assert await refusal(auth, "alice", PASSWORD + "x", "") == FAILED
        assert hash_checks == ["hunter3", PASSWORD + "x"] * 2


def test_serve_allow_anonymous_flag_opens_a_non_loopback_host() -> None:
    refused = build_parser().parse_args(["serve", "--host", "0.0.0.0"])
    with pytest.raises(ConfigError, match="allow_anonymous"):
        load_config(refused)
    allowed = build_parser().parse_args(["serve", "--host", "0.0.0.0", "--allow-anonymous"])
    assert load_config(allowed).allow_anonymous is True
    assert load_config(build_parser().parse_args(["serve"])).allow_anonymous is None
