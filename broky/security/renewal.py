"""Loading renewed TLS certificates into live contexts on a reload.

A broker holds several TLS contexts (its client listener's, its cluster
listener's, the one it presents to peers), each built from a ``*_cert`` and
``*_key`` pair of settings. Certificates expire and are renewed on disk; a
reload loads them again into the same contexts, so new handshakes get the
renewed certificate while connections already up keep theirs. Why its own
module: this is the one piece of a reload that touches files and TLS, apart
from the broker's connections and listeners.
"""

from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broky.config import Config

log = logging.getLogger("broky.server")


class CertificateRenewal:
    """The contexts a reload loads certificates into, each with the prefix
    of its settings ("tls": ``tls_cert`` and ``tls_key``)."""

    def __init__(self) -> None:
        self._renewable: list[tuple[ssl.SSLContext, str]] = []

    def add(self, context: ssl.SSLContext, prefix: str) -> None:
        """Load ``{prefix}_cert`` and ``{prefix}_key`` into ``context`` on
        every ``renew``."""
        self._renewable.append((context, prefix))

    def renew(self, config: Config) -> list[str]:
        """Load the certificates ``config`` names again; the prefixes of those
        loaded. One that fails to load is logged and its context keeps the
        certificate it had."""
        renewed: list[str] = []
        for context, prefix in self._renewable:
            cert, key = (
                getattr(config, f"{prefix}_cert"),
                getattr(config, f"{prefix}_key"),
            )
            try:
                context.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as exc:
                log.error("%s_cert/%s_key could not be loaded again: %s", prefix, prefix, exc)
            else:
                renewed.append(prefix)
        return renewed
