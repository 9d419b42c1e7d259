"""The servers a benchmark runs against: started here, stopped by PID, measured from /proc.

Broky is started with its Prometheus endpoint on (one port per worker), so
a run can read the broker's own drop counter next to what the subscribers
counted; peers and the pump have no such counter.
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import attrs

from broky.loadtest import peers
from broky.loadtest.loadgen import stop_process

TICKS: Final = os.sysconf("SC_CLK_TCK")
#: Counters of messages the broker dropped (for slow subscriptions, or on a
#: link between workers that fell behind).
_DROPPED: Final = re.compile(
    rb'^(?:broky_dropped_messages_total\{[^}]*reason="slow_consumer"[^}]*\}'
    rb"|broky_link_dropped_messages_total(?:\{[^}]*\})?) (\S+)$",
    re.MULTILINE,
)


@attrs.frozen
class Server:
    """A running server: its PID (CPU is read from it and its children), its
    client address, and Broky's /metrics ports (none for the others)."""

    pid: int
    address: tuple[str, int]
    metrics_ports: tuple[int, ...] = ()

    def broker_dropped(self) -> int | None:
        """Messages the broker counted as dropped, or None if it cannot say."""
        if not self.metrics_ports:
            return None
        total = 0.0
        for port in self.metrics_ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
                    total += sum(float(value) for value in _DROPPED.findall(page.read()))
            except OSError:
                return None
        return round(total)


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
def server_process(command: list[str], metrics_ports: tuple[int, ...] = ()) -> Iterator[Server]:
    """Start a server that prints "... listening on HOST:PORT"; stop it by PID."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"server did not start: {line!r}")
        host, port = line.rsplit(" ", 1)[1].strip().rsplit(":", 1)
        yield Server(process.pid, (host, int(port)), metrics_ports)
    finally:
        stop_process(process)
        if process.stdout is not None:
            process.stdout.close()


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


#: Where metrics ports are picked: below Linux's ephemeral range (32768+),
#: so the broker's own port-0 listener cannot take one of them meanwhile.
_METRICS_PORTS: Final = range(20000, 32000)


def _free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1 right now."""
    for first in random.sample(_METRICS_PORTS, 200):
        try:
            for port in range(first, first + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError("no free ports for the broker's /metrics")


@contextmanager
def broky_server(workers: int, *extra: str) -> Iterator[Server]:
    """``broky serve`` with ``workers`` workers and /metrics on (worker i on
    the first port + i), plus ``extra`` flags."""
    port = _free_ports(workers)
    with tempfile.TemporaryDirectory(prefix="broky-bench-") as workdir:
        config = Path(workdir) / "bench.toml"
        config.write_text(f"metrics_listen = true\nmetrics_port = {port}\n")
        command = [*broky_command(workers), "--config", str(config), *extra]
        with server_process(command, tuple(range(port, port + workers))) as server:
            yield server


@contextmanager
def peer_server(name: str) -> Iterator[Server]:
    """A peer broker (see ``peers.peer_server``) as a ``Server``."""
    with peers.peer_server(name) as (pid, address):
        yield Server(pid, address)
