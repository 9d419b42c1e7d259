"""``broky bench``: a load generator whose numbers mean what they say.

Every scenario reports the publish rate and the delivery rate separately
(a broker that accepts fast and delivers slowly shows it), and next to
them what was published, delivered and lost over the whole run (after the
publishers stop, subscribers drain until nothing more arrives), so a rate
never hides loss; for latency it gives HdrHistogram percentiles of
producer-to-subscriber time. Load generators run in their own processes
(fork), so the bench's own Python does not share a GIL with them; the
broker is either started by the bench (``--workers``) or already running
(``--address``).

Scenarios:
- ``fan-in``: ``--number`` publishers -> the ``--subscribe`` subscribers.
- ``fan-out``: one publisher -> ``--number`` subscribers (or the ``--subscribe`` list).
- ``latency``: one publisher at a fixed rate -> subscribers timing each message
  (raw frames of one message, or with ``--mode client`` the client library).
- ``slow-subscriber``: publishers flat out -> healthy subscribers plus one
  that reads slowly; shows the slow one dropping and the others unaffected.
- ``receive``: raw publishers flat out -> one ``broky.Client`` subscriber
  (per message, or ``--batches``): the client library's receive rate.
"""

from __future__ import annotations

import multiprocessing
import ssl
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from multiprocessing.process import BaseProcess
from typing import Any, Final

import attrs

from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.subscription import Subscription as ClientSubscription
from broky.client.tcp import parse_address
from broky.loadtest import latency, loadgen, natsclient, peers
from broky.loadtest.histogram import LatencyHistogram
from broky.loadtest.load import Load, matching_share
from broky.loadtest.servers import Server, broky_server, cpu_seconds, peer_server

CONTEXT: Final = multiprocessing.get_context("fork")
#: Seconds between throughput samples (the plot's resolution).
SAMPLE_INTERVAL: Final = 0.25
#: Seconds a run waits for deliveries after the last publish, at most.
DRAIN_TIMEOUT: Final = 10.0
#: Seconds without a new delivery after which the drain is over.
DRAIN_QUIET: Final = 0.5


class Unsupported(Exception):
    """This scenario cannot run against this target (the reason says why)."""


@attrs.frozen(kw_only=True)
class BenchOptions:
    """What to run; the command line's flags (see ``broky bench --help``)."""

    scenario: str
    number: int = 0  # 0: the scenario's default
    subscribe: tuple[str, ...] = ()
    size: int = 100
    interval: float | None = None  # pause between messages per publisher; None: flat out
    count: int = 0  # messages per publisher; 0: run for ``duration``
    duration: float = 5.0
    run: int = 500  # messages per run of one key (raw mode)
    frame: int = 0  # messages per Publish frame (raw mode); 0: one run per frame
    keys: int = 1  # keys cycled: bench.data alone, or bench.k0 .. bench.k<keys-1>
    batches: bool = False  # receive: through Subscription.batches()
    warmup: float = 0.0  # seconds excluded from the rates (not from the loss counts)
    mode: str = "raw"  # raw: pre-encoded frames; client: the client library
    workers: int = 1
    address: str | None = None
    #: TLS to the broker at ``address`` (shared with the forked load generators).
    tls: ssl.SSLContext | None = None
    #: Who the load generators connect as (a broker at ``address`` with [[users]]).
    credentials: Credentials = ANONYMOUS

    @property
    def load(self) -> Load:
        """What raw publishers send; one message per frame for latency."""
        if self.scenario == "latency":
            return Load(self.keys, 1, 1, self.size)
        return Load(self.keys, self.run, self.frame or self.run, self.size)

    @property
    def publishers(self) -> int:
        if self.scenario in ("fan-in", "receive"):
            return self.number or (2 if self.scenario == "receive" else 4)
        return 1

    @property
    def patterns(self) -> list[str]:
        if self.subscribe:
            return list(self.subscribe)
        if self.scenario == "fan-out":
            return [self.load.pattern] * (self.number or 8)
        return [self.load.pattern]

    @property
    def rate(self) -> float:
        """Messages/s per publisher (0: flat out)."""
        if self.interval:
            return 1.0 / self.interval
        if self.scenario == "latency":
            return 10_000.0  # a fixed rate is the point of this scenario
        return 0.0


