"""Every vbucket's state as etcd has it, kept current by a watch.

Nodes read it to learn what they lead and follow; ``broky cluster status``
prints it. The controller re-reads etcd itself before each write (its CAS
needs the revisions), so this view is never the basis of a decision that
etcd would not check again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial

import attrs
import trio

from broky.cluster.etcd import EtcdClient
from broky.cluster.etcd_wire import KeyValue
from broky.cluster.keys import ClusterKeys
from broky.cluster.mirror import ParsedView, PrefixMirror
from broky.cluster.state import StateError, VbucketState

log = logging.getLogger(__name__)


@attrs.frozen
class StoredState:
    """A vbucket's state and the etcd key holding it (``kv.mod_revision`` is
    the compare-and-swap token for the next change)."""

    vbucket: int
    state: VbucketState
    kv: KeyValue


def states_of(keys: ClusterKeys, kvs: Mapping[bytes, KeyValue]) -> dict[int, StoredState]:
    """The readable vbucket states among ``kvs`` (others are logged and skipped)."""
    states = {}
    for key, kv in kvs.items():
        try:
            vbucket = keys.vbucket_of(key)
            states[vbucket] = StoredState(vbucket, VbucketState.from_json(kv.value), kv)
        except (StateError, ValueError) as exc:
            log.warning("ignoring unreadable vbucket entry %r: %s", key, exc)
    return states


class VbucketTable:
    """The ``vb/`` keys, parsed."""

    def __init__(self, client: EtcdClient, keys: ClusterKeys) -> None:
        self.keys = keys
        self._mirror = PrefixMirror(client, keys.vbuckets)
        self._states = ParsedView(self._mirror, partial(states_of, keys))

    @property
    def revision(self) -> int:
        return self._mirror.revision

    def states(self) -> dict[int, StoredState]:
        """Every readable vbucket's state (parsed once per etcd change)."""
        return self._states.current()

    async def changed(self) -> None:
        await self._mirror.changed()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._mirror.run(task_status=task_status)
