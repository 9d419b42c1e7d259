"""Slow, salted hashes of passwords and tokens, and their constant-time check.

The config file holds only hashes (``broky passwd`` makes them), so a leaked
config does not leak credentials. The hash is scrypt from the standard
library: memory-hard, so a guess costs an attacker ~32 MiB and tens of
milliseconds, and no extra dependency is needed. The encoded form carries
its parameters, so stronger settings can be rolled out hash by hash::

    scrypt$ln=15,r=8,p=1$<salt, base64>$<hash, base64>

Comparison goes through ``hmac.compare_digest``: the time taken does not
depend on how many leading bytes matched.

Generated tokens (``broky passwd --token``: 256 random bits) are stored as a
plain SHA-256 instead, ``sha256$<hash, base64>``. Key stretching protects
secrets a person chose, which a guesser can enumerate; nobody enumerates
2**256 tokens, slowed or not. An unsalted digest is also a lookup key, so
the broker finds a token's user in a dict, in microseconds, however many
token users there are, where salted hashes cost one slow hash per user.
A hand-chosen token belongs in an scrypt hash (``broky passwd`` makes one
from any secret); those are still accepted as ``token_hash`` and checked
one by one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from typing import Final

import attrs

SCHEME: Final = "scrypt"
#: The scheme of generated tokens' hashes (see the module docstring).
TOKEN_SCHEME: Final = "sha256"
#: Default cost: 2**15 iterations of r=8 blocks (32 MiB, ~50-100 ms here).
DEFAULT_LOG_N: Final = 15
DEFAULT_R: Final = 8
DEFAULT_P: Final = 1
SALT_BYTES: Final = 16
HASH_BYTES: Final = 32
#: Accepted cost range: below 2**10 a hash is too cheap to slow a guesser,
#: above 2**20 one check would take seconds and a gigabyte.
MIN_LOG_N: Final = 10
MAX_LOG_N: Final = 20

_ENCODED = re.compile(
    r"^scrypt\$ln=(?P<ln>\d+),r=(?P<r>\d+),p=(?P<p>\d+)\$(?P<salt>[A-Za-z0-9+/=]+)\$(?P<hash>[A-Za-z0-9+/=]+)$"
)


_TOKEN_ENCODED = re.compile(r"^sha256\$(?P<hash>[A-Za-z0-9+/=]+)$")


class SecretHashError(ValueError):
    """An encoded hash is not in the ``scrypt$ln=..,r=..,p=..$salt$hash`` form."""


@attrs.frozen(slots=True)
class SecretHash:
    """A decoded hash: its cost parameters, salt and digest."""

    log_n: int
    r: int
    p: int
    salt: bytes
    digest: bytes = attrs.field(repr=False)
    #: The text it was parsed from (what a config file holds).
    encoded: str = attrs.field(default="", repr=False)

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` hashes to this digest (slow, constant-time compare)."""
        candidate = _scrypt(secret, self.salt, self.log_n, self.r, self.p, len(self.digest))
        return hmac.compare_digest(candidate, self.digest)


@attrs.frozen(slots=True)
class TokenDigest:
    """The SHA-256 of a generated token: a dict key, checked in microseconds."""

    digest: bytes = attrs.field(repr=False)
    encoded: str = attrs.field(default="", repr=False)

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` is the token (constant-time compare)."""
        return hmac.compare_digest(token_digest(secret), self.digest)


def token_digest(token: str) -> bytes:
    """What a :class:`TokenDigest` holds for ``token``."""
    return hashlib.sha256(token.encode()).digest()


def hash_token(token: str) -> str:
    """The encoded ``sha256$...`` hash of a generated token."""
    if not token:
        raise ValueError("an empty token cannot be hashed")
    return f"{TOKEN_SCHEME}${base64.b64encode(token_digest(token)).decode()}"


def _scrypt(secret: str, salt: bytes, log_n: int, r: int, p: int, length: int) -> bytes:
    n = 1 << log_n
    return hashlib.scrypt(
        secret.encode(),
        salt=salt,
        n=n,
        r=r,
        p=p,
        maxmem=2 * 128 * r * n + 1024 * 1024,
        dklen=length,
    )


def hash_secret(secret: str, *, log_n: int = DEFAULT_LOG_N, r: int = DEFAULT_R) -> str:
    """The encoded scrypt hash of ``secret`` with a fresh random salt."""
    if not secret:
        raise ValueError("an empty password or token cannot be hashed: choose one")
    if not MIN_LOG_N <= log_n <= MAX_LOG_N:
        raise ValueError(f"log_n must be {MIN_LOG_N}..{MAX_LOG_N}, got {log_n}")
    salt = os.urandom(SALT_BYTES)
    digest = _scrypt(secret, salt, log_n, r, DEFAULT_P, HASH_BYTES)
    return (
        f"{SCHEME}$ln={log_n},r={r},p={DEFAULT_P}$"
        f"{base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"
    )


def parse_hash(encoded: str) -> SecretHash:
    """Decode a hash made by :func:`hash_secret`; SecretHashError says what is wrong."""
    found = _ENCODED.match(encoded)
    if found is None:
        raise SecretHashError(
            "not an scrypt hash (expected scrypt$ln=N,r=R,p=P$SALT$HASH; make one with "
            "`broky passwd`)"
        )
    log_n, r, p = int(found["ln"]), int(found["r"]), int(found["p"])
    if not MIN_LOG_N <= log_n <= MAX_LOG_N or not 1 <= r <= 32 or not 1 <= p <= 16:
        raise SecretHashError(
            f"scrypt parameters out of range (ln {MIN_LOG_N}..{MAX_LOG_N}, r 1..32, p 1..16): "
            f"ln={log_n}, r={r}, p={p}"
        )
    try:
        salt = base64.b64decode(found["salt"], validate=True)
        digest = base64.b64decode(found["hash"], validate=True)
    except binascii.Error as exc:
        raise SecretHashError(f"bad base64 in the hash: {exc}") from exc
    if len(salt) < 8 or len(digest) < 16:
        raise SecretHashError("salt or digest too short (at least 8 and 16 bytes)")
    return SecretHash(log_n, r, p, salt, digest, encoded)


def parse_token_hash(encoded: str) -> SecretHash | TokenDigest:
    """Decode a ``token_hash``: a generated token's ``sha256$...``, or any scrypt hash."""
    found = _TOKEN_ENCODED.match(encoded)
    if found is None:
        if encoded.startswith(f"{SCHEME}$"):
            return parse_hash(encoded)
        raise SecretHashError(
            "not a token hash (expected sha256$HASH from `broky passwd --token`, "
            "or an scrypt hash from `broky passwd`)"
        )
    try:
        digest = base64.b64decode(found["hash"], validate=True)
    except binascii.Error as exc:
        raise SecretHashError(f"bad base64 in the hash: {exc}") from exc
    if len(digest) != hashlib.sha256().digest_size:
        raise SecretHashError(f"a sha256 token hash holds 32 bytes, this one {len(digest)}")
    return TokenDigest(digest, encoded)
