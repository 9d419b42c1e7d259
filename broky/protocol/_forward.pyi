from collections.abc import Callable

from broky.protocol.frames import Frame, Received

def walk(
    view: memoryview,
    max_frame_bytes: int,
    limit: int,
    decode: Callable[[memoryview], Frame],
    deliveries: bool = False,
) -> tuple[list[Received], int]: ...
