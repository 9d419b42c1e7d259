"""The keys of the ``$SYS`` topics, apart from what publishes them.

Why its own module: the command-line tools that read these topics
(``broky subs``, ``broky top``) need the names only, and
``broky.observability.system`` brings the broker's metrics and router with
it (prometheus_client among them: ~70 ms of every ``broky`` command's
start-up).
"""

from __future__ import annotations

from typing import Final

#: Key of the periodic metrics snapshot.
METRICS_KEY: Final = "$SYS.metrics"
#: Prefix of advisory keys: ``$SYS.events.<kind>``.
EVENTS_PREFIX: Final = "$SYS.events."
