"""Worker processes: one router per core, a supervisor that keeps them running.

Python has a GIL, so "a router per core" means a process per core, each its
own trio loop, ``Broker`` and ``Router``. Workers of a node link to each other
over Unix sockets in a private run directory (full mesh, ``LOCAL`` links), and
worker *i* of every node links to worker *i* of every peer node (``CLUSTER``
links on ``cluster_listen`` port + *i*), which is why the nodes of a cluster
run the same number of workers. With ``cluster_tls_*`` set, cluster links are
mutual TLS; the Unix-socket links stay plain (a private 0700 directory).

How client connections reach workers is ``Config.accept``:

- ``reuseport``: every worker listens on the same port with SO_REUSEPORT and
  the kernel spreads connections by a hash of their addresses (no single
  acceptor, no hand-off cost; a few connections can land unevenly).
- ``handoff``: the supervisor accepts and passes each socket to the next
  worker round-robin over a Unix socket (SCM_RIGHTS); exact balance, at the
  price of one more process hop per *connection* (not per message).

docs/architecture.md records the measurements behind the default.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from broky.cluster.lease_relay import relay
from broky.cluster.node import ClusterNode
from broky.config import Config
from broky.durable.config import policy_table
from broky.gcpolicy import tune_for_broker
from broky.mesh.link import Connector, tls_connector
from broky.mesh.pipe import SupervisorPipe
from broky.mesh.rundir import make_run_dir
from broky.protocol.constants import LinkKind
from broky.reload import reread
from broky.replication.attach import attach_to_worker
from broky.server import Broker

log = logging.getLogger("broky.workers")

#: Seconds workers get to shut down gracefully before they are killed.
STOP_GRACE: Final = 5.0
#: Pause before restarting a worker that died, so a crash loop cannot spin.
RESTART_DELAY: Final = 0.5
LISTEN_BACKLOG: Final = 4096
#: How long a starting worker waits for its links to the node's other workers.
READY_TIMEOUT: Final = 10.0
#: How long a reload waits for each worker's pipe (a hung worker is logged).
RELOAD_TIMEOUT: Final = 2.0


def worker_count(config: Config) -> int:
    """The number of workers to run: the setting, or one per core."""
    return config.workers or os.cpu_count() or 1


def _reuseport_socket(host: str, port: int) -> trio.socket.SocketType:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def link_socket_path(run_dir: Path, index: int) -> Path:
    """Where worker ``index`` accepts its node peers' links."""
    return run_dir / f"worker-{index}.sock"


# --- the worker ---------------------------------------------------------------------


@attrs.frozen
class WorkerPlan:
    """What one worker needs to know to take its place in the node."""

    index: int
    count: int
    node_id: str
    run_dir: str
    port: int  # the client port (fixed: the supervisor chose it)
    handoff_fd: int = -1  # Unix socket the supervisor passes accepted sockets on


async def run_worker(
    config: Config, plan: WorkerPlan, supervisor: SupervisorPipe | None = None
) -> None:
    """Serve as worker ``plan.index`` until SIGINT/SIGTERM, or until the
    ``supervisor``'s pipe closes."""
    run_dir = Path(plan.run_dir)
    if config.metrics_listen and config.metrics_port:
        # One endpoint per worker: worker i serves /metrics on the port + i.
        config = attrs.evolve(config, metrics_port=config.metrics_port + plan.index)
    client_listeners: list[trio.SocketListener] = []
    if plan.handoff_fd < 0:
        sock = _reuseport_socket(config.host, plan.port)
        await sock.bind((config.host, plan.port))
        sock.listen(LISTEN_BACKLOG)
        client_listeners.append(trio.SocketListener(sock))
    link_path = link_socket_path(run_dir, plan.index)
    link_path.unlink(missing_ok=True)  # left by a previous run of this worker
    link_sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await link_sock.bind(str(link_path))
    link_sock.listen(LISTEN_BACKLOG)
    broker = Broker(
        config,
        node_id=plan.node_id,
        client_listeners=client_listeners,
        link_listeners=[trio.SocketListener(link_sock)],
        worker=plan.index,
        workers=plan.count,
    )
    local_links = []
    channels = []
    for other in range(plan.count):
        if other != plan.index:
            path = str(link_socket_path(run_dir, other))

            async def connect_local(path: str = path) -> trio.abc.Stream:
                return await trio.open_unix_socket(path)

            local_links.append(
                broker.add_link(
                    LinkKind.LOCAL, connect_local, f"worker-{plan.index}>worker-{other}"
                )
            )
            if broker.forwarder is not None:
                channels.append(
                    broker.add_owner_channel(
                        other, connect_local, f"worker-{plan.index}>worker-{other} durable"
                    )
                )
    await join_cluster(broker, config, plan.index)
    lease = attach_to_worker(broker, config, plan.index)
    if supervisor is not None:
        supervisor.lease = lease
    # SIGHUP is the supervisor's to act on (it sends reloads down the pipe);
    # caught here so that `pkill -HUP broky` does not kill the workers.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.serve)
            if plan.handoff_fd >= 0:
                nursery.start_soon(_adopt_handed_off, broker, plan.handoff_fd)
            if supervisor is not None:
                nursery.start_soon(supervisor.follow, broker, nursery.cancel_scope)
            # Ready once every node peer has our interest path: from then on a
            # subscribe on this worker waits for all of them (see Router.subscribe).
            with trio.move_on_after(READY_TIMEOUT):
                for link in local_links:
                    await link.ready.wait()
                for channel in channels:
                    await channel.ready.wait()
            print("ready", flush=True)
            async for signum in signals:
                if signum != signal.SIGHUP:
                    nursery.cancel_scope.cancel()
                    break


