"""Authentication and ACLs in a real ``broky serve``: every worker enforces
them, and cluster links authenticate with ``cluster_token``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

import broky
from broky import AuthenticationError, BrokyError, ErrorCode
from broky.security.passwords import hash_secret
from tests.mesh.test_nodes import free_ports, nodes, take

pytestmark = pytest.mark.slow

CLUSTER_TOKEN = "cluster-secret-0123456789"


def write_config(path: Path, extra: str = "") -> str:
    """A config with user app (orders.* only) and a link principal."""
    path.write_text(
        f"""
{extra}
[[users]]
name = "app"
password_hash = "{hash_secret("app-pw", log_n=10)}"
publish = ["orders.*"]
subscribe = ["orders.*"]

[[users]]
name = "peer"
token_hash = "{hash_secret(CLUSTER_TOKEN, log_n=10)}"
link = true
"""
    )
    return str(path)


@pytest.mark.parametrize("accept", ["handoff", "reuseport"])
async def test_every_worker_authenticates_and_enforces_permissions(
    tmp_path: Path, accept: str
) -> None:
    config = write_config(tmp_path / "broky.toml")
    with nodes() as start, trio.fail_after(30):
        node = start(["--workers", "2", "--accept", accept, "--config", config])
        with pytest.raises(AuthenticationError):
            async with broky.connect(node.address, user="app", password="wrong"):
                pass  # pragma: no cover
        async with (
            broky.connect(node.address, user="app", password="app-pw") as first,
            broky.connect(node.address, user="app", password="app-pw") as second,
            broky.connect(node.address, user="app", password="app-pw") as third,
            second.subscription("orders.*") as on_second,
            third.subscription("orders.*") as on_third,
        ):
            with pytest.raises(BrokyError) as denied:
                await first.subscribe("payments.*")
            assert denied.value.code is ErrorCode.PERMISSION_DENIED
            for number in range(100):
                await first.publish("orders.eu", number.to_bytes(4, "big"))
            await first.flush()
            expected = [number.to_bytes(4, "big") for number in range(100)]
            # With two workers at least one subscriber sits on the other worker.
            assert await take(on_second, 100) == expected
            assert await take(on_third, 100) == expected


def test_the_worker_spec_stays_off_the_command_line(tmp_path: Path) -> None:
    config = write_config(tmp_path / "broky.toml", f'cluster_token = "{CLUSTER_TOKEN}"')
    with nodes() as start:
        node = start(["--workers", "2", "--config", config])
        pids = node.workers()
        assert len(pids) == 2
        for pid in pids:
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert CLUSTER_TOKEN.encode() not in command_line
            assert b"broky.mesh.workers" in command_line
    assert os.path.exists(config)


async def test_a_cluster_links_with_its_token(tmp_path: Path) -> None:
    ports = free_ports(2)
    addresses = [f"127.0.0.1:{port}" for port in ports]
    configs = [
        write_config(tmp_path / f"node{index}.toml", f'cluster_token = "{CLUSTER_TOKEN}"')
        for index in range(2)
    ]

    def args(index: int) -> list[str]:
        return [
            "--workers",
            "1",
            "--config",
            configs[index],
            "--cluster-listen",
            addresses[index],
            "--peers",
            addresses[1 - index],
        ]

    with nodes() as start, trio.fail_after(30):
        node_a, node_b = start(args(0)), start(args(1))
        async with (
            broky.connect(node_a.address, user="app", password="app-pw") as publisher,
            broky.connect(node_b.address, user="app", password="app-pw") as reader,
            reader.subscription("orders.*") as on_b,
        ):
            for attempt in range(200):  # cluster interest is eventual
                await publisher.publish("orders.probe", b"%d" % attempt)
                await publisher.flush()
                await trio.sleep(0.05)
                if on_b.statistics().buffered_messages:
                    break
            assert on_b.statistics().buffered_messages, "the authenticated link never came up"
