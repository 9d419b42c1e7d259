"""Who is connecting: ``[[users]]`` tables, credentials checks, principals.

Example::

    allow_anonymous = false          # the default once users exist

    [[users]]
    name = "orders-service"
    password_hash = "scrypt$ln=15,r=8,p=1$..."   # from `broky passwd`
    publish = ["orders.>"]
    subscribe = ["orders.>", "payments.*.done"]
    subscribe_deny = ["orders.internal.>"]
    max_connections = 20                         # quotas: broky.security.quotas
    max_ingress_bytes_per_second = 10_000_000

    [[users]]
    name = "ops"
    token_hash = "sha256$..."                    # from `broky passwd --token`
    subscribe = [">", "$SYS.>"]
    publish = []

    [[users]]
    name = "billing"                 # a client certificate (mTLS) names it
    certificate = "billing.internal.example"
    publish = ["billing.>"]

    [[users]]
    name = "node-b"                  # another node's cluster links
    token_hash = "sha256$..."
    link = true

A Hello carries ``user`` and ``password``, or ``token``, or nothing. With
nothing, a client certificate verified against ``tls_client_ca`` whose
identities (broky.security.identity) include a user's ``certificate`` makes
the connection that user: the handshake already proved the key, so no hash
runs. Explicit credentials win over the certificate; with neither, the
connection is anonymous.

A generated token is found by its SHA-256 in a dict, at once (see
broky.security.passwords). Other checks run the slow hash in a worker
thread, a few at a time, so a flood of logins costs threads, never the
event loop; who goes next is decided fairly across peers, and a peer over
its budget is refused without a check (broky.security.admission). A
successful check is remembered (as a SHA-256 of the credentials, in memory
only) so a reconnecting fleet pays the slow hash once per credential, not
once per connection; failures are never remembered, so every guess stays
slow.

Anonymous connections are accepted only when there are no users (then with
full access: a loopback-only development broker, see Config) or when
``allow_anonymous`` is true; they get the permissions of a user named
``anonymous`` (no credentials) when one is configured, else the default
permissions: every key, but no ``$SYS`` and no router links.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Final

import attrs

from broky.security.acl import Permissions, parse_patterns
from broky.security.admission import LoginQueue, LoginRefused
from broky.security.passwords import (
    SecretHash,
    SecretHashError,
    TokenDigest,
    parse_hash,
    parse_token_hash,
    token_digest,
)
from broky.security.quotas import NO_QUOTAS, Quotas

ANONYMOUS: Final = "anonymous"
#: Successful credentials remembered (see the module docstring).
VERIFIED_CACHE_SIZE: Final = 1024
#: The one failure message: it must not tell which part was wrong.
FAILED: Final = "authentication failed: wrong user, password or token"

USER_KEYS: Final[dict[str, tuple[type, ...]]] = {
    "name": (str,),
    "password_hash": (str,),
    "token_hash": (str,),
    "certificate": (str,),
    "publish": (list,),
    "publish_deny": (list,),
    "subscribe": (list,),
    "subscribe_deny": (list,),
    "link": (bool,),
    "max_connections": (int,),
    "max_ingress_bytes_per_second": (int,),
}
#: The quota keys of a [[users]] table (broky.security.quotas).
QUOTA_KEYS: Final = ("max_connections", "max_ingress_bytes_per_second")


class AuthConfigError(ValueError):
    """A ``[[users]]`` table is wrong; the message names the table and key."""


class AuthenticationFailed(Exception):
    """The credentials were missing or wrong; the message is safe to send."""


@attrs.frozen(slots=True)
class User:
    """One configured principal: its credentials and permissions.

    ``certificate`` is a client-certificate identity that names this user
    ("": none); identities are unique across users.
    """

    name: str
    password: SecretHash | None = None
    token: SecretHash | TokenDigest | None = None
    permissions: Permissions = attrs.field(factory=Permissions)
    certificate: str = ""
    quotas: Quotas = NO_QUOTAS

    @property
    def principal(self) -> Principal:
        """Who a connection that proved this user's credentials is."""
        return Principal(self.name, self.permissions, self.quotas)

    @property
    def credentials(self) -> tuple[object, ...]:
        """What proves this user's identity: when it changes, connections that
        proved the old one are closed (see Authenticator.revalidate)."""
        return (self.password, self.token, self.certificate)

    def to_table(self) -> dict[str, Any]:
        """The ``[[users]]`` table this user was parsed from (for worker processes)."""
        permissions = self.permissions
        table: dict[str, Any] = {
            "name": self.name,
            "publish": [p.decode() for p in permissions.publish],
            "publish_deny": [p.decode() for p in permissions.publish_deny],
            "subscribe": [p.decode() for p in permissions.subscribe],
            "subscribe_deny": [p.decode() for p in permissions.subscribe_deny],
            "link": permissions.link,
        }
        if self.password is not None:
            table["password_hash"] = self.password.encoded
        if self.token is not None:
            table["token_hash"] = self.token.encoded
        if self.certificate:
            table["certificate"] = self.certificate
        table.update(attrs.asdict(self.quotas))
        return table


