"""The node's lease as relayed to its workers: lines, the worker's copy, the pipe."""

from __future__ import annotations

import json
import time

import pytest

from broky.cluster.lease_relay import LeaseState, RelayedLease
from broky.mesh.pipe import SupervisorPipe
from broky.replication.worker_member import owner_address, worker_listen


def test_a_lease_line_round_trips_and_garbage_is_a_value_error() -> None:
    state = LeaseState(7, 1234.5)
    assert LeaseState.from_json(json.loads(state.line())["lease"]) == state
    with pytest.raises(ValueError, match="not a lease line"):
        LeaseState.from_json({"epoch": 7})


def test_a_worker_trusts_the_lease_only_in_a_life_and_before_its_deadline() -> None:
    lease = RelayedLease()
    assert not lease.lease_valid()  # nothing relayed yet
    lease.update(LeaseState(3, time.monotonic() + 10))
    assert lease.lease_valid()
    assert lease.node_epoch() == 3
    lease.update(LeaseState(3, time.monotonic() - 0.001))  # no renewal in a TTL
    assert not lease.lease_valid()
    lease.update(LeaseState(0, time.monotonic() + 10))  # between lives
    assert not lease.lease_valid()


def test_the_supervisor_pipe_hands_lease_lines_to_the_worker_s_copy() -> None:
    lease = RelayedLease()
    pipe = SupervisorPipe(fd=-1, lease=lease)
    state = LeaseState(5, time.monotonic() + 1)
    pipe._line(None, state.line().rstrip())  # type: ignore[arg-type]  # a lease line needs no broker
    assert lease.state == state


def test_each_worker_has_its_port_and_followers_find_the_owner() -> None:
    assert worker_listen("10.0.0.1:7723", 1) == "10.0.0.1:7724"
    # The owner index comes from the leader's registered worker count.
    assert owner_address("h:7000", "orders", 0, 1) == "h:7000"
    indexes = {int(owner_address("h:7000", "orders", p, 2).rsplit(":", 1)[1]) for p in range(4)}
    assert indexes == {7000, 7001}