ClusterContexts = tuple[ssl.SSLContext, ssl.SSLContext] | None


async def join_cluster(broker: Broker, config: Config, index: int) -> None:
    """Give ``broker`` (not serving yet), as worker ``index`` of its node, its
    listener for other nodes' links and its links to them.

    One pair of TLS contexts serves both, and the broker keeps them so that
    a reload loads renewed certificates into them (Broker.renews).
    """
    contexts = config.cluster_tls_contexts()
    listeners = await cluster_listeners(config, index, contexts)
    broker.add_link_listeners(listeners, contexts[0] if contexts else None)
    for name, connector in cluster_connectors(config, index, contexts):
        broker.add_link(LinkKind.CLUSTER, connector, name)
    for context in contexts or ():
        broker.renews(context, "cluster_tls")


async def cluster_listeners(
    config: Config, index: int, contexts: ClusterContexts = None
) -> list[trio.abc.Listener[trio.abc.Stream]]:
    """Worker ``index``'s listeners for other nodes' links (none without
    ``cluster_listen``), TLS-only when ``cluster_tls_*`` is set. The TLS
    handshake runs later, in each connection's own task (ServerConnection.run).
    ``contexts``: those of ``config.cluster_tls_contexts()`` to use (default:
    made here)."""
    if not config.cluster_listen:
        return []
    host, _, port = config.cluster_listen.rpartition(":")
    listeners = await trio.open_tcp_listeners(int(port) + index, host=host)
    tls = contexts or config.cluster_tls_contexts()
    if tls is None:
        return list(listeners)
    return [trio.SSLListener(listener, tls[0]) for listener in listeners]


def cluster_connectors(
    config: Config, index: int, contexts: ClusterContexts = None
) -> list[tuple[str, Connector]]:
    """(name, connector) of worker ``index``'s link to each peer node's worker
    ``index``; each connector speaks TLS when ``cluster_tls_*`` is set."""
    tls = contexts or config.cluster_tls_contexts()
    connectors: list[tuple[str, Connector]] = []
    for peer in config.peers:
        host, _, port = peer.rpartition(":")
        peer_port = int(port) + index

        async def connect_peer(host: str = host, port: int = peer_port) -> trio.abc.Stream:
            return await trio.open_tcp_stream(host, port)

        connector: Connector = connect_peer
        if tls is not None:
            connector = tls_connector(connect_peer, tls[1], host, config.handshake_timeout)
        connectors.append((f"{host}:{peer_port}", connector))
    return connectors


async def _adopt_handed_off(broker: Broker, fd: int) -> None:
    channel = socket.socket(fileno=fd)
    channel.setblocking(False)
    while True:
        await trio.lowlevel.wait_readable(channel)
        try:
            _, fds, _, _ = socket.recv_fds(channel, 16, 64)
        except BlockingIOError:
            continue
        if not fds:
            return  # the supervisor is gone
        for received in fds:
            stream = trio.SocketStream(
                trio.socket.from_stdlib_socket(socket.socket(fileno=received))
            )
            broker.adopt(stream)


