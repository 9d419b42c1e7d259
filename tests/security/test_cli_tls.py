"""TLS from the command line: ``serve`` flags override the config file, and
``pub``, ``sub`` and ``bench`` reach a TLS broker with ``--tls-ca`` and friends.

The CLI runs as a child process (``python -m broky``) against a broker on
127.0.0.1 in this test's trio loop.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trustme

from broky import Broker, Config
from broky.cli import build_parser, load_config
from tests.conftest import StartBroker, address_of
from tests.security.helpers import CertFiles, cli_round_trip, write_cert


@pytest.fixture
def client(ca: trustme.CA, tmp_path: Path) -> CertFiles:
    return write_cert(ca, tmp_path, "client", "client@example.test")


async def _mtls_broker(start_broker: StartBroker, server: CertFiles) -> Broker:
    return await start_broker(
        Config(port=0, tls_cert=server.cert, tls_key=server.key, tls_client_ca=server.ca)
    )


def _broky(*args: str) -> list[str]:
    return [sys.executable, "-m", "broky", *args]


async def _run(*args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        _broky(*args), capture_stdout=True, capture_stderr=True, check=False
    )


def test_serve_tls_flags_override_the_config_file(tmp_path: Path, server: CertFiles) -> None:
    settings = tmp_path / "broky.toml"
    settings.write_text('tls_cert = "/from/file.pem"\ntls_key = "/from/file.key"\n')
    args = build_parser().parse_args(
        ["serve", "--config", str(settings), "--tls-cert", server.cert, "--tls-key", server.key,
         "--tls-client-ca", server.ca, "--cluster-tls-cert", server.cert,
         "--cluster-tls-key", server.key, "--cluster-tls-ca", server.ca]
    )  # fmt: skip
    config = load_config(args)
    assert (config.tls_cert, config.tls_key, config.tls_client_ca) == (
        server.cert,
        server.key,
        server.ca,
    )
    assert (config.cluster_tls_cert, config.cluster_tls_key, config.cluster_tls_ca) == (
        server.cert,
        server.key,
        server.ca,
    )
    # Without the flags, the file's values stand.
    config = load_config(build_parser().parse_args(["serve", "--config", str(settings)]))
    assert config.tls_cert == "/from/file.pem"


async def test_pub_and_sub_round_trip_over_mtls(
    start_broker: StartBroker, server: CertFiles, client: CertFiles
) -> None:
    broker = await _mtls_broker(start_broker, server)
    tls = ["--address", address_of(broker), "--tls-ca", server.ca,
           "--tls-cert", client.cert, "--tls-key", client.key]  # fmt: skip
    with trio.fail_after(20):
        output = await cli_round_trip("cli.hello", "over mTLS", tls)
    assert output == "[cli.hello] over mTLS\n"


async def test_pub_without_a_client_certificate_is_told_to_present_one(
    start_broker: StartBroker, server: CertFiles
) -> None:
    broker = await _mtls_broker(start_broker, server)
    with trio.fail_after(15):
        done = await _run(
            "pub", "cli.x", "y", "--address", address_of(broker), "--tls-ca", server.ca
        )
    assert done.returncode == 1
    assert b"requires a client certificate" in done.stderr


async def test_client_tls_flag_errors_name_the_flags(tmp_path: Path) -> None:
    # Three CLI starts: ~2-3 s each on a loaded 2-core machine.
    with trio.fail_after(45):
        done = await _run("pub", "k", "v", "--tls-ca", str(tmp_path / "missing.pem"))
        assert done.returncode == 2
        assert b"cannot load --tls-ca/--tls-cert/--tls-key" in done.stderr
        done = await _run("pub", "k", "v", "--tls-key", str(tmp_path / "key.pem"))
        assert done.returncode == 2
        assert b"--tls-key needs --tls-cert" in done.stderr
        done = await _run("bench", "fan-in", "--tls-ca", str(tmp_path / "ca.pem"))
        assert done.returncode == 2
        assert b"--tls flags need --address" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["fan-in", "latency"])
async def test_bench_against_a_tls_broker(
    start_broker: StartBroker, server: CertFiles, client: CertFiles, scenario: str
) -> None:
    broker = await _mtls_broker(start_broker, server)
    with trio.fail_after(60):
        done = await _run(
            "bench", scenario, "--address", address_of(broker), "--count", "1000",
            "--number", "1", "--run", "100", "--interval", "0.0002", "--tls-ca", server.ca,
            "--tls-cert", client.cert, "--tls-key", client.key, "--json",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (result,) = (json.loads(line) for line in done.stdout.splitlines())
    assert result["published"] == 1000
    assert result["delivered"] == 1000
