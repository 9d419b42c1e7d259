"""A Publish frame's runs grouped by partition in one pass: the durable
publish path's usual case.

Why a pass of its own: with a key per message (device ids, order ids) a
frame of a thousand messages is a thousand one-message runs, and choosing
each one's topic, partition and sequence in the store's general loop cost
about a microsecond per message in Python (a ``partition_run`` call, a
``Part.add``, an identity tuple each). ``partition_groups`` does only what
that case needs, as plain lists the store turns into one ``Part`` per
partition (broky.durable.parts), and gives up (None) on anything else,
which then takes the general loop: runs of several topics in one frame.
A run whose messages go to several partitions (each message its own
``key_partition``) is cut where the partition changes, each piece in its
partition's group with the sequence of its first message, as the general
loop's ``partition_run`` cuts it; the compiled twin copies a piece's bytes
(pieces are usually one message: a copy is cheaper than a view, and frees
the frame's buffer).

This is the pure-Python version; ``partition_groups`` is its compiled twin
``broky.storage._partitions`` where that is built. Hypothesis tests hold the
two equal, and the store's answer equal to the general loop's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, TypeAlias

from broky.compiled import compiled_twin
from broky.protocol.frames import Run
from broky.storage.topics import message_partitions, split_run


class _Missing:
    """``partition_groups``' answer when a key is not located yet."""

    def __repr__(self) -> str:
        return "MISSING"


#: Some run's key is not in ``located``: locate it and ask again.
MISSING: Final = _Missing()

#: One partition's runs, their message counts, their indexes in the frame,
#: their first sequences, and the totals of messages and message bytes.
Group: TypeAlias = list[Any]
#: A key's durable topic (a ``TopicPolicy``) and the partition of its
#: messages without a ``key_partition`` (``DurableStore.locate``).
Located: TypeAlias = tuple[Any, int]
#: ``(ephemeral runs, topic, a Group or None per partition)``; None: take
#: the general loop; MISSING: locate the frame's keys first.
Grouped: TypeAlias = "tuple[list[Run], Any, list[Group | None]] | _Missing | None"


def partition_groups_pure(
    runs: Sequence[Run], located: dict[bytes, Located | None], first_sequence: int
) -> Grouped:
    """Group ``runs`` by partition, each run's first sequence counted from
    ``first_sequence`` (over every run of the frame, as
    ``Publish.run_identities`` counts).

    ``located`` maps a key to its ``(topic, partition of the key)`` or None
    (ephemeral: such runs are returned in order). A run of no message is
    skipped (nothing to store). The answer: the ephemeral runs, the durable
    runs' one topic (None if there is none) and a Group or None per
    partition of it; a run whose messages go to several partitions is
    cut into pieces (``split_run``). None when runs belong to several
    topics; MISSING when a key is not in ``located``.
    """
    ephemeral: list[Run] = []
    groups: list[Group | None] = []
    topic: Any = None
    sequence = first_sequence
    for index, run in enumerate(runs):
        if run.key not in located:
            return MISSING
        found = located[run.key]
        count = run.count
        if found is None:
            ephemeral.append(run)
        elif count:
            if topic is None:
                topic = found[0]
                groups = [None] * topic.partitions
            elif found[0] is not topic:
                return None
            targets = message_partitions(run.messages, run.sizes, topic.partitions, found[1])
            partition = targets[0]
            if targets.count(partition) == len(targets):
                pieces = [(partition, run)]
            else:
                pieces = split_run(run, targets)
            piece_sequence = sequence
            for partition, piece in pieces:
                group = groups[partition]
                if group is None:
                    group = groups[partition] = [[], [], [], [], 0, 0]
                group[0].append(piece)
                group[1].append(piece.count)
                group[2].append(index)
                group[3].append(piece_sequence)
                group[4] += piece.count
                group[5] += len(piece.messages)
                piece_sequence += piece.count
        sequence += count
    return ephemeral, topic, groups


PartitionGroups: TypeAlias = Callable[[Sequence[Run], "dict[bytes, Located | None]", int], Grouped]


#: The compiled twin (``broky.storage._partitions``) when it is built.
partition_groups_compiled: PartitionGroups | None = compiled_twin(
    "broky.storage._partitions", "partition_groups"
)
partition_groups: PartitionGroups = partition_groups_compiled or partition_groups_pure
