"""TLS contexts for the broker's client listener and for clients, and the
client side of a handshake.

Both contexts refuse anything older than TLS 1.2. The broker's context
requires and verifies a client certificate when given a client CA (mTLS).
"""

from __future__ import annotations

import contextlib
import ssl

import trio


def server_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """The broker's context: its certificate chain and key (PEM files), and,
    with ``client_ca``, a required client certificate signed by that CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: str = "", cert: str = "", key: str = "") -> ssl.SSLContext:
    """A client's context: trust ``ca`` (PEM; the system's CAs when empty) and,
    for mTLS, present ``cert``/``key``. Host names are checked."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert:
        context.load_cert_chain(cert, key or None)
    return context


async def client_handshake(
    stream: trio.abc.Stream, context: ssl.SSLContext, host: str
) -> trio.SSLStream[trio.abc.Stream]:
    """TLS over ``stream``, checking the peer's certificate against ``host``.

    Whatever ends the handshake early (a refusal, a deadline, cancellation)
    closes ``stream`` before it propagates: nothing else holds it yet, and
    a socket left to the garbage collector is a leak. Callers translate
    the errors into their own.
    """
    tls = trio.SSLStream(stream, context, server_hostname=host)
    try:
        await tls.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return tls


async def send_pending_alert(stream: trio.SSLStream[trio.abc.Stream]) -> None:
    """Send the TLS alert a failed server handshake left unsent.

    When OpenSSL refuses a handshake (a protocol version below TLS 1.2, a
    missing or unverifiable client certificate), it writes a fatal alert
    that says why, but trio's SSLStream raises before sending it, and the
    peer sees only "unexpected EOF". The alert is in the stream's outgoing
    memory BIO, which trio keeps private: read it there, if that is still
    where it lives, and write it to the transport. Best effort: nothing is
    raised; the caller bounds the time.
    """
    outgoing = getattr(stream, "_outgoing", None)
    if not isinstance(outgoing, ssl.MemoryBIO) or not outgoing.pending:
        return
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.transport_stream.send_all(outgoing.read())
