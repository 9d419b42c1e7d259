"""How one partition log behaves: segment size, roll schedule, retention, fsync.

Pure values, validated on construction. Times are wall-clock nanoseconds
since the Unix epoch (the log's injectable clock), because roll schedules are
stated in UTC and retention in age.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import attrs

from broky.storage.errors import StorageError
from broky.storage.index import DEFAULT_INDEX_INTERVAL_BYTES

NS_PER_SECOND: Final = 1_000_000_000
NS_PER_DAY: Final = 86_400 * NS_PER_SECOND
#: Default segment size. A segment is the unit that retention deletes and
#: that recovery scans after a crash: 128 MiB keeps deletion fine-grained and
#: a crash scan under a second, while a year of 1 MB/s is ~250 files.
DEFAULT_SEGMENT_BYTES: Final = 128 * 1024 * 1024
#: Index entries store file positions as u32 and the log rolls before a
#: segment passes ``segment_bytes`` (by at most one batch), so 1 GiB keeps
#: every position far inside 4 GiB.
MAX_SEGMENT_BYTES: Final = 1024 * 1024 * 1024
#: Smallest segment: tests use tiny segments to exercise rolls; anything
#: smaller than a header is meaningless.
MIN_SEGMENT_BYTES: Final = 64
#: Default window of ``FsyncPolicy.INTERVAL``: at most this much acknowledged
#: data can be lost in a power failure (plus the time until the next append
#: or ``tick``). One second is short enough to state as the promise and long
#: enough that fsync costs nothing measurable; Jepsen's 2025 JetStream
#: analysis lost acknowledged writes to a two-minute default.
DEFAULT_FSYNC_INTERVAL_SECONDS: Final = 1.0


class FsyncPolicy(enum.Enum):
    """When appended data reaches the disk, i.e. what an acknowledgement means.

    - ``ALWAYS``: nothing is acknowledged before an fsync covers it. The
      caller appends any number of batches and then calls ``sync()`` once
      (group commit); ``durable_offset`` moves only on ``sync()``.
    - ``INTERVAL``: the log fsyncs when ``fsync_interval`` has passed since
      the last fsync, checked on each append and ``tick()``. A power failure
      loses at most that window; a process crash loses nothing (the data is
      in the OS page cache after each append).
    - ``NEVER``: fsync only when a segment is sealed or the log closed. A
      power failure can lose everything since then.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@attrs.frozen(kw_only=True)
class RollSchedule:
    """When the active segment is rolled by time (size rolls are separate).

    ``every(seconds)``: a segment is rolled once its first batch is that old.
    ``daily(hour, minute, utc_offset_minutes)``: rolled at that wall time each
    day in the given UTC offset, so files line up with calendar days.
    """

    interval_ns: int | None = None
    daily_at_ns: int | None = None
    utc_offset_ns: int = 0

    @classmethod
    def every(cls, seconds: float) -> RollSchedule:
        if seconds <= 0:
            raise StorageError(f"roll interval must be > 0 seconds, got {seconds}")
        return cls(interval_ns=int(seconds * NS_PER_SECOND))

    @classmethod
    def daily(cls, hour: int = 0, minute: int = 0, utc_offset_minutes: int = 0) -> RollSchedule:
        if not (0 <= hour < 24 and 0 <= minute < 60 and abs(utc_offset_minutes) < 24 * 60):
            raise StorageError(
                f"daily roll needs 0<=hour<24, 0<=minute<60 and |utc offset| < 24 h, "
                f"got {hour}:{minute} at {utc_offset_minutes} min"
            )
        return cls(
            daily_at_ns=(hour * 3600 + minute * 60) * NS_PER_SECOND,
            utc_offset_ns=utc_offset_minutes * 60 * NS_PER_SECOND,
        )

    def deadline(self, first_log_time: int) -> int:
        """When a segment whose first batch came at ``first_log_time`` rolls."""
        if self.interval_ns is not None:
            return first_log_time + self.interval_ns
        assert self.daily_at_ns is not None, "RollSchedule needs every() or daily()"
        local = first_log_time + self.utc_offset_ns - self.daily_at_ns
        next_local = (local // NS_PER_DAY + 1) * NS_PER_DAY
        return next_local + self.daily_at_ns - self.utc_offset_ns


def _positive_or_none(
    instance: object, attribute: attrs.Attribute[Any], value: float | None
) -> None:
    if value is not None and value <= 0:
        raise StorageError(f"{attribute.name} must be > 0 or None, got {value!r}")


def _segment_bytes(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not MIN_SEGMENT_BYTES <= value <= MAX_SEGMENT_BYTES:
        raise StorageError(
            f"segment_bytes must be in [{MIN_SEGMENT_BYTES}, {MAX_SEGMENT_BYTES}], got {value}"
        )


@attrs.frozen(kw_only=True)
class LogConfig:
    """Settings of one partition log. ``None`` retention means keep forever."""

    segment_bytes: int = attrs.field(default=DEFAULT_SEGMENT_BYTES, validator=_segment_bytes)
    roll: RollSchedule | None = None
    retention_seconds: float | None = attrs.field(default=None, validator=_positive_or_none)
    retention_bytes: int | None = attrs.field(default=None, validator=_positive_or_none)
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_seconds: float = attrs.field(
        default=DEFAULT_FSYNC_INTERVAL_SECONDS, validator=_positive_or_none
    )
    index_interval_bytes: int = attrs.field(
        default=DEFAULT_INDEX_INTERVAL_BYTES, validator=_positive_or_none
    )

    @property
    def retention_ns(self) -> int | None:
        if self.retention_seconds is None:
            return None
        return int(self.retention_seconds * NS_PER_SECOND)

    @property
    def fsync_interval_ns(self) -> int:
        return int(self.fsync_interval_seconds * NS_PER_SECOND)