@attrs.define
class _Run:
    """Processes and shared counters of one scenario run."""

    stop: Any = attrs.field(factory=CONTEXT.Event)  # subscribers
    halt: Any = attrs.field(factory=CONTEXT.Event)  # publishers
    sent: list[Any] = attrs.Factory(list)
    received: list[Any] = attrs.Factory(list)
    dropped: list[Any] = attrs.Factory(list)
    subscribers: list[BaseProcess] = attrs.Factory(list)
    publishers: list[BaseProcess] = attrs.Factory(list)

    def counter(self, group: list[Any]) -> Any:
        value = CONTEXT.Value("q", 0, lock=False)
        group.append(value)
        return value

    def total(self, group: list[Any]) -> int:
        return sum(value.value for value in group)

    def start_subscriber(self, target: Callable[..., None], *args: Any) -> None:
        ready = CONTEXT.Event()
        process = CONTEXT.Process(target=target, args=(*args, ready, self.stop), daemon=True)
        process.start()
        self.subscribers.append(process)
        if not ready.wait(15):
            raise RuntimeError("subscribers were not confirmed within 15 s")

    def halt_publishers(self) -> None:
        self.halt.set()
        self._join(self.publishers, 10)

    def finish(self) -> None:
        self.halt.set()
        self.stop.set()
        self._join([*self.publishers, *self.subscribers], 5)

    @staticmethod
    def _join(processes: list[BaseProcess], timeout: float) -> None:
        for process in processes:
            process.join(timeout)
            if process.is_alive():
                process.kill()
                process.join()


def _is_broky(target: str) -> bool:
    """Broky and the pump speak Broky's protocol; the peers their own."""
    return target == "pump" or target.startswith("broky")


@attrs.frozen
class _Plan:
    """Who subscribes and who publishes in one run (callables missing only
    the per-run counters and events)."""

    subscriber: Callable[..., None]
    publisher: Callable[..., None]
    latency: bool = False


def _plan(options: BenchOptions, target: str, address: tuple[str, int]) -> _Plan:
    """The load generators of ``options.scenario`` for ``target``; raises
    Unsupported when there is no fair equivalent for it."""
    patterns, load = options.patterns, options.load
    key = load.key(0)
    broky = _is_broky(target)

    def secured(client: Callable[..., Any]) -> Callable[..., Any]:
        """``client`` connecting as the options say (TLS, credentials)."""
        return partial(client, tls=options.tls, credentials=options.credentials)

    if not broky and any(peers.peer_pattern(target, p) is None for p in patterns):
        raise Unsupported(f"{target} has no equivalent of the patterns {patterns}")
    if options.scenario == "latency":
        if options.mode == "client":
            if target == "nats":
                # The baseline of the client library: nats-py on both ends.
                if not natsclient.available():
                    raise Unsupported("nats-py is not installed (pip install nats-py)")
                return _Plan(
                    partial(natsclient.nats_latency_subscriber, address, patterns),
                    partial(natsclient.nats_latency_publisher, address, key, options.size),
                    latency=True,
                )
            if not target.startswith("broky"):
                raise Unsupported("client mode needs the Broky client library")
            return _Plan(
                partial(secured(latency.client_latency_subscriber), address, patterns),
                partial(secured(latency.client_latency_publisher), address, key, options.size),
                latency=True,
            )
        if broky:
            connect, template, subscribe = secured(latency.raw_latency_ends)(
                address, key, options.size
            )
        else:
            connect, template, subscribe = peers.stamped_ends(target, address, key, options.size)
        return _Plan(
            partial(latency.stamped_subscriber, subscribe),
            partial(latency.stamped_publisher, connect, template),
            latency=True,
        )
    if options.scenario == "receive":
        if not target.startswith("broky"):
            raise Unsupported("receive measures the Broky client library")
        if options.batches and not hasattr(ClientSubscription, "batches"):
            raise Unsupported("Subscription.batches() is not available in this broky")
        return _Plan(
            partial(secured(loadgen.client_receiver), address, patterns, batches=options.batches),
            partial(secured(loadgen.raw_publisher), address, load),
        )
    if not broky:
        if options.mode == "client" or options.scenario == "slow-subscriber":
            raise Unsupported(f"{options.scenario} in {options.mode} mode runs on Broky only")
        return _Plan(
            partial(peers.peer_subscribers, target, address, patterns),
            partial(peers.peer_publisher, target, address, load),
        )
    if options.mode == "client":
        publisher = partial(secured(loadgen.client_publisher), address, key, options.size)
    else:
        publisher = partial(secured(loadgen.raw_publisher), address, load)
    return _Plan(partial(secured(loadgen.raw_subscribers), address, patterns), publisher)


