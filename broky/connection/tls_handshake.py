"""The server side of a TLS handshake, bounded by the handshake timeout.

Done in the connection's own task, so that a slow or foreign peer on the
TLS port costs one task, never the accept loop.
"""

from __future__ import annotations

import trio

from broky.connection.admission import Admission
from broky.connection.reasons import CloseReason
from broky.connection.writer import CLOSE_TIMEOUT
from broky.security.identity import certificate_identities
from broky.security.tls import send_pending_alert


async def tls_handshake(
    stream: trio.SSLStream[trio.abc.Stream], limit: float, admission: Admission
) -> tuple[CloseReason, str] | None:
    """Complete the handshake within ``limit`` seconds; why it failed, or None.

    On success the peer certificate's identities go to ``admission`` when it
    maps certificates to principals or checks node names.
    """
    with trio.move_on_after(limit):
        try:
            await stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            cause = exc.__cause__ or exc
            with trio.move_on_after(CLOSE_TIMEOUT):
                await send_pending_alert(stream)  # the peer reads why it was refused
            return (
                CloseReason.PROTOCOL_ERROR,
                f"TLS handshake failed ({cause}): is the peer speaking plain TCP, or "
                "is its certificate missing or not signed by the CA this listener trusts?",
            )
        if admission.map_certificate or admission.node_names is not None:
            admission.certificate_verified(certificate_identities(stream.getpeercert()))
        return None
    return CloseReason.IDLE_TIMEOUT, f"TLS handshake not completed within {limit} s"
