"""The two-phase deletion's decisions (broky.durable.deletion_round), for
any owners' answers in any order."""

from __future__ import annotations

from random import Random

from hypothesis import given
from hypothesis import strategies as st

from broky.durable.deletion_round import Abort, Commit, DeletionRound
from broky.protocol.constants import ErrorCode
from broky.subscriptions.consumers import Refused
from broky.subscriptions.deletion import Deletion

answers = st.one_of(
    st.builds(Deletion, st.integers(0, 4), st.integers(0, 2)),
    st.sampled_from([ErrorCode.SUBSCRIPTION_REFUSED, ErrorCode.OWNER_UNAVAILABLE]).map(
        lambda code: Refused(code, "no")
    ),
)


@given(st.lists(answers, min_size=1, max_size=5), st.randoms())
def test_commit_only_when_every_owner_prepared_and_abort_only_the_prepared(
    prepares: list[Deletion | Refused], random: Random
) -> None:
    owners = list(range(len(prepares)))
    order = owners[:]
    random.shuffle(order)
    deletion = DeletionRound("s", owners)
    decisions = [deletion.prepared(owner, prepares[owner]) for owner in order]
    assert decisions[:-1] == [None] * (len(order) - 1)
    decision = decisions[-1]
    ready = tuple(o for o in owners if isinstance(prepares[o], Deletion))
    refused = [a for a in prepares if isinstance(a, Refused)]
    if refused:
        assert isinstance(decision, Abort)
        assert decision.owners == ready
        assert decision.refusal.code is refused[0].code
        assert "nothing was deleted" in str(decision.refusal)
    elif not any(a.partitions for a in prepares if isinstance(a, Deletion)):
        assert isinstance(decision, Abort)
        assert decision.refusal.code is ErrorCode.UNKNOWN_SUBSCRIPTION
    else:
        assert decision == Commit(tuple(owners))
    assert deletion.prepared(order[0], prepares[order[0]]) is None  # a repeat is ignored


def test_the_commit_answers_add_up_or_name_the_workers_that_deleted() -> None:
    deletion = DeletionRound("s", [0, 1, 2])
    for owner in (0, 1, 2):
        deletion.prepared(owner, Deletion(2, 1))
    assert deletion.committed(1, Deletion(3, 1)) is None
    assert deletion.committed(7, Deletion(9, 9)) is None  # not an owner
    assert deletion.committed(0, Deletion(4, 0)) is None
    assert deletion.committed(2, Deletion(1, 1)) == Deletion(8, 2)
    partial = DeletionRound("s", [0, 1])
    partial.committed(0, Deletion(4, 0))
    answer = partial.committed(1, Refused(ErrorCode.OWNER_UNAVAILABLE, "worker 1 is down"))
    assert isinstance(answer, Refused)
    assert answer.code is ErrorCode.OWNER_UNAVAILABLE
    assert "worker(s) 0 was deleted" in str(answer)
