"""Types of the compiled twins of ``broky.storage.topics.message_partitions_pure``,
``broky.storage.grouping.partition_groups_pure`` and
``broky.subscriptions.slots.message_slots_pure``."""

from collections.abc import Sequence

from broky.protocol.frames import Buffer, Run
from broky.storage.batch_reading import RecordBatch
from broky.storage.grouping import Grouped, Located

def message_partitions(
    messages: Buffer, sizes: Buffer, partitions: int, default: int
) -> list[int]: ...
def message_slots(batch: RecordBatch, start: int, stop: int) -> list[int]: ...
def partition_groups(
    runs: Sequence[Run], located: dict[bytes, Located | None], first_sequence: int
) -> Grouped: ...
