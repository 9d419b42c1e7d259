"""``[[durable]]`` tables of the config file, turned into TopicPolicy values.

Example::

    data_dir = "/var/lib/broky"

    [[durable]]
    name = "orders"              # directory name; default derived from the pattern
    pattern = "orders.>"
    partitions = 8
    segment_bytes = 134217728
    retention_seconds = 604800   # and/or retention_bytes
    roll = "daily 00:00 +01:00"  # or a number of seconds
    fsync = "always"             # always | interval | never
    fsync_interval = 1.0         # seconds, for fsync = "interval"
    acks = "all"                 # replicated: all (high watermark) | leader

Errors name the table and key (``durable[2].fsync``) and say what is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from broky.protocol.errors import RemoteProtocolError
from broky.storage.config import NS_PER_SECOND, FsyncPolicy, LogConfig, RollSchedule
from broky.storage.errors import StorageError
from broky.storage.topics import TopicPolicy

#: Keys a ``[[durable]]`` table accepts, with the types TOML gives them.
DURABLE_KEYS: Final[dict[str, tuple[type, ...]]] = {
    "name": (str,),
    "pattern": (str,),
    "partitions": (int,),
    "segment_bytes": (int,),
    "retention_seconds": (int, float),
    "retention_bytes": (int,),
    "roll": (str, int, float),
    "fsync": (str,),
    "fsync_interval": (int, float),
    "acks": (str,),
}
_DAILY: Final = re.compile(
    r"daily\s+(\d{1,2}):(\d{2})(?:\s*(?:UTC)?\s*([+-])(\d{1,2}):(\d{2}))?", re.IGNORECASE
)


class DurableConfigError(ValueError):
    """A ``[[durable]]`` table is wrong; the message names the key."""


def default_name(pattern: str) -> str:
    """A directory-safe topic name for a pattern: ``orders.>`` -> ``orders.all``."""
    name = pattern.replace(">", "all").replace("*", "any").replace("$", "_")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:128]


def parse_roll(value: object, where: str) -> RollSchedule:
    """``roll``: seconds (a number) or ``"daily HH:MM [+HH:MM]"`` (UTC offset)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return RollSchedule.every(value)
    match = _DAILY.fullmatch(str(value).strip())
    if match is None:
        raise DurableConfigError(
            f"{where} must be seconds or 'daily HH:MM [+HH:MM]', got {value!r}"
        )
    hour, minute, sign, offset_hours, offset_minutes = match.groups()
    offset = int(offset_hours or 0) * 60 + int(offset_minutes or 0)
    return RollSchedule.daily(int(hour), int(minute), -offset if sign == "-" else offset)


def parse_policy(table: Mapping[str, Any], index: int) -> TopicPolicy:
    """One ``[[durable]]`` table."""
    where = f"durable[{index}]"
    if not isinstance(table, Mapping):
        raise DurableConfigError(f"{where} must be a table, got {table!r}")
    for key, value in table.items():
        expected = DURABLE_KEYS.get(key)
        if expected is None:
            raise DurableConfigError(
                f"unknown setting {where}.{key}; accepted: {', '.join(sorted(DURABLE_KEYS))}"
            )
        if not isinstance(value, expected) or isinstance(value, bool):
            raise DurableConfigError(f"{where}.{key} has the wrong type: {value!r}")
    if "pattern" not in table:
        raise DurableConfigError(f"{where}.pattern is required (the keys to keep)")
    pattern = table["pattern"]
    current = "pattern"
    try:
        log_settings: dict[str, Any] = {}
        for key, field in (
            ("segment_bytes", "segment_bytes"),
            ("retention_seconds", "retention_seconds"),
            ("retention_bytes", "retention_bytes"),
            ("fsync_interval", "fsync_interval_seconds"),
        ):
            if key in table:
                log_settings[field] = table[key]
        if "fsync" in table:
            current = "fsync"
            try:
                log_settings["fsync"] = FsyncPolicy(table["fsync"])
            except ValueError:
                raise DurableConfigError(
                    f"{where}.fsync must be always, interval or never, got {table['fsync']!r}"
                ) from None
        if "roll" in table:
            current = "roll"
            log_settings["roll"] = parse_roll(table["roll"], f"{where}.roll")
        current = "log settings"
        log_config = LogConfig(**log_settings)
        current = "pattern, name, partitions or acks"
        return TopicPolicy(
            name=table.get("name") or default_name(pattern),
            pattern=pattern.encode(),
            partitions=table.get("partitions", 1),
            log=log_config,
            acks=table.get("acks", "all"),
        )
    except (StorageError, RemoteProtocolError) as exc:
        raise DurableConfigError(f"{where} ({current}): {exc}") from exc


def parse_policies(value: object) -> tuple[TopicPolicy, ...]:
    """The ``durable`` setting: a list of tables (or TopicPolicy values already)."""
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise DurableConfigError(f"durable must be a list of tables ([[durable]]), got {value!r}")
    policies = [
        item if isinstance(item, TopicPolicy) else parse_policy(item, index)
        for index, item in enumerate(value)
    ]
    names = [policy.name for policy in policies]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise DurableConfigError(f"durable topic names must be unique: {duplicates}")
    return tuple(policies)


def policy_table(policy: TopicPolicy) -> dict[str, Any]:
    """The ``[[durable]]`` table that parses back to ``policy`` (how the
    supervisor hands the policies to its workers, as JSON)."""
    config = policy.log
    table: dict[str, Any] = {
        "name": policy.name,
        "pattern": policy.pattern.decode(),
        "partitions": policy.partitions,
        "segment_bytes": config.segment_bytes,
        "fsync": config.fsync.value,
        "fsync_interval": config.fsync_interval_seconds,
        "acks": policy.acks,
    }
    if config.retention_seconds is not None:
        table["retention_seconds"] = config.retention_seconds
    if config.retention_bytes is not None:
        table["retention_bytes"] = config.retention_bytes
    roll = config.roll
    if roll is not None and roll.interval_ns is not None:
        table["roll"] = roll.interval_ns / NS_PER_SECOND
    elif roll is not None and roll.daily_at_ns is not None:
        minutes = roll.daily_at_ns // (60 * NS_PER_SECOND)
        offset = roll.utc_offset_ns // (60 * NS_PER_SECOND)
        sign = "-" if offset < 0 else "+"
        table["roll"] = (
            f"daily {minutes // 60:02d}:{minutes % 60:02d} "
            f"{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
        )
    return table
