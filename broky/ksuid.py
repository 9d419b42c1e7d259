"""KSUIDs: 20-byte, time-ordered, globally unique message ids.

A KSUID is a 4-byte big-endian timestamp (seconds since 2014-05-13, the KSUID
epoch) followed by 16 random bytes; sorting KSUIDs as bytes sorts them by
creation second. Pass one as ``publish(..., uid=new_ksuid())``.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Final

#: Seconds between the Unix epoch and the KSUID epoch (2014-05-13T16:53:20Z).
KSUID_EPOCH: Final = 1_400_000_000
_TIMESTAMP = struct.Struct(">I")


def new_ksuid(now: float | None = None) -> bytes:
    """A new KSUID for the current time (or ``now``, Unix seconds)."""
    seconds = int(time.time() if now is None else now) - KSUID_EPOCH
    return _TIMESTAMP.pack(seconds) + os.urandom(16)


def ksuid_time(uid: bytes) -> int:
    """The Unix time (seconds) a KSUID was made at."""
    if len(uid) != 20:
        raise ValueError(f"a KSUID is 20 bytes, got {len(uid)}")
    return int(_TIMESTAMP.unpack_from(uid)[0]) + KSUID_EPOCH