@attrs.frozen(slots=True)
class Principal:
    """Who a connection is, and what it may do (None: everything)."""

    name: str
    permissions: Permissions | None
    quotas: Quotas = NO_QUOTAS

    @property
    def may_link(self) -> bool:
        """Whether this principal may open router links."""
        return self.permissions is None or self.permissions.link


#: Connections nobody needs to authenticate: embedded (in-process) clients,
#: worker links over the node's private Unix sockets, and brokers without users.
TRUSTED: Final = Principal("", None)


def parse_users(tables: Sequence[Mapping[str, Any]]) -> tuple[User, ...]:
    """Turn ``[[users]]`` tables into users; errors name ``users[i].key``."""
    if not isinstance(tables, (list, tuple)):
        raise AuthConfigError("users must be an array of tables ([[users]])")
    users: list[User] = []
    names: set[str] = set()
    #: Certificate identity -> the index of the table that claimed it.
    certificates: dict[str, int] = {}
    for index, table in enumerate(tables):
        where = f"users[{index}]"
        if not isinstance(table, Mapping):
            raise AuthConfigError(f"{where} must be a table")
        for key, value in table.items():
            expected = USER_KEYS.get(key)
            if expected is None:
                raise AuthConfigError(
                    f"{where}: unknown key {key!r}; accepted: {', '.join(sorted(USER_KEYS))}"
                )
            if not isinstance(value, expected):
                raise AuthConfigError(f"{where}.{key} has the wrong type: {value!r}")
        name = table.get("name", "")
        if not name:
            raise AuthConfigError(f"{where}.name is required")
        if name in names:
            raise AuthConfigError(f"{where}.name {name!r} is used twice")
        names.add(name)
        hashes: dict[str, SecretHash | TokenDigest | None] = {}
        for key, parse in (("password_hash", parse_hash), ("token_hash", parse_token_hash)):
            encoded = table.get(key, "")
            try:
                hashes[key] = parse(encoded) if encoded else None
            except SecretHashError as exc:
                raise AuthConfigError(f"{where}.{key}: {exc}") from exc
        certificate = _certificate(table, where, certificates)
        if name == ANONYMOUS:
            if any(hashes.values()) or certificate:
                raise AuthConfigError(
                    f"{where}: the {ANONYMOUS!r} user sets anonymous permissions and takes "
                    "no password_hash, token_hash or certificate"
                )
        elif not (any(hashes.values()) or certificate):
            raise AuthConfigError(
                f"{where} ({name}) needs password_hash, token_hash or certificate"
            )
        if certificate:
            certificates[certificate] = index
        try:
            permissions = Permissions(
                publish=_patterns(table, "publish", where, (b">",)),
                publish_deny=_patterns(table, "publish_deny", where, ()),
                subscribe=_patterns(table, "subscribe", where, (b">",)),
                subscribe_deny=_patterns(table, "subscribe_deny", where, ()),
                link=bool(table.get("link", False)),
            )
        except ValueError as exc:
            raise AuthConfigError(str(exc)) from exc
        password = hashes["password_hash"]
        assert not isinstance(password, TokenDigest)  # parse_hash makes scrypt hashes only
        quotas = Quotas(**{key: _quota(table, key, where) for key in QUOTA_KEYS})
        users.append(User(name, password, hashes["token_hash"], permissions, certificate, quotas))
    return tuple(users)


