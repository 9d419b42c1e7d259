"""Real link partitions: etcd and each Broky node in a network namespace of its own.

The machine's kernel has network namespaces, veth pairs and bridges but no
traffic-control qdiscs (no ``netem``) and no netfilter tools, so links are
cut with what the routing layer offers:

- **a link down** (``isolate``): the node's bridge port is set down; its
  packets go nowhere and nothing reaches it, from etcd, peers or clients.
- **a silent cut between two hosts** (``cut``): in each host's namespace a
  policy rule ``from <other> iif eth0 blackhole`` drops what arrives from
  the other, so each side's sends leave and vanish, as behind a broken
  switch (no RST, no ICMP): TCP connections hang until a timeout notices.
  For the rule to see locally addressed packets the ``local`` table's rule
  is moved from priority 0 to 100 in every namespace (rules at 0 cannot be
  preceded).

Layout: a hub namespace holds the bridge; every host has a namespace whose
``eth0`` is a veth to a bridge port, with ``10.77.N.x/24``; the test
process (root namespace) reaches the bridge through one veth,
``10.77.N.254``, so clients publish from outside every cut. ``N`` is picked
so that the root namespace has no route to it yet (another run's network).

Cleanup: deleting a namespace deletes its veth ends, and a veth pair dies
with either end, so ``close`` (called in ``finally`` blocks) removes
everything by name: the namespaces it created, including the hub (the
root-namespace veth goes with it). Names carry the creating PID
(``bkj<pid>-...``), so ``sweep_stale`` removes a crashed run's leftovers
and ``sweep_mine`` a session's at its end.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import attrs

#: Prefix of every namespace this harness creates (``bkj<pid>-<host>``).
PREFIX = "bkj"
#: The /16 the per-run /24 networks are taken from.
SUPERNET = "10.77"
#: The test process's address on every run's network.
OUTSIDE = 254


class NetnsUnavailable(Exception):
    """Network namespaces cannot be created here (not root, no kernel support)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=10)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _delete_matching(pattern: re.Pattern[str]) -> None:
    for name in namespaces():
        if pattern.fullmatch(name):
            _ip("netns", "delete", name, check=False)


def sweep_stale() -> None:
    """Delete namespaces of runs whose process is gone (a crashed run's leftovers)."""
    for name in namespaces():
        found = re.fullmatch(rf"{PREFIX}(\d+)-.*", name)
        if found and not os.path.exists(f"/proc/{found.group(1)}"):
            _ip("netns", "delete", name, check=False)


def sweep_mine() -> None:
    """Delete every namespace this process created (session end)."""
    _delete_matching(re.compile(rf"{PREFIX}{os.getpid()}-.*"))


@attrs.frozen
class Host:
    """One namespace on the network."""

    name: str
    namespace: str
    address: str

    @property
    def wrapper(self) -> tuple[str, ...]:
        """Command prefix that runs a program inside this namespace
        (``ip netns exec`` execs it: the PID is the program's)."""
        return ("ip", "netns", "exec", self.namespace)


class Network:
    """A bridge and hosts on it; see the module docstring. Use ``open``."""

    def __init__(self, subnet: int) -> None:
        self.subnet = subnet
        self.tag = f"{PREFIX}{os.getpid()}-{subnet}"
        self.hub = f"{self.tag}-hub"
        self.hosts: dict[str, Host] = {}
        self._cuts: set[tuple[str, str]] = set()
        self._created: list[str] = []

    @classmethod
    @contextmanager
    def open(cls) -> Iterator[Network]:
        """A network with the test process attached; NetnsUnavailable if
        namespaces cannot be made; everything is deleted on exit."""
        sweep_stale()
        network = cls(_free_subnet())
        try:
            network._create_hub()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            network.close()
            raise NetnsUnavailable(str(exc)) from exc
        try:
            yield network
        finally:
            network.close()

    def _namespace(self, name: str) -> str:
        namespace = f"{self.tag}-{name}"
        _ip("netns", "add", namespace)
        self._created.append(namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")
        return namespace

    def _create_hub(self) -> None:
        self._namespace("hub")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        outside = f"bkj{os.getpid() % 100000}x{self.subnet}"[:15]
        _ip("link", "add", outside, "type", "veth", "peer", "name", "outside", "netns", self.hub)
        _ip("-n", self.hub, "link", "set", "outside", "master", "br0", "up")
        _ip("addr", "add", f"{SUPERNET}.{self.subnet}.{OUTSIDE}/24", "dev", outside)
        _ip("link", "set", outside, "up")

    def add(self, name: str, index: int) -> Host:
        """A host ``name`` at ``10.77.N.index``."""
        namespace = self._namespace(name)
        port = f"p{index}"
        _ip(
            "-n",
            self.hub,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            namespace,
        )
        _ip("-n", self.hub, "link", "set", port, "master", "br0", "up")
        address = f"{SUPERNET}.{self.subnet}.{index}"
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        # Let the blackhole rules of ``cut`` come before local delivery.
        _ip("-n", namespace, "rule", "add", "pref", "100", "lookup", "local")
        _ip("-n", namespace, "rule", "del", "pref", "0")
        host = Host(name, namespace, address)
        self.hosts[name] = host
        return host

    def _port(self, name: str) -> str:
        return f"p{self.hosts[name].address.rsplit('.', 1)[1]}"

    def isolate(self, name: str) -> None:
        """Take ``name``'s link down: it reaches no one and no one reaches it."""
        _ip("-n", self.hub, "link", "set", self._port(name), "down")

    def rejoin(self, name: str) -> None:
        _ip("-n", self.hub, "link", "set", self._port(name), "up")

    def cut(self, first: str, second: str) -> None:
        """Silently drop everything between two hosts, both ways."""
        for here, there in ((first, second), (second, first)):
            self._rule("add", here, there)
            self._cuts.add((here, there))

    def heal(self, first: str, second: str) -> None:
        for here, there in ((first, second), (second, first)):
            if (here, there) in self._cuts:
                self._rule("del", here, there)
                self._cuts.discard((here, there))

    def cut_off(self, name: str, others: Sequence[str]) -> None:
        for other in others:
            self.cut(name, other)

    def heal_all(self) -> None:
        """Heal every cut and bring every link up."""
        for here, there in sorted(self._cuts):
            self._rule("del", here, there)
        self._cuts.clear()
        for name in self.hosts:
            self.rejoin(name)

    def _rule(self, action: str, here: str, there: str) -> None:
        source = self.hosts[there].address
        namespace = self.hosts[here].namespace
        _ip(
            "-n",
            namespace,
            "rule",
            action,
            "pref",
            "10",
            "from",
            source,
            "iif",
            "eth0",
            "blackhole",
        )

    def close(self) -> None:
        """Delete every namespace created (processes inside must be stopped
        first, by PID: a namespace with processes outlives its name)."""
        for namespace in reversed(self._created):
            _ip("netns", "delete", namespace, check=False)
        self._created.clear()


def _free_subnet() -> int:
    """A /24 of SUPERNET the root namespace has no address in yet."""
    taken = _ip("-4", "-o", "addr", "show").stdout
    used = set()
    for found in re.finditer(rf"inet ({SUPERNET}\.\d+\.\d+)/", taken):
        used.add(int(ipaddress.ip_address(found.group(1)).packed[2]))
    start = os.getpid() % 200
    for offset in range(200):
        candidate = 1 + (start + offset) % 200
        if candidate not in used:
            return candidate
    raise NetnsUnavailable(f"no free /24 left in {SUPERNET}.0.0/16")
