"""What a durable subscription is: its name, pattern, type and settings.

A subscription is created by the first ``Consume`` that names it and kept
(in each partition's state store, beside its image) until deleted. Its type
and settings are the creator's: a later ``Consume`` with another type or
pattern is refused, because the dispatchers already hold state built on
them (slot owners, ordering rules); per-consumer settings (credit,
``max_in_flight``, priority) come with each ``Consume``.

The redelivery settings (ack timeout, backoff, ``max_deliveries``) are the
subscription's too, as a JetStream consumer's are: one message has one
timer and one delivery count whichever consumer holds it, so two consumers
cannot each have their own. A later ``Consume`` that sends other values is
refused ("consumer already exists with different config" in JetStream),
not silently served with the creator's; a client that does not care sets
the setting's ``adopt_settings`` bit (the Python client does for every
option its caller did not pass) and joins whatever was chosen. Changing
them means deleting and re-creating the subscription.

Stored as JSON (one small text per subscription and partition store), so a
broker can read what an older one wrote and a human can read it with the
sqlite3 shell.
"""

from __future__ import annotations

import json
import re
from typing import Final

import attrs

from broky.protocol.constants import AdoptSetting, StartKind, SubscriptionKind
from broky.protocol.frames import Consume
from broky.subscriptions.model import Options, SubscriptionType

#: The JSON format this code writes; an unknown one is refused at load.
DEFINITION_VERSION: Final = 1
#: Longest subscription name in bytes (the schema's rule): it appears in
#: dead-letter keys, advisories and metric labels.
MAX_NAME_BYTES: Final = 200
#: Characters of a name kept as they are in a dead-letter key (key tokens
#: may not hold ``.``, ``*``, ``>`` or spaces); others become ``_``.
_KEY_SAFE: Final = re.compile(r"[^A-Za-z0-9_-]")
#: Prefix of every dead-letter key: ``_dlq.<subscription>.<topic>``.
DEAD_LETTER_PREFIX: Final = "_dlq"

KINDS: Final = {
    SubscriptionKind.SHARED: SubscriptionType.SHARED,
    SubscriptionKind.EXCLUSIVE: SubscriptionType.EXCLUSIVE,
    SubscriptionKind.FAILOVER: SubscriptionType.FAILOVER,
    SubscriptionKind.KEY_SHARED: SubscriptionType.KEY_SHARED,
}


class DefinitionError(Exception):
    """A Consume cannot create or join a subscription; the message says why
    (the client's fault: answered with ``SubscriptionRefused``)."""


def name_refusal(name: str) -> str | None:
    """Why ``name`` cannot name a subscription (None: it can)."""
    if not name or len(name.encode()) > MAX_NAME_BYTES:
        return f"a subscription name has 1 to {MAX_NAME_BYTES} bytes"
    if any(ord(character) < 0x20 or ord(character) == 0x7F for character in name):
        return "a subscription name may not hold control characters"
    return None