def _quota(table: Mapping[str, Any], key: str, where: str) -> int:
    value = table.get(key, 0)
    if isinstance(value, bool) or value < 0:
        raise AuthConfigError(f"{where}.{key} must be an integer >= 0 (0: no quota), got {value!r}")
    return int(value)


def _certificate(table: Mapping[str, Any], where: str, claimed: Mapping[str, int]) -> str:
    """The table's certificate identity ("": none), checked against those
    earlier tables ``claimed``: one identity naming two users would make the
    principal depend on table order."""
    if "certificate" not in table:
        return ""
    certificate: str = table["certificate"]
    if not certificate.strip() or certificate != certificate.strip():
        raise AuthConfigError(
            f"{where}.certificate must be a certificate identity (a commonName, DNS name "
            f"or email address), not {certificate!r}"
        )
    if certificate in claimed:
        raise AuthConfigError(
            f"{where}.certificate {certificate!r} is already users[{claimed[certificate]}]'s"
        )
    return certificate


def _patterns(
    table: Mapping[str, Any], key: str, where: str, default: tuple[bytes, ...]
) -> tuple[bytes, ...]:
    if key not in table:
        return default
    values = table[key]
    if not all(isinstance(value, str) for value in values):
        raise AuthConfigError(f"{where}.{key} must be a list of pattern strings")
    return parse_patterns(values, f"{where}.{key}")


