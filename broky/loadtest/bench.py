"""``broky bench``: a load generator whose numbers mean what they say.

Every scenario reports the publish rate and the delivery rate separately
(a broker that accepts fast and delivers slowly shows it), counts drops,
and for latency gives HdrHistogram percentiles of producer-to-subscriber
time. Load generators run in their own processes (fork), so the bench's own
Python does not share a GIL with them; the broker is either started by the
bench (``--workers``) or already running (``--address``).

Scenarios:
- ``fan-in``: ``--number`` publishers -> the ``--subscribe`` subscribers.
- ``fan-out``: one publisher -> ``--number`` subscribers (or the ``--subscribe`` list).
- ``latency``: one publisher at a fixed rate -> subscribers timing each message.
- ``slow-subscriber``: publishers flat out -> healthy subscribers plus one
  that reads slowly; shows the slow one dropping and the others unaffected.
"""

from __future__ import annotations

import multiprocessing
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from multiprocessing.process import BaseProcess
from typing import Any, Final

import attrs

from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.tcp import parse_address
from broky.loadtest import loadgen, peers
from broky.loadtest.histogram import LatencyHistogram

CONTEXT: Final = multiprocessing.get_context("fork")
TICKS: Final = os.sysconf("SC_CLK_TCK")
SCENARIOS: Final = ("fan-in", "fan-out", "latency", "slow-subscriber")
#: Key every publisher publishes on.
BENCH_KEY: Final = "bench.data"
#: Seconds between throughput samples (the plot's resolution).
SAMPLE_INTERVAL: Final = 0.25
#: Seconds a --count run waits for deliveries after the last publish.
DRAIN_TIMEOUT: Final = 10.0


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
    run: int = 500  # messages per pre-encoded batch (raw mode)
    mode: str = "raw"  # raw: pre-encoded frames; client: the client library
    workers: int = 1
    address: str | None = None
    #: TLS to the broker at ``address`` (shared with the forked load generators).
    tls: ssl.SSLContext | None = None
    #: Who the load generators connect as (a broker at ``address`` with [[users]]).
    credentials: Credentials = ANONYMOUS

    @property
    def publishers(self) -> int:
        if self.scenario == "fan-in":
            return self.number or 4
        return 1

    @property
    def patterns(self) -> list[str]:
        if self.subscribe:
            return list(self.subscribe)
        if self.scenario == "fan-out":
            return [BENCH_KEY] * (self.number or 8)
        return [BENCH_KEY]

    @property
    def rate(self) -> float:
        """Messages/s per publisher (0: flat out)."""
        if self.interval:
            return 1.0 / self.interval
        if self.scenario == "latency":
            return 10_000.0  # a fixed rate is the point of this scenario
        return 0.0


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found.extend(int(child) for child in children.read().split())
        except FileNotFoundError:
            continue
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its descendants, live ones
    (a supervisor's workers) and reaped ones, from /proc."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue  # exited between the listing and the read
        total += sum(int(field) for field in fields[11:15]) / TICKS
        pending.extend(_children(current))
    return total


@contextmanager
def server_process(command: list[str]) -> Iterator[tuple[int, tuple[str, int]]]:
    """Start a server that prints "... listening on HOST:PORT"; stop it by PID."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"server did not start: {line!r}")
        host, port = line.rsplit(" ", 1)[1].strip().rsplit(":", 1)
        yield process.pid, (host, int(port))
    finally:
        loadgen.stop_process(process)


def broky_command(workers: int) -> list[str]:
    """``broky serve`` on a free port, with ``--workers`` if this broky has it."""
    command = [sys.executable, "-m", "broky", "serve", "--port", "0", "--log-level", "error"]
    help_text = subprocess.run(
        [*command[:4], "--help"], capture_output=True, text=True, check=False, timeout=30
    ).stdout
    if "--workers" in help_text:
        command += ["--workers", str(workers)]
    elif workers != 1:
        raise SystemExit("broky bench: this broky serve has no --workers; use --workers 1")
    return command


@attrs.define
class _Run:
    """Processes and shared counters of one scenario run."""

    stop: Any = attrs.field(factory=CONTEXT.Event)
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

    def finish(self) -> None:
        self.stop.set()
        for process in (*self.publishers, *self.subscribers):
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()


def run_scenario(
    options: BenchOptions,
    target: str,
    address: tuple[str, int],
    server_pid: int | None,
    progress: Callable[[float, str], None] = lambda fraction, text: None,
) -> dict[str, Any]:
    """Run ``options.scenario`` against ``target`` ("broky" or a peer name)
    at ``address``; returns the result (a JSON-ready dict)."""
    patterns = options.patterns
    run = _Run()
    latency_results: Any = None
    limit = options.count
    per_run = min(options.run, limit) if limit else options.run
    if target == "broky":

        def secured(client: Callable[..., None]) -> Callable[..., None]:
            """``client`` connecting as the options say (TLS, credentials)."""
            return partial(client, tls=options.tls, credentials=options.credentials)

        if options.scenario == "latency":
            latency_results = CONTEXT.Queue()
            run.start_subscriber(
                secured(loadgen.latency_subscriber),
                address,
                patterns,
                run.counter(run.received),
                latency_results,
            )
        else:
            run.start_subscriber(
                secured(loadgen.raw_subscribers),
                address,
                patterns,
                run.counter(run.received),
                run.counter(run.dropped),
            )
        if options.scenario == "slow-subscriber":
            slow_received, slow_dropped = CONTEXT.Value("q", 0), CONTEXT.Value("q", 0)
            run.start_subscriber(
                secured(loadgen.slow_subscriber),
                address, BENCH_KEY, 16384, 0.05, slow_received, slow_dropped,
            )  # fmt: skip
        if options.scenario == "latency":
            publisher: Callable[..., None] = partial(
                secured(loadgen.latency_publisher), address, BENCH_KEY, options.size
            )
        elif options.mode == "client":
            publisher = partial(secured(loadgen.client_publisher), address, BENCH_KEY, options.size)
        else:
            publisher = partial(
                secured(loadgen.raw_publisher), address, BENCH_KEY, options.size, per_run
            )
    else:
        if options.scenario not in ("fan-in", "fan-out"):
            raise ValueError(f"--compare supports fan-in and fan-out, not {options.scenario}")
        run.start_subscriber(
            partial(peers.peer_subscribers, target),
            address,
            patterns,
            run.counter(run.received),
            run.counter(run.dropped),
        )
        publisher = partial(peers.peer_publisher, target, address, BENCH_KEY, options.size, per_run)
    for _ in range(options.publishers):
        args: tuple[Any, ...] = (options.rate, run.counter(run.sent), run.stop)
        if options.mode != "client" or options.scenario == "latency":
            args += (limit,)
        publisher_process: BaseProcess = CONTEXT.Process(target=publisher, args=args, daemon=True)
        run.publishers.append(publisher_process)
    start_cpu = cpu_seconds(server_pid) if server_pid else 0.0
    start = time.perf_counter()
    for process in run.publishers:
        process.start()
    timeline: list[tuple[float, int, int]] = [(0.0, 0, 0)]
    expected = limit * options.publishers * len(patterns) if limit else 0
    last_progress_at, last_received = start, 0
    try:
        while True:
            time.sleep(SAMPLE_INTERVAL)
            now = time.perf_counter() - start
            sent, received = run.total(run.sent), run.total(run.received)
            timeline.append((now, sent, received))
            if received != last_received:
                last_progress_at, last_received = time.perf_counter(), received
            if limit:
                progress(received / expected, f"{received:,}/{expected:,} delivered")
                publishing = any(process.is_alive() for process in run.publishers)
                if received >= expected or (
                    not publishing and time.perf_counter() - last_progress_at > DRAIN_TIMEOUT
                ):
                    break
            else:
                progress(min(now / options.duration, 1.0), f"{received:,} delivered")
                if now >= options.duration:
                    break
    finally:
        elapsed = time.perf_counter() - start
        server_cpu = cpu_seconds(server_pid) - start_cpu if server_pid else None
        sent, received = run.total(run.sent), run.total(run.received)
        if latency_results is not None:
            run.stop.set()
            histogram = LatencyHistogram.decode(latency_results.get(timeout=15))
        run.finish()
    if limit:  # the window ends at the last delivery, not at the drain timeout
        elapsed = max(next(t for t, _, r in timeline if r >= received), SAMPLE_INTERVAL)
    fanout = len(patterns)
    result: dict[str, Any] = {
        "tool": "broky bench",
        "target": target,
        "scenario": options.scenario,
        "mode": "client" if options.scenario == "latency" else options.mode,
        "publishers": options.publishers,
        "subscribers": fanout,
        "payload_bytes": options.size,
        "workers": options.workers if target == "broky" and not options.address else None,
        "offered_per_s": round(options.rate * options.publishers) if options.rate else "max",
        "seconds": round(elapsed, 3),
        "published": sent,
        "delivered": received,
        "published_per_s": round(sent / elapsed),
        "delivered_per_s": round(received / elapsed),
        "delivered_per_subscriber_per_s": round(received / fanout / elapsed),
        "dropped_notified": run.total(run.dropped),
        "server_cpu_utilisation": round(server_cpu / elapsed, 2)
        if server_cpu is not None
        else None,
    }
    if latency_results is not None:
        result["latency"] = histogram.summary()
        result["latency_samples"] = histogram.count
    if options.scenario == "slow-subscriber" and target == "broky":
        result["slow_subscriber"] = {
            "received": slow_received.value,
            "dropped_notified": slow_dropped.value,
        }
    result["_timeline"] = timeline
    if latency_results is not None:
        result["_distribution"] = histogram.distribution()
    return result


def run_bench(
    options: BenchOptions,
    compare: Sequence[str] = (),
    progress_factory: Callable[[str], AbstractContextManager[Callable[[float, str], None]]]
    | None = None,
) -> list[dict[str, Any]]:
    """Run the scenario on Broky (started here unless ``options.address``),
    then on each peer in ``compare``; returns one result per target."""

    def progress_for(target: str) -> AbstractContextManager[Callable[[float, str], None]]:
        if progress_factory is None:
            return nullcontext(lambda fraction, text: None)
        return progress_factory(target)

    results = []
    if options.address:
        with progress_for("broky") as progress:
            results.append(
                run_scenario(options, "broky", parse_address(options.address), None, progress)
            )
    else:
        with (
            server_process(broky_command(options.workers)) as (pid, address),
            progress_for("broky") as progress,
        ):
            results.append(run_scenario(options, "broky", address, pid, progress))
    for peer in compare:
        with peers.peer_server(peer) as (pid, address), progress_for(peer) as progress:
            results.append(run_scenario(options, peer, address, pid, progress))
    return results