def run_scenario(
    options: BenchOptions,
    target: str,
    server: Server,
    progress: Callable[[float, str], None] = lambda fraction, text: None,
) -> dict[str, Any]:
    """Run ``options.scenario`` against ``target`` ("broky...", "pump" or a
    peer name) on ``server``; returns the result (a JSON-ready dict).
    Raises Unsupported before starting anything if the pair makes no sense."""
    plan = _plan(options, target, server.address)
    patterns, load = options.patterns, options.load
    fanout = sum(matching_share(load, pattern) for pattern in patterns)
    run = _Run()
    limit = options.count
    results: Any = CONTEXT.Queue() if plan.latency else None
    second = results if plan.latency else run.counter(run.dropped)
    run.start_subscriber(plan.subscriber, run.counter(run.received), second)
    if options.scenario == "slow-subscriber":
        slow_received, slow_dropped = CONTEXT.Value("q", 0), CONTEXT.Value("q", 0)
        run.start_subscriber(
            partial(loadgen.slow_subscriber, tls=options.tls, credentials=options.credentials),
            server.address, load.pattern, 16384, 0.05, slow_received, slow_dropped,
        )  # fmt: skip
    for _ in range(options.publishers):
        args = (options.rate, run.counter(run.sent), run.halt, limit)
        run.publishers.append(CONTEXT.Process(target=plan.publisher, args=args, daemon=True))
    try:
        timeline, window = _drive(options, run, server, fanout, progress)
        _drain(run, fanout)
        if plan.latency:
            run.stop.set()
            histogram = LatencyHistogram.decode(results.get(timeout=15))
    finally:
        run.finish()
    published, delivered = run.total(run.sent), run.total(run.received)
    expected = round(published * fanout)
    lost = max(expected - delivered, 0)
    (t0, sent0, got0, cpu0), (t1, sent1, got1, cpu1) = window
    seconds = max(t1 - t0, SAMPLE_INTERVAL)
    server_cpu = cpu1 - cpu0 if server.pid else None
    result: dict[str, Any] = {
        "tool": "broky bench",
        "target": target,
        "scenario": options.scenario,
        "mode": options.mode,
        "publishers": options.publishers,
        "subscribers": len(patterns),
        "payload_bytes": options.size,
        "keys": load.keys,
        "messages_per_run": load.run,
        "messages_per_frame": load.frame,
        "workers": options.workers if target == "broky" and not options.address else None,
        "offered_per_s": round(options.rate * options.publishers) if options.rate else "max",
        "seconds": round(seconds, 3),
        "published_per_s": round((sent1 - sent0) / seconds),
        "delivered_per_s": round((got1 - got0) / seconds),
        "delivered_per_subscriber_per_s": round((got1 - got0) / len(patterns) / seconds),
        "published": published,
        "delivered": delivered,
        "expected": expected,
        "lost": lost,
        "loss_pct": round(100 * lost / expected, 2) if expected else 0.0,
        "lossless": lost == 0,
        "dropped_notified": run.total(run.dropped),
        "broker_dropped": server.broker_dropped(),
        "server_cpu_utilisation": None if server_cpu is None else round(server_cpu / seconds, 2),
        "server_cpu_us_per_message": round(server_cpu * 1e6 / (got1 - got0), 3)
        if server_cpu is not None and got1 > got0
        else None,
    }
    if plan.latency:
        result["latency"] = histogram.summary()
        result["latency_samples"] = histogram.count
        result["_distribution"] = histogram.distribution()
    if options.scenario == "slow-subscriber":
        result["slow_subscriber"] = {
            "received": slow_received.value,
            "dropped_notified": slow_dropped.value,
        }
    result["_timeline"] = [sample[:3] for sample in timeline]
    return result


