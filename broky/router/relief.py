"""Waiting out the pressure: the one trio-facing piece of broky.router.pressure.

A reader (a client connection's, or a router link's) calls
``yield_to_subscribers`` after routing a batch while some outbox is under
pressure: it pauses until the pressure is relieved or the outlet's write
counts as slow, so that the writers of subscribers that drain get the loop
and TCP slows the reader's peer meanwhile.
"""

from __future__ import annotations

import trio

from broky.router.pressure import Pressure


async def yield_to_subscribers(pressure: Pressure, local_links: bool = True) -> None:
    """Pause while an outlet under ``pressure`` drains (see the module
    docstring; ``local_links`` as in Pressure.wait_seconds)."""
    while (wait := pressure.wait_seconds(trio.current_time(), local_links)) is not None:
        relieved = trio.Event()
        pressure.on_relief(relieved.set)
        with trio.move_on_after(wait):
            await relieved.wait()
