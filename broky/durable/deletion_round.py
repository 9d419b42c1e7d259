"""The decisions of a two-phase subscription deletion over a node's workers.

Sans-IO: the coordinator (broky.durable.subscription_deletes) feeds each
owner worker's answer in and gets the next step out; it does the sending.

Why two phases: each owner deletes its own partitions' share of a
subscription. Asked at once to delete, one owner could delete while
another refuses (a consumer attached on it meanwhile), leaving the
subscription half deleted. So:

1. *Prepare*: every owner checks that it may delete its share (the pattern
   matches, no consumers unless ``force``) and marks the subscription
   deleting, which refuses new attaches there. Nothing is deleted yet.
2. If every owner prepared, *commit*: each deletes its share (ending forced
   consumers) and drops its mark. If any refused or was down, *abort*: the
   owners that prepared drop their marks; nothing was deleted anywhere, and
   the client gets the refusal.

What is still not atomic: an owner that dies *between* its prepare and its
commit keeps its share (its mark was only in memory). That is the one
partial outcome left; the answer names the workers that did delete, and
deleting again finishes the job (an owner that already deleted answers as
one that never held the subscription).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from broky.protocol.constants import ErrorCode
from broky.subscriptions.consumers import Refused
from broky.subscriptions.deletion import Deletion

Answer = Deletion | Refused


@attrs.frozen
class Commit:
    """Every owner prepared: send each of ``owners`` the commit."""

    owners: tuple[int, ...]


@attrs.frozen
class Abort:
    """Nothing is deleted: send ``owners`` (those that prepared) the abort,
    and the client ``refusal``."""

    owners: tuple[int, ...]
    refusal: Refused


class DeletionRound:
    """One client's deletion: the answers of each phase, and what follows."""

    def __init__(self, name: str, owners: Iterable[int]) -> None:
        self.name = name
        self.owners = frozenset(owners)
        self._prepared: dict[int, Answer] = {}
        self._committed: dict[int, Answer] = {}

    def prepared(self, owner: int, answer: Answer) -> Commit | Abort | None:
        """``owner`` answered the prepare; the decision once all have
        (None until then, and for a repeated answer)."""
        if owner in self._prepared or owner not in self.owners:
            return None
        self._prepared[owner] = answer
        if len(self._prepared) < len(self.owners):
            return None
        ready = tuple(o for o, a in sorted(self._prepared.items()) if isinstance(a, Deletion))
        refusals = [a for _, a in sorted(self._prepared.items()) if isinstance(a, Refused)]
        if refusals:
            first = refusals[0]
            return Abort(ready, Refused(first.code, f"{first} (nothing was deleted)"))
        if not any(isinstance(a, Deletion) and a.partitions for a in self._prepared.values()):
            return Abort(
                ready,
                Refused(
                    ErrorCode.UNKNOWN_SUBSCRIPTION,
                    f"no durable subscription {self.name!r} on this broker; nothing deleted",
                ),
            )
        return Commit(ready)

    def committed(self, owner: int, answer: Answer) -> Answer | None:
        """``owner`` answered the commit; the client's answer once all have."""
        if owner in self._committed or owner not in self.owners:
            return None
        self._committed[owner] = answer
        if len(self._committed) < len(self.owners):
            return None
        done = {o: a for o, a in sorted(self._committed.items()) if isinstance(a, Deletion)}
        refusals = [a for _, a in sorted(self._committed.items()) if isinstance(a, Refused)]
        if refusals:
            deleted_on = sorted(o for o, a in done.items() if a.partitions)
            also = (
                f" (its share on worker(s) {', '.join(map(str, deleted_on))} was deleted: "
                "delete again to finish)"
                if deleted_on
                else ""
            )
            return Refused(refusals[0].code, f"{refusals[0]}{also}")
        return Deletion(
            sum(a.partitions for a in done.values()), sum(a.consumers for a in done.values())
        )
