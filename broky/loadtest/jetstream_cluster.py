"""A local three-server NATS JetStream cluster, for the replication benchmark.

``benchmarks.bench_replication`` measures what replication costs Broky (RF 3
``acks = "all"`` against one node) on a machine whose cores the three nodes
share. That ratio means little without a peer's on the same machine in the
same run: this starts ``nats-server -js`` three times, clustered over routes
on 127.0.0.1 (JetStream's own Raft replication, stream ``num_replicas`` 3),
and the benchmark loads it with ``broky.loadtest.jetstream``'s publishers,
one stream with one replica and one with three.

Every server is started here and stopped by PID; their stores live in a
temporary directory that is removed afterwards.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import trio

from broky.loadtest.jetstream import NatsConnection, NatsError
from broky.loadtest.loadgen import stop_process
from broky.loadtest.peers import free_port

#: How long the servers get to listen and elect a JetStream metadata leader.
START_TIMEOUT: Final = 30.0


@contextmanager
def jetstream_cluster(size: int = 3) -> Iterator[list[tuple[int, tuple[str, int]]]]:
    """``size`` clustered JetStream servers; yields (pid, client address) each.

    Yields once every server answers ``$JS.API.INFO`` (the cluster has a
    metadata leader) and a stream of ``size`` replicas could be created."""
    ports = [(free_port(), free_port()) for _ in range(size)]
    routes = ",".join(f"nats://127.0.0.1:{route}" for _, route in ports)
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="broky-bench-jetstream-cluster-") as workdir:
        try:
            for index, (port, route) in enumerate(ports):
                command = [
                    "nats-server", "-a", "127.0.0.1", "-p", str(port),
                    "-js", "-sd", f"{workdir}/n{index}", "--server_name", f"n{index}",
                    "--cluster_name", "bench", "--cluster", f"nats://127.0.0.1:{route}",
                    "--routes", routes,
                ]  # fmt: skip
                processes.append(
                    subprocess.Popen(
                        command,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        cwd=workdir,
                    )
                )
            addresses = [("127.0.0.1", port) for port, _ in ports]
            trio.run(_wait_ready, addresses, processes)
            yield [(p.pid, a) for p, a in zip(processes, addresses, strict=True)]
        finally:
            for process in processes:
                stop_process(process)


async def _wait_ready(
    addresses: list[tuple[str, int]], processes: list[subprocess.Popen[bytes]]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    for address in addresses:
        while True:
            if any(process.poll() is not None for process in processes):
                raise RuntimeError("a nats-server of the benchmark cluster exited at start")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the JetStream cluster was not ready in {START_TIMEOUT} s")
            # Before the metadata leader is elected a request goes unanswered:
            # ask again every half second rather than wait out its timeout.
            with contextlib.suppress(OSError, NatsError), trio.move_on_after(0.5):
                connection = await NatsConnection.open(address)
                try:
                    await connection.request("$JS.API.INFO")
                    break
                finally:
                    await connection.aclose()
            await trio.sleep(0.05)
    # Answering is not enough: a stream with ``size`` replicas is refused
    # ("insufficient resources") until the metadata leader knows every peer.
    while True:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the JetStream cluster had not {len(addresses)} peers in time")
        with contextlib.suppress(OSError, NatsError), trio.move_on_after(2):
            connection = await NatsConnection.open(addresses[0])
            try:
                await connection.request(
                    "$JS.API.STREAM.CREATE.probe",
                    {"name": "probe", "subjects": ["probe"], "num_replicas": len(addresses)},
                )
                await connection.request("$JS.API.STREAM.DELETE.probe")
                return
            finally:
                await connection.aclose()
        await trio.sleep(0.1)