_Sample = tuple[float, int, int, float]  # seconds, published, delivered, server CPU s


def _drive(
    options: BenchOptions,
    run: _Run,
    server: Server,
    fanout: float,
    progress: Callable[[float, str], None],
) -> tuple[list[_Sample], tuple[_Sample, _Sample]]:
    """Start the publishers and sample until the duration (or ``count``) is
    done; returns the timeline and the measured window's first and last sample."""

    def cpu() -> float:
        return cpu_seconds(server.pid) if server.pid else 0.0

    start = time.perf_counter()
    for process in run.publishers:
        process.start()
    timeline: list[_Sample] = [(0.0, 0, 0, cpu())]
    window_start = timeline[0]
    limit = options.count
    last_progress_at, last_received = start, 0
    # The clock of warmup and duration starts with the first message sent:
    # a publisher first builds its frames (seconds, at 100,000 keys), and
    # that must not eat into the window.
    first_sent_at: float | None = None
    while True:
        time.sleep(SAMPLE_INTERVAL)
        now = time.perf_counter() - start
        sent, received = run.total(run.sent), run.total(run.received)
        timeline.append((now, sent, received, cpu()))
        if first_sent_at is None and (sent or now > PUBLISHER_START_TIMEOUT):
            first_sent_at = now
        now = now - first_sent_at if first_sent_at is not None else 0.0
        if window_start[0] == 0.0 and 0 < options.warmup <= now:
            window_start = timeline[-1]
        if received != last_received:
            last_progress_at, last_received = time.perf_counter(), received
        if limit:
            expected = limit * options.publishers * fanout
            progress(received / expected, f"{received:,}/{expected:,.0f} delivered")
            publishing = any(process.is_alive() for process in run.publishers)
            if received >= expected or (
                not publishing and time.perf_counter() - last_progress_at > DRAIN_TIMEOUT
            ):
                # The window ends at the last delivery, not at the drain timeout.
                end = next(sample for sample in timeline if sample[2] >= received)
                return timeline, (window_start, end)
        else:
            progress(min(now / (options.warmup + options.duration), 1.0), f"{received:,} delivered")
            if now >= options.warmup + options.duration:
                return timeline, (window_start, timeline[-1])


#: Longest a publisher may take to send its first message (building its frames).
PUBLISHER_START_TIMEOUT: Final = 30.0


def _drain(run: _Run, fanout: float) -> None:
    """Stop the publishers, then wait until the subscribers have everything
    or nothing more arrives: what is still missing then is lost."""
    run.halt_publishers()
    deadline = time.monotonic() + DRAIN_TIMEOUT
    last, quiet_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        received = run.total(run.received)
        if received >= run.total(run.sent) * fanout:
            return
        if received != last:
            last, quiet_since = received, time.monotonic()
        elif time.monotonic() - quiet_since > DRAIN_QUIET:
            return
        time.sleep(0.05)


def run_bench(
    options: BenchOptions,
    compare: Sequence[str] = (),
    progress_factory: Callable[[str], AbstractContextManager[Callable[[float, str], None]]]
    | None = None,
) -> list[dict[str, Any]]:
    """Run the scenario on Broky (started here unless ``options.address``),
    then on each peer in ``compare`` that supports it; returns one result
    per target that ran."""

    def progress_for(target: str) -> AbstractContextManager[Callable[[float, str], None]]:
        if progress_factory is None:
            return nullcontext(lambda fraction, text: None)
        return progress_factory(target)

    results = []
    if options.address:
        with progress_for("broky") as progress:
            remote = Server(0, parse_address(options.address))
            results.append(run_scenario(options, "broky", remote, progress))
    else:
        with broky_server(options.workers) as server, progress_for("broky") as progress:
            results.append(run_scenario(options, "broky", server, progress))
    for peer in compare:
        try:
            with peer_server(peer) as server, progress_for(peer) as progress:
                results.append(run_scenario(options, peer, server, progress))
        except Unsupported:
            continue
    return results
