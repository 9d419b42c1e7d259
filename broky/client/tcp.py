"""``broky.connect``: a client over TCP, optionally TLS."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from broky.client.client import CLOSE_TIMEOUT, CONNECT_TIMEOUT, Client, check_close_timeout
from broky.client.errors import ConnectionClosed, deadline
from broky.security.tls import client_handshake


def parse_address(address: str) -> tuple[str, int]:
    """Split "HOST:PORT" (IPv6 as "[::1]:PORT")."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address must be HOST:PORT, got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


@asynccontextmanager
async def connect(
    address: str,
    *,
    name: str = "",
    stamp_ts_broker: bool = False,
    ssl_context: ssl.SSLContext | None = None,
    user: str = "",
    password: str = "",
    token: str = "",
    idempotent: bool = True,
    close_timeout: float = CLOSE_TIMEOUT,
) -> AsyncIterator[Client]:
    """Connect to a broker over TCP: ``async with broky.connect("127.0.0.1:7722") as client``.

    With ``ssl_context`` (see ``broky.security.tls.client_context``) the
    connection speaks TLS, checking the broker's certificate against ``host``;
    a failed TLS handshake raises ConnectionClosed saying why. ``user`` and
    ``password``, or ``token``, authenticate (send them over TLS only); wrong
    or missing credentials raise AuthenticationError. Acked publishing is
    idempotent unless ``idempotent=False``: ``flush_acks`` then reconnects to
    ``address`` by itself to resend what a lost connection left unanswered.
    Leaving the block waits at most ``close_timeout`` seconds for the
    broker's answer, then gives the connection up (``Client.over``).
    """
    host, port = parse_address(address)
    check_close_timeout(close_timeout)

    async def open_stream() -> trio.abc.Stream:
        with deadline(
            CONNECT_TIMEOUT, f"could not connect to {address} within {CONNECT_TIMEOUT} s"
        ):
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            if ssl_context is not None:
                stream = await _tls_handshake(stream, ssl_context, host, address)
        return stream

    stream = await open_stream()
    async with Client.over(
        stream,
        name=name,
        stamp_ts_broker=stamp_ts_broker,
        user=user,
        password=password,
        token=token,
        peer=address,
        idempotent=idempotent,
        reconnect=open_stream,
        close_timeout=close_timeout,
    ) as client:
        yield client


async def _tls_handshake(
    stream: trio.abc.Stream, context: ssl.SSLContext, host: str, address: str
) -> trio.SSLStream[trio.abc.Stream]:
    try:
        return await client_handshake(stream, context, host)
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise ConnectionClosed(
            f"TLS handshake with {address} failed ({exc.__cause__ or exc}): is that the "
            "broker's TLS port, and does it trust this client's certificate?"
        ) from exc
