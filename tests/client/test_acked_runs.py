"""``AckedRuns``: the columns of the broker's answers read as the list of
``AckedRun`` that building one per run eagerly would have given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.client.acked_runs import AckedRuns
from broky.client.durable import AckedRun
from broky.protocol.frames import PublishAck

_run = st.tuples(
    st.integers(0, 5),  # run index in the frame (past the keys: "")
    st.integers(0, 7),
    st.integers(0, 2**40),
    st.integers(0, 1000),
)
_answer = st.tuples(
    st.lists(st.sampled_from(["a", "b", "orders.k1"]), max_size=4), st.lists(_run, max_size=6)
)


def build(answers: list[tuple[list[str], list[tuple[int, int, int, int]]]]) -> AckedRuns:
    return AckedRuns(
        [
            (
                keys,
                PublishAck(
                    1,
                    sequence,
                    tuple(r[0] for r in runs),
                    tuple(r[1] for r in runs),
                    tuple(r[2] for r in runs),
                    tuple(r[2] + r[3] for r in runs),
                ),
            )
            for sequence, (keys, runs) in enumerate(answers, 1)
        ]
    )


def eager(answers: list[tuple[list[str], list[tuple[int, int, int, int]]]]) -> list[AckedRun]:
    """What the client built before: one AckedRun per run as each answer came."""
    return [
        AckedRun(keys[run] if run < len(keys) else "", partition, first, first + extra)
        for keys, runs in answers
        for run, partition, first, extra in runs
    ]


@given(st.lists(_answer, max_size=5), st.data())
def test_acked_runs_read_as_the_eager_list(
    answers: list[tuple[list[str], list[tuple[int, int, int, int]]]], data: st.DataObject
) -> None:
    lazy, expected = build(answers), eager(answers)
    assert lazy == expected
    assert list(lazy) == expected
    assert len(lazy) == len(expected)
    assert lazy.messages == sum(run.last_offset - run.first_offset + 1 for run in expected)
    if expected:
        index = data.draw(st.integers(-len(expected), len(expected) - 1))
        assert lazy[index] == expected[index]
        assert lazy[1:-1] == expected[1:-1]
    with pytest.raises(IndexError):
        lazy[len(expected)]
    assert (lazy == [*expected, AckedRun("x", 0, 0, 0)]) is False
    more = AckedRun("x", 0, 0, 0)
    assert lazy + lazy == expected + expected
    assert lazy + [more] == [*expected, more]  # noqa: RUF005 (the operator is under test)
    assert [more] + lazy == [more, *expected]  # noqa: RUF005


def test_nothing_acked_is_an_empty_sequence() -> None:
    assert AckedRuns() == []
    assert len(AckedRuns()) == 0
    assert AckedRuns().messages == 0
    assert repr(AckedRuns()) == "AckedRuns([])"
