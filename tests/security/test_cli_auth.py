"""Credentials from the command line: ``passwd`` makes hashes the broker
accepts; ``pub``, ``sub`` and ``bench`` log in with ``--user`` and
``BROKY_PASSWORD`` or ``BROKY_TOKEN``.

The CLI runs as a child process (``python -m broky``) against a broker on
127.0.0.1 in this test's trio loop.
"""

from __future__ import annotations

import json

import pytest
import trio

from broky import Broker, Config
from broky.security.auth import parse_users
from tests.conftest import StartBroker, address_of
from tests.security.helpers import cli_round_trip, run_broky


async def _hashes() -> tuple[str, str, str]:
    """A password hash, and a token with its hash, made by ``broky passwd``."""
    made = await run_broky("passwd", "--cost", "10", stdin=b"s3cret-pw\n")
    assert made.returncode == 0, made.stderr
    (line,) = made.stdout.decode().splitlines()
    password_hash = line.split(" = ", 1)[1].strip('"')
    made = await run_broky("passwd", "--token", "--cost", "10")
    assert made.returncode == 0, made.stderr
    token_line, hash_line = made.stdout.decode().splitlines()
    return password_hash, token_line.split(" = ", 1)[1], hash_line.split(" = ", 1)[1].strip('"')


async def _secured(start_broker: StartBroker) -> tuple[Broker, str]:
    password_hash, token, token_hash = await _hashes()
    users = parse_users(
        [
            {"name": "cli", "password_hash": password_hash, "subscribe": ["cli.>"]},
            {"name": "bench", "token_hash": token_hash},
        ]
    )
    return await start_broker(Config(port=0, users=users)), token


async def test_pub_and_sub_log_in_with_user_and_environment_password(
    start_broker: StartBroker,
) -> None:
    with trio.fail_after(30):
        broker, _ = await _secured(start_broker)
        login = ["--address", address_of(broker), "--user", "cli"]
        output = await cli_round_trip(
            "cli.hello", "logged in", login, env={"BROKY_PASSWORD": "s3cret-pw"}
        )
    assert output == "[cli.hello] logged in\n"


async def test_cli_errors_say_what_to_fix(start_broker: StartBroker) -> None:
    with trio.fail_after(30):
        broker, _ = await _secured(start_broker)
        address = ["--address", address_of(broker)]
        done = await run_broky(
            "pub", "cli.x", "y", *address, "--user", "cli", "--password", "wrong"
        )
        assert done.returncode == 1
        assert b"authentication failed" in done.stderr
        assert b"--user/--password/--token" in done.stderr
        done = await run_broky(
            "pub", "cli.x", "y", *address, "--user", "cli", env={"BROKY_PASSWORD": ""}
        )
        assert done.returncode == 2
        assert b"--user needs a password" in done.stderr
        done = await run_broky("pub", "cli.x", "y", *address, "--password", "p")
        assert done.returncode == 2
        assert b"--password needs --user" in done.stderr
        done = await run_broky(
            "sub", "payments.>", *address, "--user", "cli", "--password", "s3cret-pw"
        )
        assert done.returncode == 1
        assert b"not allowed" in done.stderr


@pytest.mark.slow
async def test_bench_logs_in_with_a_token(start_broker: StartBroker) -> None:
    with trio.fail_after(60):
        broker, token = await _secured(start_broker)
        done = await run_broky(
            "bench", "fan-in", "--address", address_of(broker), "--count", "1000",
            "--number", "1", "--run", "100", "--interval", "0.0002", "--json",
            env={"BROKY_TOKEN": token},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (result,) = (json.loads(line) for line in done.stdout.splitlines())
    assert result["published"] == 1000
    assert result["delivered"] == 1000
    assert broker.statistics().connections_closed.get("authentication_failed", 0) == 0
