"""SIGTERM unwinds a benchmark like Ctrl-C, so its children are stopped.

Benchmarks start etcd, broker nodes, nats-server or redis and stop them in
``finally`` blocks (or context-manager exits). Python's default SIGTERM
action ends the process at once without running those, which leaves the
children running after ``timeout``, CI or a supervisor stops the
benchmark. Every benchmark's ``main()`` calls ``stop_children_on_signals()``
first.

SIGTERM is handed to whatever handles SIGINT at that moment: outside
``trio.run`` that is Python's own handler (KeyboardInterrupt at once);
inside, it is trio's, which raises KeyboardInterrupt in the main task at a
safe point, never inside trio's own bookkeeping, so async cleanups run too.
"""

from __future__ import annotations

import signal
from types import FrameType


def stop_children_on_signals() -> None:
    """Make SIGTERM and SIGINT raise KeyboardInterrupt. Call from the main
    thread before starting any child.

    SIGINT is reset to Python's handler as well: a shell starts background
    jobs with SIGINT ignored, and trio only takes SIGINT over (the KI
    delivery SIGTERM relies on) when Python's handler is the one installed.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _as_interrupt)


def _as_interrupt(signum: int, frame: FrameType | None) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):  # SIGINT was set to ignored after us: still unwind
        raise KeyboardInterrupt
    # trio's handler may defer the interrupt to a checkpoint and return.
    handler(signal.SIGINT, frame)
