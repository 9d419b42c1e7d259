"""The replication checker finds what it must: losses, divergence, duplicates, disorder."""

from __future__ import annotations

from broky.protocol.message import encode_message
from tests.cluster.history import Acked, check, payload


def _log(*entries: tuple[int, int, int]) -> list[tuple[int, bytes, bytes]]:
    return [(offset, b"orders.k", encode_message(payload(c, s))) for offset, c, s in entries]


def test_identical_replicas_with_every_ack_pass() -> None:
    log = _log((0, 1, 0), (1, 1, 1))
    acked = [Acked(1, 0, 0, 0), Acked(1, 1, 0, 1)]
    verdict = check(acked, {"a": {0: log}, "b": {0: list(log)}}, ["a", "b"])
    assert verdict.ok
    assert verdict.acked == 2
    assert verdict.duplicates == 0


def test_a_missing_ack_a_divergent_offset_and_a_duplicate_are_found() -> None:
    acked = [Acked(1, 0, 0, 0), Acked(1, 1, 0, 1)]
    a = _log((0, 1, 0), (1, 1, 1), (2, 1, 1))
    b = _log((0, 1, 0), (1, 2, 9))
    verdict = check(acked, {"a": {0: a}, "b": {0: b}}, ["a", "b"])
    assert len(verdict.lost) == 1
    assert "not on b" in verdict.lost[0]
    assert len(verdict.divergent) == 1
    assert verdict.duplicates == 1
    assert not verdict.ok


def test_acks_out_of_sequence_order_are_found() -> None:
    log = _log((0, 1, 1), (1, 1, 0))
    verdict = check([Acked(1, 0, 0, 1), Acked(1, 1, 0, 0)], {"a": {0: log}}, ["a"])
    assert verdict.out_of_order
    assert not verdict.lost
