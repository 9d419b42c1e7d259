"""A follower's copy of its leader's subscription state, on a real sqlite
file: stored in one transaction, a resync drops what the leader does not
have, and a new leader reads back exactly what was stored."""

from __future__ import annotations

from pathlib import Path

from broky.replication.wire import StateEntry, StateUpdate
from broky.storage.state import StateStore
from broky.subscriptions.commits import GroupCommitter
from broky.subscriptions.image import encode_image
from broky.subscriptions.tracker import SubscriptionImage


async def test_stored_rows_read_back_and_a_resync_drops_the_rest(tmp_path: Path) -> None:
    committer = GroupCommitter(StateStore.open(str(tmp_path / "state.sqlite")))
    old = encode_image(SubscriptionImage(3))
    billing = encode_image(SubscriptionImage(10, ((12, 14),), 20, ((15, 2),)))
    await committer.store_rows(
        StateUpdate(
            1, 2, None, (StateEntry(1, "stale", "{}", old), StateEntry(2, "billing", "{}", old))
        ),
        "orders",
        0,
    )
    await committer.store_rows(
        StateUpdate(2, 1, ("billing",), (StateEntry(1, "billing", '{"v": 2}', billing),)),
        "orders",
        0,
    )
    images, definitions = await committer.reload()
    committer.close()
    assert definitions == {"billing": '{"v": 2}'}
    assert images == {("billing", "orders", 0): SubscriptionImage(10, ((12, 14),), 20, ((15, 2),))}
