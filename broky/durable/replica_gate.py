"""What a replicated partition's owner asks of its replication role.

``PartitionOwner`` (broky.durable.owner) stores publishes; a replicated
partition's owner also asks its role (broky.replication.gate's
``PartitionReplica``) whether it may take them and when what it stored may
be acked and read. The owner knows only this Protocol, so the durable
package does not import the replication one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from broky.durable.producers import Identity
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Run


class ReplicaGate(Protocol):
    """What a replicated partition's owner asks its replication role
    (broky.replication.gate): whether it may take publishes, and when the
    ones it stored may be acked and shown to subscribers."""

    #: Offsets below this may be read (the high watermark).
    high_watermark: int

    def refusal(self) -> tuple[ErrorCode, str] | None:
        """Why this node may not store a publish now (None: it may)."""

    def written(
        self,
        offset: int,
        runs: Sequence[Run],
        stamps: Sequence[int],
        producers: Sequence[Identity] | None,
    ) -> None:
        """``runs`` were written from ``offset`` and are being fsynced: their
        replication may start (queued to the trio thread by the round)."""

    def hold(
        self,
        offset: int,
        runs: Sequence[Run],
        stamps: Sequence[int],
        deliver: Callable[[], None],
        fail: Callable[[ErrorCode, str], None],
        producers: Sequence[Identity] | None = None,
    ) -> None:
        """``runs`` (stamped ``stamps``, published by ``producers``: each
        run's idempotent producer and first sequence, None: no idempotent
        run) were stored from ``offset`` and fsynced: call ``deliver`` once
        the high watermark passes them, or ``fail`` if that cannot be
        promised."""
