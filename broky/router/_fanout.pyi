from collections import deque
from collections.abc import Callable, Sequence

from broky.protocol.frames import EncodedRun, Run
from broky.router.fanout import Routes, Topics

def fan_out(
    runs: Sequence[EncodedRun],
    start: int,
    routes: Routes,
    topics: Topics | None,
    passed: list[int],
) -> tuple[int, int, int, int]: ...
def sweep(
    runs: deque[EncodedRun], budget: int, frame_room: int
) -> tuple[list[bytes], int, int] | None: ...
def count_unrouted(
    shift: int,
    sizes_at: int,
    runs: Sequence[Run],
    table: Topics,
    passed: list[int],
    admit: Callable[[bytes, int, int], None],
) -> int: ...
