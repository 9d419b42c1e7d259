"""One broker's observability, started by ``Broker.serve``.

Ties the loop-lag probe, the ``$SYS`` publisher and the Prometheus endpoint
to one worker's statistics. Multi-worker note: each worker process runs its
own ``Broker`` and so its own ``Observability``; ``sample()`` labels figures
with ``worker``, and the collector takes a callable returning any number of
samples, so one endpoint can serve every worker's figures once the workers
report to it (or each worker can serve its own port).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from broky.observability.http import MetricsEndpoint
from broky.observability.lag import LoopLagProbe
from broky.observability.metrics import LoopLag, WorkerSample, broker_registry
from broky.observability.system import Advisory, SystemTopics

if TYPE_CHECKING:
    from broky.config import Config
    from broky.connection.handler import ServerConnection
    from broky.router.router import Router
    from broky.server import BrokerStatistics


class Observability:
    """Metrics endpoint, ``$SYS`` topics and loop-lag probe of one broker."""

    def __init__(
        self,
        config: Config,
        router: Router,
        statistics: Callable[[], BrokerStatistics],
        connections: Callable[[], Iterable[ServerConnection]],
        worker: str = "0",
    ) -> None:
        self._config = config
        self._statistics = statistics
        self.worker = worker
        self.probe = LoopLagProbe()
        self._started = time.monotonic()
        self.system = SystemTopics(
            router,
            self.sample,
            connections,
            metrics_interval=config.system_metrics_interval,
            events=config.system_events,
            loop_lag_max=lambda: self.probe.recent_max,
        )
        self.registry = broker_registry(lambda: [self.sample()])
        self.endpoint = MetricsEndpoint(self.registry, self.health, self.subscriptions)
        #: Where /metrics is served, once ``run`` has started it.
        self.metrics_address: tuple[str, int] | None = None

    def sample(self) -> WorkerSample:
        """This worker's figures, for the collector and the snapshots."""
        probe = self.probe
        return WorkerSample(
            worker=self.worker,
            broker=self._statistics(),
            loop_lag=LoopLag(tuple(probe.bucket_counts), probe.samples, probe.total_seconds),
            advisories=dict(self.system.advisories),
        )

    def health(self) -> dict[str, Any]:
        """The ``/healthz`` document."""
        statistics = self._statistics()
        return {
            "status": "ok",
            "worker": self.worker,
            "uptime_seconds": round(time.monotonic() - self._started, 3),
            "connections": statistics.connections_current,
            "loop_lag_recent_max_seconds": round(self.probe.recent_max, 6),
        }

    def subscriptions(self) -> list[dict[str, Any]]:
        """The ``/subscriptions`` document's list: one entry per durable
        subscription this worker serves (docs/protocol.md, "Listing")."""
        return [attrs.asdict(status) for status in self._statistics().subscriptions]

    def connection_closed(self, connection: ServerConnection) -> None:
        """Called by the broker when a connection's task has ended."""
        self.system.connection_closed(connection)

    def config_reloaded(self, outcome: dict[str, Any]) -> None:
        """Called by the broker after a reload: advise what it changed."""
        self.system.advise(Advisory.CONFIG_RELOADED, outcome)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the probe, the publisher and (if configured) the endpoint until cancelled.

        Reports started once the endpoint is bound, so a taken metrics port
        fails ``Broker.serve`` at start-up.
        """
        config = self._config
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.probe.run)
            nursery.start_soon(self.system.run)
            if config.metrics_listen:
                self.metrics_address = await nursery.start(
                    self.endpoint.serve, config.metrics_host, config.metrics_port
                )
            task_status.started()
