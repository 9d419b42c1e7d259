"""What a verified client certificate says its holder is called.

Pure: it reads the dict ``ssl.SSLObject.getpeercert()`` returns after a
handshake, and does no I/O. That dict holds a certificate only when the
listener verified one (``tls_client_ca`` set); otherwise it is empty and so
are the identities.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

#: The subjectAltName entry types that name a client. IP addresses and URIs
#: are left out: an IP address names a host, not a service or person.
SAN_TYPES: Final = frozenset({"DNS", "email"})


def certificate_identities(peercert: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The subject's commonName(s), then its DNS and email subjectAltNames,
    in certificate order without repeats; ``()`` when there is no certificate.

    Compared exactly (case included) with ``[[users]]`` ``certificate`` keys.
    """
    if not peercert:
        return ()
    found: dict[str, None] = {}  # an ordered set
    for rdn in peercert.get("subject", ()):
        for attribute, value in rdn:
            if attribute == "commonName":
                found[value] = None
    for kind, value in peercert.get("subjectAltName", ()):
        if kind in SAN_TYPES:
            found[value] = None
    return tuple(found)
