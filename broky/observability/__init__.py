"""Observability: Prometheus metrics, the ``$SYS`` topics and the loop-lag probe.

Everything here reads the primitives' ``statistics()`` on the broker's own
trio thread, so every figure is a consistent snapshot and nothing takes a
lock. Modules: ``topics`` (the router's bounded per-key counters),
``metrics`` (the Prometheus collector), ``http`` (``/metrics`` and
``/healthz``), ``system`` (``$SYS.metrics`` snapshots and ``$SYS.events.*``
advisories), ``lag`` (event-loop lag), ``top`` (the ``broky top`` view).
"""
