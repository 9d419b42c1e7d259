"""The cluster-wide settings every node must agree on, stored in etcd.

The first controller writes ``config`` (create-if-absent) from its own
flags; later nodes read it, so a node started with other flags follows the
cluster instead of splitting it.
"""

from __future__ import annotations

import json

import attrs

from broky.cluster.placement import DEFAULT_VBUCKETS

#: Copies of each vbucket: 3 survives losing any one node while still
#: having two in sync.
DEFAULT_REPLICATION_FACTOR = 3


def _positive(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


@attrs.frozen
class ClusterSettings:
    vbuckets: int = attrs.field(default=DEFAULT_VBUCKETS, validator=_positive)
    replication_factor: int = attrs.field(default=DEFAULT_REPLICATION_FACTOR, validator=_positive)

    def to_json(self) -> bytes:
        return json.dumps(attrs.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ClusterSettings:
        """Raises ValueError for anything that is not cluster settings."""
        try:
            fields = json.loads(data)
            return cls(int(fields["vbuckets"]), int(fields["replication_factor"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not cluster settings: {data[:200]!r}") from exc
