"""``PendingWindow``: an ordered tracker's pending deliveries indexed by
offset answer every mapping question as the dict they replace does, and
the compiled ack pass (``_passes.take_acked``) takes from one as the pure
one does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.subscriptions import ack_pass
from broky.subscriptions.pending_window import WINDOW_CUT, PendingWindow

_OFFSET = st.integers(0, 60)
#: An operation on both the window and its dict model: (name, offset, value).
_OPERATION = st.tuples(
    st.sampled_from(["set", "put_all", "pop", "pop_default", "del", "get", "contains", "trim"]),
    _OFFSET,
    st.integers(0, 3),
)


def _window(base: int, items: dict[int, object]) -> PendingWindow[object]:
    window: PendingWindow[object] = PendingWindow(base)
    for offset, value in sorted(items.items()):
        window[offset] = value
    return window


@given(st.integers(0, 30), st.lists(_OPERATION, max_size=60))
def test_the_window_answers_as_a_dict(base: int, operations: list[tuple[str, int, int]]) -> None:
    """Any sequence of stores (one at a time or a group), pops, deletes and
    lookups (offsets below the base included: the window grows down to
    them) leaves the window and a
    dict holding the same items, and each answer is the dict's; a trim
    under the lowest pending offset changes no answer."""
    values = [object() for _ in range(4)]
    window: PendingWindow[object] = PendingWindow(base)
    model: dict[int, object] = {}
    for name, offset, index in operations:
        if name == "set":
            window[offset] = model[offset] = values[index]
        elif name == "put_all":
            # A group: ``offset`` and the next few, every other one.
            group = list(range(offset, offset + 2 * index + 1, 2))
            window.put_all(group, values[index])
            model.update(dict.fromkeys(group, values[index]))
        elif name == "pop":
            if offset in model:
                assert window.pop(offset) is model.pop(offset)
            else:
                with pytest.raises(KeyError):
                    window.pop(offset)
        elif name == "pop_default":
            assert window.pop(offset, None) is model.pop(offset, None)
        elif name == "del":
            if offset in model:
                del window[offset]
                del model[offset]
            else:
                with pytest.raises(KeyError):
                    del window[offset]
        elif name == "get":
            assert window.get(offset) is model.get(offset)
            assert window.get(offset, values[0]) is model.get(offset, values[0])
        elif name == "contains":
            assert (offset in window) == (offset in model)
        else:
            window.trim(min(model, default=offset))
        assert len(window) == len(model)
        assert list(window) == sorted(model)
        assert window == model
        assert all(window[key] is value for key, value in model.items())


def test_the_window_cuts_its_front_in_one_slice_once_it_is_long() -> None:
    """Under ``WINDOW_CUT`` offsets under the cursor stay (a cut moves the
    rest of the list); past it they go at once; a window emptied by its
    acks is cut whole for free."""
    window: PendingWindow[str] = PendingWindow(0)
    for offset in range(WINDOW_CUT + 10):
        window[offset] = "held"
    for offset in range(WINDOW_CUT + 5):
        del window[offset]
    window.trim(WINDOW_CUT - 1)
    assert (window.base, len(window.entries)) == (0, WINDOW_CUT + 10)
    window.trim(WINDOW_CUT + 5)
    assert (window.base, len(window.entries)) == (WINDOW_CUT + 5, 5)
    assert sorted(window) == list(range(WINDOW_CUT + 5, WINDOW_CUT + 10))
    for offset in list(window):
        del window[offset]
    window.trim(WINDOW_CUT + 10)
    assert (window.base, window.entries) == (WINDOW_CUT + 10, [])


def test_a_trim_over_a_pending_delivery_is_refused() -> None:
    """The cursor passes acked offsets only: a delivery still pending under
    it is a broken invariant, never silently dropped."""
    window: PendingWindow[str] = PendingWindow(0)
    window[3] = "held"
    with pytest.raises(RuntimeError):
        window.trim(5)
    assert window == {3: "held"}


def test_none_is_no_delivery() -> None:
    window: PendingWindow[object] = PendingWindow(0)
    with pytest.raises(TypeError):
        window[0] = None


@given(
    st.integers(0, 20),
    st.dictionaries(st.integers(20, 80), st.integers(0, 2)),
    st.dictionaries(st.integers(0, 80), st.integers(1, 3)),
    st.lists(st.integers(0, 90), max_size=80),
)
def test_take_acked_takes_from_a_window_as_from_a_dict(
    base: int, holders: dict[int, int], counts: dict[int, int], offsets: list[int]
) -> None:
    """Pure and compiled, on a window (offsets below its base and past its
    end among those acked): the same answer as on the dict, and the same
    items left."""
    deliveries = [object() for _ in range(3)]
    pending = {offset: deliveries[index] for offset, index in holders.items()}
    expected_counts = dict(counts)
    expected_pending = dict(pending)
    expected = ack_pass.take_acked_pure(expected_counts, expected_pending, {}, list(offsets))
    takes = [ack_pass.take_acked_pure, ack_pass.take_acked_compiled]
    for take in [take for take in takes if take is not None]:
        left_counts, window = dict(counts), _window(base, pending)
        assert take(left_counts, window, {}, iter(offsets)) == expected
        assert left_counts == expected_counts
        assert dict(window.items()) == expected_pending


@given(
    st.integers(0, 20),
    st.lists(st.integers(0, 3), max_size=60),
    st.sets(st.integers(0, 90)),
    st.integers(0, 3),
    st.integers(0, 90),
    st.booleans(),
)
def test_held_after_finds_the_later_pending_offsets_of_a_slot(
    base: int, window: list[int], pending: set[int], slot: int, offset: int, windowed: bool
) -> None:
    """Pure and compiled, over a dict or a window of the pending offsets
    (some outside the slot window): the offsets past ``offset`` whose
    slot is ``slot`` and that are pending, ascending."""
    expected = [
        base + at
        for at, given in enumerate(window)
        if given == slot and base + at > offset and base + at in pending
    ]
    held: dict[int, object] = dict.fromkeys(pending, "held")
    container = _window(min(pending, default=0), held) if windowed else held
    finds = [ack_pass.held_after_pure, ack_pass.held_after_compiled]
    for find in [find for find in finds if find is not None]:
        assert find(list(window), base, slot, offset, container) == expected
