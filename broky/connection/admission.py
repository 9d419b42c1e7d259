"""Who a connection's peer is and what it may do.

One ``Admission`` per connection holds its identity (the principal its Hello
proved, or the certificate that named it), its publish gate and its quota
share, from the TLS handshake through the Hello to configuration reloads.
The connection handler owns the socket and the frames; it asks this object
whether to admit the Hello, whether a subscribe or a publish is allowed,
and what a reload changes, and acts on the answers (Error frames, closes).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Final

import trio

from broky.protocol.chunks import u32_array
from broky.protocol.constants import ErrorCode, LinkKind
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import EncodedRun, Hello, Run
from broky.router.matcher import validate_pattern
from broky.security.acl import PublishGate
from broky.security.auth import FAILED, TRUSTED, AuthenticationFailed, Authenticator, Principal
from broky.security.quotas import QuotaLedger, TokenBucket

_MESSAGES: Final = attrgetter("messages")

#: Why a request is refused: the error code and the message the peer reads.
Refusal = tuple[ErrorCode, str]
#: What a publish check that refused something returns: the runs allowed,
#: why the first refused one was refused, and how many messages were refused.
Checked = tuple[list[Run], Refusal, int]


class Admission:
    """One connection's identity and permissions; see the module docstring."""

    def __init__(
        self,
        authenticator: Authenticator | None,
        *,
        map_certificate: bool = False,
        quotas: QuotaLedger | None = None,
        node_names: frozenset[str] | None = None,
    ) -> None:
        #: Who checks the Hello's credentials; None: nobody, the connection
        #: gets full permissions (in-process, private sockets).
        self.authenticator = authenticator
        #: Whether the peer's TLS certificate may name its principal: true
        #: only on the client listener, whose CA is ``tls_client_ca`` (a
        #: cluster certificate proves a node, not a user).
        self.map_certificate = map_certificate
        #: On a cluster listener with cluster_tls_names: the certificate
        #: identities it admits (None: any certificate its CA signed).
        self.node_names = node_names
        #: The worker's per-principal counts and byte buckets (None: no quotas).
        self.quotas = quotas
        #: The name this connection is counted under in ``quotas``, once admitted.
        self.counted_as: str | None = None
        #: Its principal's shared byte-rate bucket (None: not throttled).
        self.bucket: TokenBucket | None = None
        #: The verified client certificate's identities, set by the handshake.
        self.certificate_identities: tuple[str, ...] = ()
        #: Set once the Hello is admitted.
        self.principal: Principal | None = None
        #: The principal's publish permissions (None: it may publish anywhere).
        self.gate: PublishGate | None = None
        #: Why the Hello will be refused whatever it says (max_connections
        #: reached, a certificate naming no admitted node).
        self.refusal: Refusal | None = None

    def certificate_verified(self, identities: tuple[str, ...]) -> None:
        """The TLS handshake verified a certificate naming ``identities``."""
        if self.map_certificate:
            self.certificate_identities = identities
        names = self.node_names
        if names is not None and self.refusal is None and names.isdisjoint(identities):
            named = ", ".join(identities) or "no identity"
            # Refused after its Hello, so that it reads why.
            self.refusal = (
                ErrorCode.PERMISSION_DENIED,
                f"this cluster port admits only the nodes in its cluster_tls_names; "
                f"this certificate names {named}",
            )

    async def admit(self, hello: Hello, source: str, limit: float) -> Refusal | None:
        """Authenticate ``hello`` (from host ``source``) within ``limit``
        seconds and take the principal's quota share; None once admitted,
        else why not (a slow check is refused, not waited for: the
        handshake timeout bounds it).

        The slow hash runs in a worker thread (see broky.security.auth).
        """
        refusal = self.refusal
        principal: Principal | None = TRUSTED
        authenticator = self.authenticator
        if refusal is None and authenticator is not None:
            principal = None
            with trio.move_on_after(limit):
                try:
                    principal = await authenticator.authenticate(
                        hello.user,
                        hello.password,
                        hello.token,
                        self.certificate_identities,
                        source=source,
                    )
                    current = self.authenticator
                    if current is not None and current is not authenticator:
                        # Users were reloaded during the check.
                        principal = current.revalidate(principal, authenticator)
                        if principal is None:
                            raise AuthenticationFailed(FAILED)
                except AuthenticationFailed as exc:
                    refusal = (ErrorCode.AUTHENTICATION_FAILED, str(exc))
            if principal is None and refusal is None:
                refusal = (
                    ErrorCode.AUTHENTICATION_FAILED,
                    "authentication timed out (the broker is busy checking other logins)",
                )
        if (
            refusal is None
            and principal is not None
            and hello.link is not LinkKind.CLIENT
            and not principal.may_link
        ):
            refusal = (
                ErrorCode.PERMISSION_DENIED,
                f"principal {principal.name or 'anonymous'!r} may not open router links "
                "(grant it with link = true in its [[users]] table)",
            )
        if refusal is None and principal is not None and self.quotas is not None:
            over = self.quotas.admit(principal.name, principal.quotas)
            if over is not None:
                refusal = (ErrorCode.LIMIT_EXCEEDED, over)
            else:
                self.counted_as = principal.name
                self.bucket = self.quotas.bucket(
                    principal.name, principal.quotas, trio.current_time()
                )
        if refusal is not None or principal is None:
            return refusal or (ErrorCode.AUTHENTICATION_FAILED, "refused")
        self.principal = principal
        if principal.permissions is not None:
            self.gate = PublishGate(principal.permissions)
        return None

    def reload(self, authenticator: Authenticator, previous: Authenticator) -> str | None:
        """Take reloaded users (Broker.reload). Returns why the connection
        must close, or None if it may stay (with its new permissions)."""
        self.authenticator = authenticator
        principal = self.principal
        if principal is None:
            return None  # not admitted yet: admit checks against the new users
        updated = authenticator.revalidate(principal, previous)
        if updated is None:
            return (
                f"the credentials of {principal.name or 'anonymous'!r} were revoked by a "
                "configuration reload"
            )
        if updated != principal:
            self.principal = updated
            self.gate = (
                PublishGate(updated.permissions) if updated.permissions is not None else None
            )
            if self.quotas is not None and self.counted_as is not None:
                # A new max_connections counts from the next login; a new rate applies now.
                self.bucket = self.quotas.bucket(updated.name, updated.quotas, trio.current_time())
        return None

    def release(self) -> None:
        """Give the connection's quota share back (it closed)."""
        if self.quotas is not None and self.counted_as is not None:
            self.quotas.release(self.counted_as)
            self.counted_as = None

    def who(self, hello: Hello) -> str:
        """How a refused Hello introduced itself, for the log line."""
        if hello.user:
            return f" as user {hello.user!r}"
        if hello.token:
            return " with a token"
        if self.certificate_identities:
            return f" with a client certificate for {', '.join(self.certificate_identities)}"
        return ""

    def subscribe_refusal(self, pattern: bytes, kind: LinkKind) -> str | None:
        """Why this principal may not subscribe to ``pattern`` (None: it may).
        Invalid patterns pass here and are refused by the router as such.

        A router link (admitted with ``link = true``) subscribes to whatever
        its node's clients want, each of whom that node has checked already:
        its interest is not filtered again here.
        """
        permissions = self.principal.permissions if self.principal is not None else None
        if permissions is None or kind is not LinkKind.CLIENT:
            return None
        try:
            validate_pattern(pattern)
        except RemoteProtocolError:
            return None
        return permissions.subscribe_refusal(pattern)

    def _publish_denied(self, key: bytes) -> Refusal | None:
        gate = self.gate
        if gate is None or gate.allows(key):
            return None
        name = self.principal.name if self.principal is not None else ""
        return (
            ErrorCode.PERMISSION_DENIED,
            f"publishing to {key.decode(errors='replace')!r} is not allowed for principal {name!r}",
        )

    def check_runs(self, runs: Sequence[Run], limit: int) -> Checked | None:
        """The runs of a Publish this connection may publish: each key allowed
        by the principal's permissions, each message within ``limit`` bytes
        (max_message_bytes; 0: none). None when all are (the common case,
        decided without a per-run step when there is neither gate nor bound)."""
        if self.gate is None and (
            not limit or not runs or max(map(len, map(_MESSAGES, runs))) <= limit
        ):
            return None  # one C-level pass: a frame often holds a run per message
        kept: list[Run] = []
        refused: Refusal | None = None
        rejected = 0
        for run in runs:
            problem = self._publish_denied(run.key)
            if problem is None and limit and len(run.messages) > limit:
                largest = max(u32_array(memoryview(run.sizes)))
                if largest > limit:
                    problem = (
                        ErrorCode.LIMIT_EXCEEDED,
                        f"a message of {largest} bytes on {run.key.decode(errors='replace')!r} "
                        f"exceeds max_message_bytes ({limit})",
                    )
            if problem is None:
                kept.append(run)
            else:
                refused = refused or problem
                rejected += run.count
        return None if refused is None else (kept, refused, rejected)

    def check_forwarded(
        self, runs: list[EncodedRun]
    ) -> tuple[list[EncodedRun], Refusal, int] | None:
        """``check_runs`` for runs read for forwarding (the protocol machine
        already kept runs over max_message_bytes out of them): None when
        every key is allowed."""
        if self.gate is None:
            return None
        kept: list[EncodedRun] = []
        refused: Refusal | None = None
        rejected = 0
        for run in runs:
            problem = self._publish_denied(run.key)
            if problem is None:
                kept.append(run)
            else:
                refused = refused or problem
                rejected += run.count
        return None if refused is None else (kept, refused, rejected)
