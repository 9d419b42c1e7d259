"""Per-principal permissions: which keys one may publish, which patterns subscribe.

Permissions are allow and deny lists of patterns in the subscription syntax
(``*`` one token, final ``>`` one or more), and **deny wins**:

* publishing to a key needs an allow pattern that matches it and no deny
  pattern that matches it;
* subscribing to a pattern needs an allow pattern that *covers* it (every
  key the subscription could match, the allow pattern matches too) and no
  deny pattern that *intersects* it (no key both match). So with allow
  ``>`` and deny ``secret.>``, subscribing to ``>`` is refused rather than
  silently filtered: the subscriber learns at once that it cannot have
  everything, and the router's fan-out stays free of per-run permission
  checks. Subscribe to narrower patterns instead.

``$SYS`` keys follow the router's rule: a leading wildcard never matches
them, so ``>`` grants nothing under ``$SYS``; reading the broker's own
metrics and advisories needs an explicit ``$SYS.>`` (or narrower) grant.

Pure functions over bytes, checked against the router's own matcher by
property tests (tests/security/test_acl.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs

from broky.protocol.errors import RemoteProtocolError
from broky.router.matcher import SYSTEM_PREFIX, patterns_overlap, validate_pattern

_WILDCARDS: Final = (b"*", b">")
#: Keys whose publish permission a connection remembers (a dict lookup per
#: run instead of a pattern walk); cleared when full.
PUBLISH_CACHE_SIZE: Final = 4096


def _is_system(token: bytes) -> bool:
    return token.startswith(SYSTEM_PREFIX)


def matches(pattern: bytes, key: bytes) -> bool:
    """Whether ``pattern`` matches ``key`` (both valid), the router's way."""
    p, k = pattern.split(b"."), key.split(b".")
    if p[0] in _WILDCARDS and key.startswith(SYSTEM_PREFIX):
        return False
    for index, token in enumerate(p):
        if token == b">":
            return len(k) > index
        if index >= len(k) or (token != b"*" and token != k[index]):
            return False
    return len(k) == len(p)


def covers(outer: bytes, inner: bytes) -> bool:
    """Whether every key ``inner`` matches is matched by ``outer`` (both valid patterns)."""
    o, i = outer.split(b"."), inner.split(b".")
    if o[0] in _WILDCARDS and i[0] not in _WILDCARDS and _is_system(i[0]):
        return False  # inner matches $SYS keys, a leading wildcard never does
    for index, token in enumerate(o):
        if token == b">":
            return len(i) > index
        if index >= len(i) or i[index] == b">":
            return False
        if token != b"*" and token != i[index]:
            return False  # a literal covers only itself, never a wildcard
    return len(i) == len(o)


def intersects(first: bytes, second: bytes) -> bool:
    """Whether some key matches both (valid) patterns: the router's
    ``patterns_overlap``, made exact for ``$SYS`` (a leading wildcard never
    meets a pattern that only matches ``$SYS`` keys)."""
    a, b = first.split(b".", 1)[0], second.split(b".", 1)[0]
    a_wild, b_wild = a in _WILDCARDS, b in _WILDCARDS
    if (a_wild and not b_wild and _is_system(b)) or (b_wild and not a_wild and _is_system(a)):
        return False
    return patterns_overlap(first, second)


def parse_patterns(patterns: Iterable[str], where: str) -> tuple[bytes, ...]:
    """Encode and validate configured patterns; ValueError names ``where``."""
    out = []
    for pattern in patterns:
        encoded = pattern.encode()
        try:
            validate_pattern(encoded)
        except RemoteProtocolError as exc:
            raise ValueError(f"{where}: {exc}") from exc
        out.append(encoded)
    return tuple(out)


@attrs.frozen(slots=True)
class Permissions:
    """What one principal may do. The defaults allow everything but ``$SYS``."""

    publish: tuple[bytes, ...] = (b">",)
    publish_deny: tuple[bytes, ...] = ()
    subscribe: tuple[bytes, ...] = (b">",)
    subscribe_deny: tuple[bytes, ...] = ()
    #: May open router links (another broker's worker or node).
    link: bool = False

    def may_publish(self, key: bytes) -> bool:
        """Allowed by some publish pattern and denied by none."""
        return any(matches(p, key) for p in self.publish) and not any(
            matches(p, key) for p in self.publish_deny
        )

    def subscribe_refusal(self, pattern: bytes) -> str | None:
        """Why subscribing to (valid) ``pattern`` is refused, or None if allowed."""
        text = pattern.decode(errors="replace")
        for deny in self.subscribe_deny:
            if intersects(deny, pattern):
                return (
                    f"subscribing to {text!r} is denied: it overlaps the denied pattern "
                    f"{deny.decode(errors='replace')!r}"
                )
        if not any(covers(allow, pattern) for allow in self.subscribe):
            return f"subscribing to {text!r} is not allowed for this principal"
        return None


class PublishGate:
    """One connection's publish check, remembering answers per key.

    Owned by the connection's reader task; the cache keeps a publisher's
    steady keys at one dict lookup per run.
    """

    __slots__ = ("_cache", "permissions")

    def __init__(self, permissions: Permissions) -> None:
        self.permissions = permissions
        self._cache: dict[bytes, bool] = {}

    def allows(self, key: bytes) -> bool:
        """Whether this principal may publish to ``key``."""
        allowed = self._cache.get(key)
        if allowed is None:
            allowed = self.permissions.may_publish(key)
            if len(self._cache) >= PUBLISH_CACHE_SIZE:
                self._cache.clear()
            self._cache[bytes(key)] = allowed
        return allowed
