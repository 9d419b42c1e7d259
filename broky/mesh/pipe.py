"""A worker's stdin: the supervisor's spec, then reloads and the node's lease.

One JSON object per line: the spec first (config and plan), then either a
reload (``{"config": ...}``, broky.reload) or the node's lease
(``{"lease": ...}``, broky.cluster.lease_relay). The pipe stays open while
the supervisor lives, so its end is how a worker learns that the
supervisor died (even by SIGKILL).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import attrs
import trio

from broky.cluster.lease_relay import LINE_KEY as LEASE_LINE
from broky.cluster.lease_relay import LeaseState, RelayedLease
from broky.config import Config, ConfigError
from broky.server import Broker

log = logging.getLogger("broky.workers")


@attrs.define
class SupervisorPipe:
    """A worker's stdin: the supervisor's spec, then its reloads, one JSON
    line each. It stays open while the supervisor lives, so its end is how a
    worker learns that the supervisor died (even by SIGKILL): an orphaned
    worker would keep serving the port with a configuration nobody manages.
    """

    fd: int
    #: Bytes read past the spec's line (the start of a reload).
    pending: bytes = b""
    #: The node's lease as the supervisor relays it (replicating workers).
    lease: RelayedLease | None = None

    @classmethod
    def read_spec(cls, fd: int) -> tuple[dict[str, Any], SupervisorPipe]:
        """The spec (the first line), read without buffering beyond it in
        Python's stdin, and the pipe to follow afterwards."""
        data = b""
        while b"\n" not in data:
            chunk = os.read(fd, 65536)
            if not chunk:
                break  # the spec without a newline: nothing follows
            data += chunk
        line, _, rest = data.partition(b"\n")
        return json.loads(line), cls(fd, rest)

    async def follow(self, broker: Broker, worker_scope: trio.CancelScope) -> None:
        """Apply each reload line; stop the worker when the pipe closes."""
        buffer = self.pending
        async with trio.lowlevel.FdStream(os.dup(self.fd)) as stream:
            while True:
                line, newline, rest = buffer.partition(b"\n")
                if newline:
                    buffer = rest
                    self._line(broker, line)
                    continue
                data = await stream.receive_some()
                if not data:
                    log.warning("the supervisor is gone: stopping")
                    worker_scope.cancel()
                    return
                buffer += data

    def _line(self, broker: Broker, line: bytes) -> None:
        """A reload, or the node's lease (broky.cluster.lease_relay)."""
        message = json.loads(line)
        if LEASE_LINE in message:
            if self.lease is not None:
                self.lease.update(LeaseState.from_json(message[LEASE_LINE]))
            return
        try:
            broker.reload(Config.from_mapping(message["config"]))
        except ConfigError as exc:  # the supervisor checked it: not expected
            log.error("configuration reload refused: %s", exc)
