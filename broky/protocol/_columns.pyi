from collections.abc import Sequence

def distinct_keys(
    counts: Sequence[int],
    key_lengths: Sequence[int],
    keys: bytes | bytearray | memoryview,
    base_offset: int,
    start: int,
    stop: int,
) -> set[bytes]: ...
def ack_columns(
    run_indexes: list[int], partitions: list[int], firsts: list[int], lasts: list[int]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None: ...
