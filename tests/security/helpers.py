"""Security test helpers: throwaway certificates as PEM files (from
``trustme`` CAs made per test), a connect that must fail, and the ``broky``
command run as a child process."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path

import attrs
import trio
import trustme

import broky
from broky import ConnectionClosed


@attrs.frozen
class CertFiles:
    """Paths of one certificate chain, its key, and the CA that signed it."""

    cert: str
    key: str
    ca: str


def write_cert(
    ca: trustme.CA, directory: Path, name: str, *identities: str, common_name: str | None = None
) -> CertFiles:
    """Issue a certificate for ``identities`` (host names, IP or email
    addresses) and ``common_name``, and write it, its key and ``ca``'s
    certificate under ``directory`` as ``name``.*."""
    issued = ca.issue_cert(*identities, common_name=common_name)
    files = CertFiles(
        cert=str(directory / f"{name}.pem"),
        key=str(directory / f"{name}.key"),
        ca=str(directory / f"{name}-ca.pem"),
    )
    issued.private_key_and_cert_chain_pem.write_to_path(files.cert)
    issued.private_key_pem.write_to_path(files.key)
    ca.cert_pem.write_to_path(files.ca)
    return files


async def connect_fails(address: str, context: ssl.SSLContext | None) -> str:
    """Connect and flush, which must fail with ConnectionClosed; its message."""
    caught: list[str] = []
    try:
        async with broky.connect(address, ssl_context=context) as client:
            await client.flush()
    except* ConnectionClosed as group:
        caught.extend(str(leaf) for leaf in _leaves(group))
    assert caught, "the connection was accepted"
    return caught[0]


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def broky_command(*args: str) -> list[str]:
    """The ``broky`` command line, run by this interpreter."""
    return [sys.executable, "-m", "broky", *args]


async def run_broky(
    *args: str, env: Mapping[str, str] | None = None, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """Run ``broky ARGS`` to completion, capturing its output."""
    return await trio.run_process(
        broky_command(*args),
        stdin=stdin,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env={**os.environ, **(env or {})},
    )


async def cli_round_trip(
    key: str, payload: str, options: Sequence[str], env: Mapping[str, str] | None = None
) -> str:
    """``broky sub`` the key's first token, then ``broky pub`` one message
    with the same ``options``; what ``sub`` printed."""
    pattern = key.split(".", 1)[0] + ".>"
    async with trio.open_nursery() as nursery:
        # Started in the nursery: a failing test kills it (by PID) on the way out.
        sub: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                broky_command("sub", pattern, "--count", "1", *options),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                check=False,
                env={**os.environ, **(env or {})},
            )
        )
        assert sub.stderr is not None
        assert sub.stdout is not None
        announced = b""
        while b"subscribed to" not in announced:
            chunk = await sub.stderr.receive_some(4096)
            assert chunk, f"broky sub exited: {announced!r}"
            announced += chunk
        published = await run_broky("pub", key, payload, *options, env=env)
        assert published.returncode == 0, published.stderr
        output = b""
        while chunk := await sub.stdout.receive_some(4096):
            output += chunk
        assert await sub.wait() == 0
    return output.decode()
