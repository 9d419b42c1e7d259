"""Types of the compiled twin of ``broky.storage.topics.message_partitions_pure``."""

from broky.protocol.frames import Buffer

def message_partitions(
    messages: Buffer, sizes: Buffer, partitions: int, default: int
) -> list[int]: ...
