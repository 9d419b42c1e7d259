from collections.abc import Callable, Sequence

from broky.protocol.frames import Frame, Received

def forwardable(
    views: Sequence[memoryview], limit: int, decode: Callable[[memoryview], Frame]
) -> list[Received]: ...
def walk(
    view: memoryview, max_frame_bytes: int, limit: int, decode: Callable[[memoryview], Frame]
) -> tuple[list[Received], int]: ...
