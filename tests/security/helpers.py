"""TLS test helpers: throwaway certificates as PEM files (from ``trustme``
CAs made per test), and a connect that must fail."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import attrs
import trustme

import broky
from broky import ConnectionClosed


@attrs.frozen
class CertFiles:
    """Paths of one certificate chain, its key, and the CA that signed it."""

    cert: str
    key: str
    ca: str


def write_cert(ca: trustme.CA, directory: Path, name: str, *identities: str) -> CertFiles:
    """Issue a certificate for ``identities`` (host names or IP addresses) and
    write it, its key and ``ca``'s certificate under ``directory`` as ``name``.*."""
    issued = ca.issue_cert(*identities)
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