@attrs.frozen(slots=True)
class Definition:
    """One subscription's fixed settings (see the module docstring)."""

    name: str
    pattern: bytes
    kind: SubscriptionKind
    options: Options
    start: StartKind = StartKind.LATEST
    start_time: int = 0
    start_offsets: tuple[int, ...] = ()
    #: The ``[[durable]]`` topic its dead letters go to ("": the default,
    #: the topic holding ``_dlq.<subscription>.<topic>``).
    dead_letter_topic: str = ""

    @classmethod
    def from_consume(cls, frame: Consume) -> Definition:
        refusal = name_refusal(frame.subscription)
        if refusal is not None:
            raise DefinitionError(refusal)
        if frame.kind is SubscriptionKind.KEY_SHARED and frame.ack_timeout_ms == 0:
            raise DefinitionError("a key-shared subscription needs ack_timeout_ms > 0")
        if frame.start is StartKind.LAST:
            raise DefinitionError(
                "start Last is for Subscribe; a subscription starts at a position"
            )
        options = Options(
            type=KINDS[frame.kind],
            ack_timeout=frame.ack_timeout_ms / 1000,
            backoff=tuple(delay / 1000 for delay in frame.backoff_ms),
            max_deliveries=frame.max_deliveries,
        )
        return cls(
            frame.subscription,
            frame.pattern,
            frame.kind,
            options,
            frame.start,
            frame.start_time,
            frame.start_offsets,
            frame.dead_letter_topic,
        )

    def mismatch(self, frame: Consume) -> str | None:
        """Why ``frame`` may not join this subscription (None: it may)."""
        if frame.kind is not self.kind:
            return (
                f"subscription {self.name!r} is {self.options.type.value}, "
                f"not {KINDS[frame.kind].value} (the type is fixed at creation)"
            )
        if frame.pattern != self.pattern:
            return (
                f"subscription {self.name!r} reads {self.pattern.decode(errors='replace')!r}, "
                f"not {frame.pattern.decode(errors='replace')!r}"
            )
        differs = self._settings_mismatch(frame)
        if differs:
            return (
                f"subscription {self.name!r} exists with {differs}: its redelivery "
                "settings are fixed at creation (attach with the same values, leave them "
                "unset to adopt the subscription's, or delete and re-create it)"
            )
        if frame.dead_letter_topic and frame.dead_letter_topic != self.dead_letter_topic:
            return (
                f"subscription {self.name!r} sends its dead letters to "
                f"{self.dead_letter_topic or 'the default _dlq topic'!r}, not "
                f"{frame.dead_letter_topic!r} (fixed at creation)"
            )
        return None

    def _settings_mismatch(self, frame: Consume) -> str:
        """The redelivery settings ``frame`` sends that differ from this
        subscription's and that it does not adopt ("" if none)."""
        options = self.options
        adopt = AdoptSetting(frame.adopt_settings)
        differs = []
        ack_timeout_ms = round(options.ack_timeout * 1000)
        if AdoptSetting.ACK_TIMEOUT not in adopt and frame.ack_timeout_ms != ack_timeout_ms:
            differs.append(f"ack_timeout_ms {ack_timeout_ms}, not {frame.ack_timeout_ms}")
        if (
            AdoptSetting.MAX_DELIVERIES not in adopt
            and frame.max_deliveries != options.max_deliveries
        ):
            differs.append(f"max_deliveries {options.max_deliveries}, not {frame.max_deliveries}")
        backoff_ms = tuple(round(delay * 1000) for delay in options.backoff)
        if AdoptSetting.BACKOFF not in adopt and tuple(frame.backoff_ms) != backoff_ms:
            differs.append(f"backoff_ms {list(backoff_ms)}, not {list(frame.backoff_ms)}")
        return "; ".join(differs)

    @property
    def dead_letter_token(self) -> str:
        """The subscription's name as one key token (see ``_KEY_SAFE``)."""
        return _KEY_SAFE.sub("_", self.name)

    def dead_letter_key(self, topic: str, pattern: bytes = b"") -> bytes:
        """Where this subscription's dead letters from ``topic`` are published.

        With ``pattern`` (the chosen dead-letter topic's), a key that
        pattern matches: its wildcards filled, in order, with the
        subscription's token and the topic's (``*`` takes one, ``>`` the
        rest; ``_`` once both are used), so ``dlq.>`` gives
        ``dlq.<subscription>.<topic>`` as ``_dlq.>`` gives the default key.
        """
        fill = [self.dead_letter_token, _KEY_SAFE.sub("_", topic)]
        if not pattern:
            return ".".join((DEAD_LETTER_PREFIX, *fill)).encode()
        tokens = []
        for token in pattern.decode().split("."):
            if token == "*":
                tokens.append(fill.pop(0) if fill else "_")
            elif token == ">":
                tokens.extend(fill or ["_"])
                fill = []
            else:
                tokens.append(token)
        return ".".join(tokens).encode()

    def to_json(self) -> str:
        options = self.options
        return json.dumps(
            {
                "version": DEFINITION_VERSION,
                "name": self.name,
                "pattern": self.pattern.decode(),
                "kind": int(self.kind),
                "start": int(self.start),
                "start_time": self.start_time,
                "start_offsets": list(self.start_offsets),
                "ack_timeout": options.ack_timeout,
                "backoff": list(options.backoff),
                "max_deliveries": options.max_deliveries,
                "dead_letter_topic": self.dead_letter_topic,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Definition:
        """Raises DefinitionError for a definition this code did not write."""
        try:
            data = json.loads(text)
            if data["version"] != DEFINITION_VERSION:
                raise DefinitionError(f"subscription definition version {data['version']}")
            kind = SubscriptionKind(data["kind"])
            options = Options(
                type=KINDS[kind],
                ack_timeout=float(data["ack_timeout"]),
                backoff=tuple(float(delay) for delay in data["backoff"]),
                max_deliveries=int(data["max_deliveries"]),
            )
            return cls(
                str(data["name"]),
                str(data["pattern"]).encode(),
                kind,
                options,
                StartKind(data["start"]),
                int(data["start_time"]),
                tuple(int(offset) for offset in data["start_offsets"]),
                str(data.get("dead_letter_topic", "")),  # absent before it existed
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise DefinitionError(f"unreadable subscription definition: {exc}") from exc
