"""The subscription index: which subscriptions match a key.

Exact patterns live in a dict; wildcard patterns in a trie over `.`-separated
tokens (``*`` matches one token, a final ``>`` one or more). Results are
cached per key; any change to the index clears the cache (the generation
approach of nats-server's sublist, reduced to its simplest form: changes are
rare next to publishes, and a cleared cache refills at one trie walk per key).

Keys and patterns are bytes as they travel on the wire. A key is checked
(length, characters as ``broky.protocol.keys`` says, then tokens) only when it
misses the cache, never per message. Keys that start with ``$SYS`` are matched
only by patterns that start with ``$SYS``, so that a catch-all ``>``
subscriber never sees the broker's own traffic.
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

from broky.protocol.constants import MAX_KEY_BYTES, ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.keys import key_bytes_problem

T = TypeVar("T")

#: Most keys whose matches are cached. A publish to a key not in the cache
#: costs one trie walk (a few microseconds); the bound keeps a flood of unique
#: keys from growing the cache without limit (~100 bytes + key per entry).
MATCH_CACHE_SIZE: Final = 16384
SYSTEM_PREFIX: Final = b"$SYS"
_WILDCARDS: Final = (b"*", b">")


def _check_text(value: bytes, what: str, code: ErrorCode) -> None:
    """The rules keys and patterns share: 1..MAX_KEY_BYTES of key text."""
    if not value or len(value) > MAX_KEY_BYTES:
        raise RemoteProtocolError(f"{what} must be 1..{MAX_KEY_BYTES} bytes", code)
    problem = key_bytes_problem(value)
    if problem is not None:
        raise RemoteProtocolError(f"{what} {value!r} {problem}", code)


def validate_pattern(pattern: bytes) -> list[bytes]:
    """Split a subscription pattern into tokens, or raise InvalidPattern."""
    _check_text(pattern, "pattern", ErrorCode.INVALID_PATTERN)
    tokens = pattern.split(b".")
    for index, token in enumerate(tokens):
        if not token:
            raise RemoteProtocolError(
                f"pattern {pattern!r} has an empty token", ErrorCode.INVALID_PATTERN
            )
        if token == b">" and index != len(tokens) - 1:
            raise RemoteProtocolError(
                f"pattern {pattern!r}: '>' may only be the last token", ErrorCode.INVALID_PATTERN
            )
        if token not in _WILDCARDS and (b"*" in token or b">" in token):
            raise RemoteProtocolError(
                f"pattern {pattern!r}: wildcards must be whole tokens", ErrorCode.INVALID_PATTERN
            )
    return tokens


def patterns_overlap(first: bytes, second: bytes) -> bool:
    """Whether some key could match both (valid) patterns.

    An over-approximation for ``$SYS`` keys (a leading wildcard does not match
    them): callers use it to skip work, and then still match each key.
    """
    a, b = first.split(b"."), second.split(b".")
    for index in range(max(len(a), len(b))):
        if index < len(a) and a[index] == b">":
            return len(b) > index
        if index < len(b) and b[index] == b">":
            return len(a) > index
        if index == len(a) or index == len(b):
            return False
        if a[index] != b[index] and b"*" not in (a[index], b[index]):
            return False
    return True


def validate_key(key: bytes) -> list[bytes]:
    """Split a publish key into tokens, or raise InvalidKey."""
    _check_text(key, "publish key", ErrorCode.INVALID_KEY)
    tokens = key.split(b".")
    for token in tokens:
        if not token or token in _WILDCARDS:
            raise RemoteProtocolError(
                f"publish key {key!r} has an empty or wildcard token", ErrorCode.INVALID_KEY
            )
    return tokens


class _Node(Generic[T]):
    __slots__ = ("children", "full_wildcard", "star", "terminal")

    def __init__(self) -> None:
        self.children: dict[bytes, _Node[T]] = {}
        self.star: _Node[T] | None = None
        self.full_wildcard: list[T] = []  # subscribers of `>` at this level
        self.terminal: list[T] = []  # subscribers whose pattern ends here

    def empty(self) -> bool:
        return not (self.children or self.star or self.full_wildcard or self.terminal)


class SubscriptionIndex(Generic[T]):
    """Pattern -> subscribers, with a cached ``match``. Not thread-safe; one owner."""

    def __init__(self) -> None:
        self._exact: dict[bytes, list[T]] = {}
        self._root: _Node[T] = _Node()
        self._cache: dict[bytes, tuple[T, ...]] = {}
        self._patterns: dict[bytes, int] = {}
        self.generation = 0

    def __len__(self) -> int:
        """Number of subscriptions."""
        return sum(self._patterns.values())

    @property
    def pattern_count(self) -> int:
        """Distinct patterns with at least one subscriber (the live topics)."""
        return len(self._patterns)

    @property
    def cache_size(self) -> int:
        """Keys currently in the match cache."""
        return len(self._cache)

    def _changed(self) -> None:
        self._cache.clear()
        self.generation += 1

    def add(self, pattern: bytes, subscriber: T) -> None:
        """Add ``subscriber`` under ``pattern`` (validated first)."""
        tokens = validate_pattern(pattern)
        if b"*" not in tokens and b">" not in tokens:
            self._exact.setdefault(pattern, []).append(subscriber)
        else:
            node = self._root
            for token in tokens:
                if token == b">":
                    node.full_wildcard.append(subscriber)
                    break
                if token == b"*":
                    if node.star is None:
                        node.star = _Node()
                    node = node.star
                else:
                    node = node.children.setdefault(token, _Node())
            else:
                node.terminal.append(subscriber)
        self._patterns[pattern] = self._patterns.get(pattern, 0) + 1
        self._changed()

    def remove(self, pattern: bytes, subscriber: T) -> None:
        """Remove one registration; unknown ones are ignored."""
        if pattern not in self._patterns:
            return
        tokens = pattern.split(b".")
        if b"*" not in tokens and b">" not in tokens:
            subscribers = self._exact.get(pattern, [])
            if subscriber not in subscribers:
                return
            subscribers.remove(subscriber)
            if not subscribers:
                del self._exact[pattern]
        elif not self._remove_wild(self._root, tokens, 0, subscriber):
            return
        remaining = self._patterns[pattern] - 1
        if remaining:
            self._patterns[pattern] = remaining
        else:
            del self._patterns[pattern]
        self._changed()

    def _remove_wild(self, node: _Node[T], tokens: list[bytes], index: int, subscriber: T) -> bool:
        token = tokens[index] if index < len(tokens) else None
        if token is None:
            if subscriber in node.terminal:
                node.terminal.remove(subscriber)
                return True
            return False
        if token == b">":
            if subscriber in node.full_wildcard:
                node.full_wildcard.remove(subscriber)
                return True
            return False
        child = node.star if token == b"*" else node.children.get(token)
        if child is None or not self._remove_wild(child, tokens, index + 1, subscriber):
            return False
        if child.empty():
            if token == b"*":
                node.star = None
            else:
                del node.children[token]
        return True

    def match(self, key: bytes) -> tuple[T, ...]:
        """Subscribers whose pattern matches ``key``; raises InvalidKey for a bad key."""
        found = self._cache.get(key)
        if found is not None:
            return found
        tokens = validate_key(key)
        matches: list[T] = list(self._exact.get(key, ()))
        self._walk(self._root, tokens, 0, matches, key.startswith(SYSTEM_PREFIX))
        result = tuple(matches)
        if len(self._cache) >= MATCH_CACHE_SIZE:
            self._cache.clear()
        self._cache[key] = result
        return result

    def _walk(
        self, node: _Node[T], tokens: list[bytes], index: int, out: list[T], system: bool
    ) -> None:
        if index == len(tokens):
            out.extend(node.terminal)
            return
        if not (system and index == 0):
            out.extend(node.full_wildcard)
            if node.star is not None:
                self._walk(node.star, tokens, index + 1, out, system)
        child = node.children.get(tokens[index])
        if child is not None:
            self._walk(child, tokens, index + 1, out, system)