def worker_main(argv: Sequence[str] | None = None) -> None:
    """Entry point of a worker process (started by the supervisor)."""
    parser = argparse.ArgumentParser(prog="broky-worker")
    parser.add_argument("spec", nargs="?", help="JSON: config and plan (default: read from stdin)")
    # The supervisor writes the spec to stdin: the command line is visible to
    # every user of the machine (ps), and the config may hold cluster_token.
    given = parser.parse_args(argv).spec
    supervisor: SupervisorPipe | None = None
    if given:
        spec = json.loads(given)
    else:
        spec, supervisor = SupervisorPipe.read_spec(sys.stdin.fileno())
    config = Config.from_mapping(spec["config"])
    plan = WorkerPlan(**spec["plan"])
    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s worker-{plan.index} %(name)s: %(message)s",
    )
    tune_for_broker()
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run_worker, config, plan, supervisor)


# --- the supervisor -----------------------------------------------------------------


class Supervisor:
    """Start, watch and stop a node's worker processes."""

    def __init__(self, config: Config, member: ClusterNode | None = None) -> None:
        # Load the certificates here, so that a bad file stops `broky serve`
        # with a ConfigError instead of a worker that fails to start.
        config.tls_context()
        config.cluster_tls_contexts()
        self.config = config
        self.count = worker_count(config)
        self.node_id = uuid.uuid4().hex[:12]
        self.run_dir = make_run_dir()
        self.port = config.port
        self._processes: dict[int, trio.Process] = {}
        self._handoff: dict[int, socket.socket] = {}
        self._stopping = False
        #: The node's cluster membership, whose lease goes to the workers.
        self.member = member
        #: One writer at a time on each worker's pipe (reloads, lease lines).
        self._pipes: dict[int, trio.Lock] = {}
        self._nursery: trio.Nursery | None = None

    def _config_mapping(self) -> dict[str, Any]:
        config = {field.name: getattr(self.config, field.name) for field in attrs.fields(Config)}
        config["peers"] = list(self.config.peers)
        config["users"] = [user.to_table() for user in self.config.users]
        config["durable"] = [policy_table(policy) for policy in self.config.durable]
        return config

    def _spec(self, index: int, handoff_fd: int) -> str:
        plan = WorkerPlan(index, self.count, self.node_id, str(self.run_dir), self.port, handoff_fd)
        return json.dumps({"config": self._config_mapping(), "plan": attrs.asdict(plan)})

    async def reload(self, config: Config) -> None:
        """Send ``config`` (from broky.reload.reread) to every worker, and keep
        it for the workers started later."""
        self.config = config
        await self._broadcast(json.dumps({"config": self._config_mapping()}).encode() + b"\n")

    async def _broadcast(self, line: bytes) -> None:
        """Send a reload ``line`` to every running worker's pipe (a
        restarting one starts with self.config)."""
        for index, process in self._processes.items():
            if process.returncode is not None or process.stdin is None:
                continue
            with trio.move_on_after(RELOAD_TIMEOUT) as scope:
                async with self._pipe(index):
                    try:
                        await process.stdin.send_all(line)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        continue  # it just exited
            if scope.cancelled_caught:
                log.error("worker %d did not read its pipe within %s s", index, RELOAD_TIMEOUT)

    def _pipe(self, index: int) -> trio.Lock:
        """One writer at a time on worker ``index``'s pipe."""
        return self._pipes.setdefault(index, trio.Lock())

    async def _send_lease(self, line: bytes) -> None:
        """Hand the node's lease ``line`` to each worker, each in a task of
        its own: a worker that does not read its pipe (paused) blocks only
        its own writer, and misses lines (it keeps its last deadline, so it
        stops acking in time) instead of delaying the others'."""
        assert self._nursery is not None
        for index, process in self._processes.items():
            lock = self._pipe(index)
            if process.returncode is None and process.stdin is not None and not lock.locked():
                self._nursery.start_soon(self._write_lease, lock, process.stdin, line)

    @staticmethod
    async def _write_lease(lock: trio.Lock, pipe: trio.abc.SendStream, line: bytes) -> None:
        async with lock:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await pipe.send_all(line)

    async def _start(self, index: int) -> trio.Process:
        process = await self._spawn(index)
        await self._ready(index, process)
        return process

    async def _spawn(self, index: int) -> trio.Process:
        fds: tuple[int, ...] = ()
        handoff_fd = -1
        if self.config.accept == "handoff":
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            old = self._handoff.pop(index, None)
            if old is not None:
                old.close()
            self._handoff[index] = ours
            handoff_fd = theirs.fileno()
            fds = (handoff_fd,)
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "broky.mesh.workers"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=fds,
        )
        assert process.stdin is not None
        # Left open: reloads follow, and its end tells the worker we are gone.
        await process.stdin.send_all(self._spec(index, handoff_fd).encode() + b"\n")
        if fds:
            os.close(fds[0])
        self._processes[index] = process
        return process

    async def _ready(self, index: int, process: trio.Process) -> None:
        assert process.stdout is not None
        line = await process.stdout.receive_some(64)
        if not line.startswith(b"ready"):
            raise RuntimeError(f"worker {index} failed to start (exit code {process.poll()})")

    async def _watch(self, index: int, process: trio.Process) -> None:
        while True:
            code = await process.wait()
            if self._stopping:
                return
            log.error("worker %d exited with code %s; restarting", index, code)
            while True:
                await trio.sleep(RESTART_DELAY)
                try:
                    process = await self._start(index)
                    break
                except RuntimeError as exc:  # killed again while starting: try again
                    log.error("%s; restarting", exc)

    async def _accept_and_hand_off(self, listener: trio.socket.SocketType) -> None:
        targets = itertools.cycle(range(self.count))
        while True:
            connection, _ = await listener.accept()
            with connection:
                for _ in range(self.count):
                    index = next(targets)
                    try:
                        socket.send_fds(self._handoff[index], [b"c"], [connection.fileno()])
                        break
                    except (KeyError, OSError):
                        continue  # that worker is restarting: try the next

    async def run(
        self, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the node until cancelled; reports the client address once ready."""
        host = self.config.host
        reservation = _reuseport_socket(host, self.port)
        await reservation.bind((host, self.port))
        self.port = reservation.getsockname()[1]
        try:
            async with trio.open_nursery() as nursery:
                # All at once: each worker waits for links to the others.
                processes = [await self._spawn(index) for index in range(self.count)]
                for index, process in enumerate(processes):
                    await self._ready(index, process)
                    nursery.start_soon(self._watch, index, process)
                if self.member is not None:
                    self._nursery = nursery
                    nursery.start_soon(relay, self.member, self._send_lease)
                if self.config.accept == "handoff":
                    reservation.listen(LISTEN_BACKLOG)
                    nursery.start_soon(self._accept_and_hand_off, reservation)
                else:
                    reservation.close()  # workers hold the port now
                log.info(
                    "node %s: %d workers (%s) on %s:%d",
                    self.node_id,
                    self.count,
                    self.config.accept,
                    host,
                    self.port,
                )
                task_status.started((host, self.port))
        finally:
            self._stopping = True
            reservation.close()
            with trio.CancelScope(shield=True):
                await self._stop_all()
            shutil.rmtree(self.run_dir, ignore_errors=True)

    async def _stop_all(self) -> None:
        for process in self._processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_GRACE):
            for process in self._processes.values():
                await process.wait()
        for process in self._processes.values():
            if process.returncode is None:
                process.kill()
                await process.wait()
            if process.stdin is not None:
                await process.stdin.aclose()


async def serve_node(
    config: Config, load: Callable[[], Config] | None = None, member: ClusterNode | None = None
) -> None:
    """``broky serve --workers N``: supervise a node until SIGINT/SIGTERM.
    SIGHUP reloads users, allow_anonymous and certificates with ``load``
    into every worker (broky.reload). A cluster ``member``'s lease is
    relayed to the workers (broky.cluster.lease_relay)."""
    supervisor = Supervisor(config, member)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(supervisor.run)
            print(f"broky listening on {host}:{port}", flush=True)
            async for signum in signals:
                if signum == signal.SIGHUP:
                    reloaded = reread(load, supervisor.config) if load is not None else None
                    if reloaded is not None:
                        await supervisor.reload(reloaded)
                    continue
                log.info("received %s, stopping workers", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


if __name__ == "__main__":
    worker_main()
