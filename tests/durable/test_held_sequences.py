"""A partition holds a producer's later runs back after refusing one retriably.

Sequences jump at a partition (a producer numbers its messages over all
partitions), so it cannot see a gap. A pipelined producer (broky.client.cluster)
has batch k+1 in flight behind batch k; if k is refused retriably (NotLeader,
NotEnoughReplicas) and k+1 stored, k's retry is out of order. The window
therefore remembers the first sequence it refused and answers later runs of
that producer ``Held`` until a run that reaches it is stored (a run below
it, stored elsewhere and replicated here, leaves the gap open).

The property test plays a pipelined producer against one partition: rounds
are refused at random, the producer resends from the refused batch oldest
first once its in-flight ones are answered, and the log must hold every
batch once, in order, with no run ever out of order.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broky.durable.producers import Duplicate, Held, OutOfOrder, ProducerWindow

PRODUCER = 7


def test_a_refused_sequence_holds_later_runs_back_until_it_is_stored() -> None:
    window = ProducerWindow()
    assert window.admit(PRODUCER, 1, 2, 0) is None
    window.refused(PRODUCER, [10])
    assert isinstance(window.check(PRODUCER, 15, 1), Held)
    assert isinstance(window.admit(PRODUCER, 15, 1, 2), Held)
    assert not window.admit_all(PRODUCER, [15], [1], 2)
    assert window.check(PRODUCER, 1, 2) == Duplicate(0)  # retries still answer
    assert window.check(3, 15, 1) is None  # other producers are not held
    assert window.admit(PRODUCER, 10, 3, 2) is None  # the resend: stored, hold ends
    assert window.admit(PRODUCER, 15, 1, 5) is None


def test_a_replicated_run_below_the_refused_sequence_keeps_the_hold() -> None:
    """Sequence 1243 was refused here; an earlier batch (1240-1242) stored
    by another leader reaches this node as a follower's replicated run:
    1243 is still missing, so 1244 must still wait for it (without the hold
    a later leadership here could store 1244 first and refuse 1243's retry
    as out of order, seen once under load in the rebalance test)."""
    window = ProducerWindow()
    window.refused(PRODUCER, [1243])
    window.record(PRODUCER, 1240, 3, 0)
    assert isinstance(window.check(PRODUCER, 1244, 3), Held)
    window.record(PRODUCER, 1243, 1, 3)  # the refused run, stored: the gap closes
    assert window.check(PRODUCER, 1244, 3) is None


def test_refusing_stored_runs_again_holds_nothing() -> None:
    window = ProducerWindow()
    window.admit(PRODUCER, 1, 2, 0)
    window.refused(PRODUCER, [1])  # a retry of a stored run, refused with its round
    assert window.check(PRODUCER, 5, 1) is None
    window.refused(PRODUCER, [1, 3])  # the first run not stored yet counts
    assert isinstance(window.check(PRODUCER, 5, 1), Held)
    assert window.check(PRODUCER, 3, 1) is None


def test_the_hold_survives_a_rebuilt_window_unless_the_log_moved_past_it() -> None:
    old = ProducerWindow()
    old.refused(PRODUCER, [10])
    old.refused(8, [4])
    rebuilt = ProducerWindow()
    rebuilt.record(8, 4, 2, 0)  # the old leader stored producer 8's run: no gap
    rebuilt.keep_refused(old)
    assert isinstance(rebuilt.check(PRODUCER, 11, 1), Held)
    assert rebuilt.check(8, 6, 1) is None


def test_a_replicated_run_past_the_hold_ends_it() -> None:
    window = ProducerWindow()
    window.refused(PRODUCER, [10])
    window.record(PRODUCER, 20, 1, 0)  # as a follower: the leader stored it
    assert window.check(PRODUCER, 21, 1) is None


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.integers(1, 5), min_size=1, max_size=25),
    in_flight=st.integers(1, 5),
    choices=st.data(),
)
def test_a_pipelined_producer_resending_oldest_first_is_stored_once_in_order(
    gaps: list[int], in_flight: int, choices: st.DataObject
) -> None:
    # Batches of one message at jumping sequences (others went elsewhere).
    sequences = []
    sequence = 1
    for gap in gaps:
        sequences.append(sequence)
        sequence += gap
    window = ProducerWindow()
    log: list[int] = []
    unacked = list(sequences)  # in sequence order
    wire: list[int] = []  # sent, not answered, in order
    next_new = 0  # index of the next batch never sent
    resend: list[int] = []  # refused, to resend oldest first
    rewinding = False
    for _ in range(2000):
        if not unacked:
            break
        can_send = not rewinding and len(wire) < in_flight
        if (
            can_send
            and (resend or next_new < len(sequences))
            and (not wire or choices.draw(st.booleans()))
        ):
            if resend:
                wire.append(resend.pop(0))
            else:
                wire.append(sequences[next_new])
                next_new += 1
            continue
        if not wire:
            rewinding = False
            continue
        sent = wire.pop(0)
        if choices.draw(st.integers(0, 3)) == 0:  # the round is refused retriably
            window.refused(PRODUCER, [sent])
            verdict: Duplicate | OutOfOrder | Held | None = Held("refused")
        else:
            verdict = window.admit(PRODUCER, sent, 1, len(log))
            if verdict is None:
                log.append(sent)
        assert not isinstance(verdict, OutOfOrder), (sent, log)
        if isinstance(verdict, Held):
            resend.append(sent)
            resend.sort()
            rewinding = True  # resend once every batch in flight is answered
        else:
            unacked.remove(sent)
        if not wire:
            rewinding = False
    assert log == sorted(set(log)), log
    assert log == [s for s in sequences if s in log]
    if not unacked:
        assert log == sequences
