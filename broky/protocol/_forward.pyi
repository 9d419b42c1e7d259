from collections.abc import Callable

from broky.protocol.frames import Buffer, Frame, Received, Run

def walk(
    view: memoryview,
    max_frame_bytes: int,
    limit: int,
    decode: Callable[[memoryview], Frame],
    deliveries: bool = False,
) -> tuple[list[Received], int]: ...
def read_chunk_runs(view: memoryview, start: int, count: int) -> list[Run | None]: ...
def count_located(view: Buffer, start: int, count: int) -> int: ...
