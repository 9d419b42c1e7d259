from collections.abc import Sequence

def chunk_offsets(chunks: Sequence[bytes], position: int) -> tuple[bytes, int]: ...
def encode_located_chunk(
    key: bytes,
    ts_broker: int,
    sizes: bytes | bytearray | memoryview,
    messages: bytes | bytearray | memoryview,
    partition: int,
    base_offset: int,
) -> bytes: ...

# The same parameters as ``broky.protocol.located.encode_located_runs_pure``.
def encode_located_runs(*arguments: object, run_starts: object = None) -> list[bytes]: ...

# The same parameters as ``broky.protocol.located.encode_located_blob_pure``.
def encode_located_blob(*arguments: object, run_starts: object = None) -> tuple[bytes, bytes]: ...
def length_offsets(lengths: bytes | bytearray | memoryview, position: int) -> tuple[bytes, int]: ...
def run_index(
    counts: Sequence[int], key_lengths: Sequence[int], sizes: bytes | bytearray | memoryview
) -> bytes: ...
def distinct_keys(
    counts: Sequence[int],
    key_lengths: Sequence[int],
    keys: bytes | bytearray | memoryview,
    base_offset: int,
    start: int,
    stop: int,
) -> set[bytes]: ...
def encode_run_chunk_from(key: bytes, sizes: list[int], messages: list[bytes]) -> bytes: ...
def ack_columns(
    run_indexes: list[int], partitions: list[int], firsts: list[int], lasts: list[int]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None: ...
