"""StateJournal: a follower that fetches what it lacks ends with the
leader's latest row of every subscription, whatever the commits, the cuts
and the leaderships in between."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broky.replication.wire import StateUpdate
from broky.subscriptions.journal import StateJournal

names = st.sampled_from(["billing", "audit", "mail", "jobs"])
#: One step: commit rows, a follower fetch cut at some bytes, or a new leadership.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("commit"), st.lists(st.tuples(names, st.binary(max_size=6)), max_size=4)),
        st.tuples(st.just("fetch"), st.integers(1, 40)),
        st.tuples(st.just("delete"), st.lists(names, max_size=2)),
        st.tuples(st.just("new_leader"), st.just(0)),
    ),
    max_size=30,
)


class _Follower:
    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, bytes]] = {}
        self.epoch = -1
        self.version = -1

    def store(self, update: StateUpdate) -> None:
        if update.names is not None:
            self.rows = {name: row for name, row in self.rows.items() if name in update.names}
        for entry in update.entries:
            if entry.deleted:
                self.rows.pop(entry.subscription, None)
            else:
                self.rows[entry.subscription] = (entry.definition, entry.image)
        self.epoch, self.version = update.epoch, update.version


@settings(max_examples=300, deadline=None)
@given(steps)
def test_a_follower_converges_to_the_leaders_latest_rows(script: list[tuple[str, object]]) -> None:
    latest: dict[str, tuple[str, bytes]] = {}
    journal = StateJournal(1)
    follower = _Follower()
    for kind, argument in script:
        if kind == "commit":
            assert isinstance(argument, list)
            rows = [(name, f"def-{name}", image) for name, image in argument]
            journal.committed(rows)
            latest.update({name: (definition, image) for name, definition, image in rows})
        elif kind == "delete":
            assert isinstance(argument, list)
            journal.deleted(argument)
            for name in argument:
                latest.pop(name, None)
        elif kind == "fetch":
            assert isinstance(argument, int)
            update = journal.since(follower.epoch, follower.version, argument)
            if update is not None:
                follower.store(update)
        else:
            # The follower leads now, from what it stored: the leader's
            # unfetched rows are lost (the documented window).
            journal = StateJournal(
                journal.epoch + 1,
                [(name, definition, image) for name, (definition, image) in follower.rows.items()],
            )
            latest = dict(follower.rows)
            follower = _Follower()
    for _ in range(len(latest) + 6):
        update = journal.since(follower.epoch, follower.version, 1)
        if update is None:
            break
        follower.store(update)
    assert journal.since(follower.epoch, follower.version) is None
    assert follower.rows == latest


def test_a_follower_of_another_leadership_is_resynced_and_drops_the_rest() -> None:
    journal = StateJournal(4, [("billing", "d", b"1")])
    update = journal.since(3, 17)
    assert update is not None
    assert update.names == ("billing",)
    assert [(e.subscription, e.image) for e in update.entries] == [("billing", b"1")]
    assert journal.since(4, update.version) is None
    journal.committed([("audit", "d", b"2"), ("billing", "d", b"3")])
    update = journal.since(4, 1)
    assert update is not None
    assert update.names is None
    assert [(e.version, e.subscription, e.image) for e in update.entries] == [
        (2, "audit", b"2"),
        (3, "billing", b"3"),
    ]