class Authenticator:
    """Checks a Hello's credentials against the configured users.

    One per broker; its cache is touched only from the broker's trio thread.
    """

    def __init__(
        self,
        users: Sequence[User],
        allow_anonymous: bool | None = None,
        logins: LoginQueue | None = None,
    ) -> None:
        self._by_name = {user.name: user for user in users if user.name != ANONYMOUS}
        #: Users with a generated token, by its SHA-256: found at once.
        self._token_index = {
            user.token.digest: user
            for user in self._by_name.values()
            if isinstance(user.token, TokenDigest)
        }
        #: Users whose token has an scrypt hash: one slow hash each to check.
        self._slow_token_users = [
            user for user in self._by_name.values() if isinstance(user.token, SecretHash)
        ]
        anonymous = next((user for user in users if user.name == ANONYMOUS), None)
        #: Whether any credentials are configured at all.
        self.enabled = bool(self._by_name)
        self.allow_anonymous = (not self.enabled) if allow_anonymous is None else allow_anonymous
        # Without an `anonymous` table, anonymous clients of a broker that has
        # users get the default permissions: every key, but no $SYS, no links.
        self._anonymous = (
            anonymous.principal if anonymous is not None else Principal(ANONYMOUS, Permissions())
        )
        # Checked when the user name is unknown, so that a missing user costs
        # the same time as a wrong password and timing reveals no names.
        self._decoy = next(
            (
                secret
                for user in self._by_name.values()
                for secret in (user.password, user.token)
                if isinstance(secret, SecretHash)
            ),
            None,
        )
        #: Certificate identity -> its user's principal (parse_users keeps them unique).
        self._by_certificate = {
            user.certificate: user.principal for user in self._by_name.values() if user.certificate
        }
        self._verified: OrderedDict[bytes, Principal] = OrderedDict()
        #: The fair queue of slow checks; a reload hands it to the next
        #: Authenticator, so budgets and cool-downs survive it.
        self.logins = logins or LoginQueue()
        self.failures = 0

    async def authenticate(
        self,
        user: str,
        password: str,
        token: str,
        identities: Sequence[str] = (),
        source: str = "",
    ) -> Principal:
        """The principal for these credentials; AuthenticationFailed if none.

        ``source`` is the peer's address (its host): slow checks are queued
        fairly across sources and refused at once for a source over its
        budget (broky.security.admission).

        ``identities`` are those of the connection's verified client
        certificate (broky.security.identity); they count only when the Hello
        carries no credentials. The failure message for wrong credentials is
        the same whatever was wrong, so that it tells a guesser nothing about
        which user names exist.
        """
        if not (user or password or token):
            mapped = self._certificate_principal(identities)
            if mapped is not None:
                return mapped
            if self.allow_anonymous:
                return self._anonymous if self.enabled else TRUSTED
            unmapped = "; the client certificate names no user" if identities else ""
            raise self._failed(
                f"this broker requires credentials (user and password, or token){unmapped}"
            )
        if not self.enabled:
            # Credentials sent to an open broker: accepted, but they name nobody.
            return TRUSTED
        if token and not (user or password):
            indexed = self._token_index.get(token_digest(token))
            if indexed is not None:
                return indexed.principal
            if not self._slow_token_users:
                raise self._failed(FAILED)
        fingerprint = hashlib.sha256(
            b"\0".join((user.encode(), password.encode(), token.encode()))
        ).digest()
        known = self._verified.get(fingerprint)
        if known is not None:
            self._verified.move_to_end(fingerprint)
            return known
        try:
            principal = await self.logins.check(
                source, user, partial(self._check, user, password, token)
            )
        except LoginRefused as exc:
            raise self._failed(str(exc)) from None
        if principal is None:
            self.logins.failed(source, user)
            raise self._failed(FAILED)
        self.logins.succeeded(source, user)
        self._verified[fingerprint] = principal
        if len(self._verified) > VERIFIED_CACHE_SIZE:
            self._verified.popitem(last=False)
        return principal

    def revalidate(self, principal: Principal, previous: Authenticator) -> Principal | None:
        """What a live connection that ``previous`` admitted as ``principal``
        is under these users (after a reload); None if it may stay no longer.

        A user keeps its connections while its name and credentials stand,
        with its new permissions; a removed user, or one whose password,
        token or certificate identity changed, loses them, as a rotated secret must lock out whoever
        held the old one. Anonymous connections follow ``allow_anonymous``.
        """
        if not self.enabled:
            return TRUSTED  # no users any more: an open (loopback) broker
        if principal.name in ("", ANONYMOUS):
            return self._anonymous if self.allow_anonymous else None
        user = self._by_name.get(principal.name)
        before = previous._by_name.get(principal.name)
        if user is None or before is None or user.credentials != before.credentials:
            return None
        return user.principal

    def _certificate_principal(self, identities: Sequence[str]) -> Principal | None:
        """The principal a certificate's identities name (None: nobody).

        Identities naming two different users are refused rather than
        resolved by order: which one a certificate lists first is up to
        whoever issued it, not to the broker's operator.
        """
        named = {self._by_certificate[i] for i in identities if i in self._by_certificate}
        if len(named) > 1:
            raise self._failed("the client certificate names more than one user; send credentials")
        return named.pop() if named else None

    def _failed(self, message: str) -> AuthenticationFailed:
        self.failures += 1
        return AuthenticationFailed(message)

    def _check(self, user: str, password: str, token: str) -> Principal | None:
        """The slow part, in a worker thread: no shared state is touched."""
        if token:
            if user or password:
                return None  # one kind of credential at a time
            for candidate in self._slow_token_users:
                assert candidate.token is not None
                if candidate.token.matches(token):
                    return candidate.principal
            return None
        found = self._by_name.get(user)
        if found is None or found.password is None or not password:
            if self._decoy is not None:
                self._decoy.matches(password)
            return None
        if found.password.matches(password):
            return found.principal
        return None
