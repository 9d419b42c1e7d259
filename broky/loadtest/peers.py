"""Other brokers for ``broky bench --compare``: start one on 127.0.0.1 and
drive it with minimal raw-socket clients (no client libraries).

Each peer mirrors ``loadgen.raw_publisher`` / ``loadgen.raw_subscribers``:
publishers write the same ``Load`` (one publish command per message, in the
same ``sendall`` batches); subscribers count messages without parsing
payloads. Supported: nats-server (NATS text protocol), redis-server (RESP
PUBLISH, SUBSCRIBE and PSUBSCRIBE) and mosquitto (MQTT 3.1.1, QoS 0).
Servers run as child processes and are stopped by PID. Wildcard patterns
are translated where the peer has an equivalent (``peer_pattern``).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Final

from broky.loadtest.load import Load, MarkCounter, stamped_payload
from broky.loadtest.loadgen import paced_sends, read_until, stop_process

#: Peer name -> the Debian package's server binary.
PEERS: Final = {"nats": "nats-server", "redis": "redis-server", "mosquitto": "mosquitto"}
RECEIVE_BYTES: Final = 1 << 20


def installed_peers() -> list[str]:
    """The peers whose server binary is on PATH."""
    return [name for name, binary in PEERS.items() if shutil.which(binary)]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def peer_server(name: str, *, jetstream: bool = False) -> Iterator[tuple[int, tuple[str, int]]]:
    """Start ``name`` on a free 127.0.0.1 port; yield (pid, address); stop it by PID.

    ``jetstream``: nats-server with JetStream on, its file store in the
    server's temporary directory (``benchmarks/bench_jetstream.py``)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix=f"broky-bench-{name}-") as workdir:
        if name == "nats":
            command = ["nats-server", "-a", "127.0.0.1", "-p", str(port)]
            if jetstream:
                command += ["-js", "-sd", workdir]
        elif name == "redis":
            command = [
                "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                "--appendonly", "no", "--dir", workdir,
            ]  # fmt: skip
        elif name == "mosquitto":
            config = Path(workdir) / "mosquitto.conf"
            config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
            command = ["mosquitto", "-c", str(config)]
        else:
            raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{name} did not start on port {port}") from None
                    time.sleep(0.05)
            yield process.pid, ("127.0.0.1", port)
        finally:
            stop_process(process)


# --- wire encodings -------------------------------------------------------------


def _mqtt_packet(header: int, body: bytes) -> bytes:
    length, encoded = len(body), bytearray()
    while True:
        byte, length = length % 128, length // 128
        encoded.append(byte | (0x80 if length else 0))
        if not length:
            return bytes([header]) + bytes(encoded) + body


def _mqtt_string(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def _mqtt_connect(client_id: str) -> bytes:
    # Protocol "MQTT", level 4 (3.1.1), clean session, keepalive 600 s.
    return _mqtt_packet(0x10, _mqtt_string("MQTT") + b"\x04\x02" + (600).to_bytes(2, "big")
                        + _mqtt_string(client_id))  # fmt: skip


def peer_pattern(peer: str, pattern: str) -> str | None:
    """``pattern`` (Broky syntax) in ``peer``'s syntax, or None if it has no
    equivalent here: NATS spells wildcards as Broky does, Redis's PSUBSCRIBE
    ``*`` matches across dots (so a final ``>`` becomes ``*``), and MQTT
    keys are compared literally only."""
    wildcard = "*" in pattern.split(".") or pattern.endswith(">")
    if peer == "nats" or not wildcard:
        return pattern
    if peer == "redis" and pattern.endswith(".>") and "*" not in pattern.split("."):
        return pattern[:-1] + "*"
    return None


def publish_command(peer: str, key: str, payload: bytes) -> bytes:
    """One publish of ``payload`` on ``key`` in ``peer``'s protocol."""
    if peer == "nats":
        return b"PUB %s %d\r\n%s\r\n" % (key.encode(), len(payload), payload)
    if peer == "redis":
        return b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
            len(key), key.encode(), len(payload), payload
        )  # fmt: skip
    return _mqtt_packet(0x30, _mqtt_string(key) + payload)


def peer_sends(peer: str, load: Load) -> list[bytes]:
    """``load``'s ``sendall`` buffers in ``peer``'s protocol: one publish
    command per message (the peers have no multi-message frame)."""
    payload = b"x" * load.size
    commands: dict[str, bytes] = {}
    return [
        b"".join(
            commands.get(key) or commands.setdefault(key, publish_command(peer, key, payload))
            for key in keys
        )
        for keys in load.sends()
    ]


def _handshake(peer: str, sock: socket.socket, name: str) -> None:
    if peer == "nats":
        sock.recv(4096)  # INFO
        sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"name":"%s"}\r\n' % name.encode())
    elif peer == "mosquitto":
        sock.sendall(_mqtt_connect(name))
        if sock.recv(4)[:1] != b"\x20":
            raise RuntimeError("mosquitto refused the MQTT CONNECT")


def _connect(peer: str, address: tuple[str, int], name: str) -> socket.socket:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _handshake(peer, sock, name)
    return sock


def _drain(sock: socket.socket, stop: Event) -> None:
    """Read and discard what a server sends a publisher (Redis's :N replies)."""
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            if not sock.recv(RECEIVE_BYTES):
                return
        except TimeoutError:
            continue
        except OSError:
            return


def peer_publisher(
    peer: str,
    address: tuple[str, int],
    load: Load,
    rate: float,
    sent: Synchronized[int],
    stop: Event,
    limit: int = 0,
) -> None:
    """Like ``loadgen.raw_publisher``, for a peer broker."""
    buffers = itertools.cycle(peer_sends(peer, load))
    sock = _connect(peer, address, "bench-pub")
    drain = threading.Thread(target=_drain, args=(sock, stop), daemon=True)
    drain.start()
    paced_sends(lambda: sock.sendall(next(buffers)), load.per_send, rate, sent, stop, limit)
    # Half-close and let the server finish: closing with unread replies
    # would reset the connection and lose publishes it has not read yet.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    drain.join(10)
    sock.close()


def _subscribed(peer: str, address: tuple[str, int], pattern: str, name: str) -> socket.socket:
    """A socket subscribed to ``pattern`` (Broky syntax), once ``peer`` confirmed it."""
    sock = _connect(peer, address, name)
    native = peer_pattern(peer, pattern)
    if native is None:
        raise ValueError(f"{peer} has no equivalent of the pattern {pattern!r}")
    if peer == "nats":
        sock.sendall(b"SUB %s 1\r\nPING\r\n" % native.encode())
        while b"PONG" not in sock.recv(4096):
            pass
    elif peer == "redis":
        command = b"PSUBSCRIBE" if "*" in native else b"SUBSCRIBE"
        sock.sendall(b"*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
            len(command), command, len(native), native.encode()))  # fmt: skip
        while b"subscribe" not in sock.recv(4096):
            pass
    else:
        sock.sendall(_mqtt_packet(0x82, b"\x00\x01" + _mqtt_string(native) + b"\x00"))
        if sock.recv(5)[:1] != b"\x90":
            raise RuntimeError("mosquitto refused the MQTT SUBSCRIBE")
    return sock


def stamped_ends(
    peer: str, address: tuple[str, int], key: str, size: int
) -> tuple[Callable[[], socket.socket], bytes, Callable[[], socket.socket]]:
    """Like ``latency.raw_latency_ends``, for a peer broker."""
    return (
        lambda: _connect(peer, address, "bench-latency-pub"),
        publish_command(peer, key, stamped_payload(size)),
        lambda: _subscribed(peer, address, key, "bench-latency-sub"),
    )


class _Counter:
    """Counts messages in a peer's byte stream, across reads."""

    def __init__(self, peer: str, pattern: str) -> None:
        self.peer = peer
        # Payloads are all "x", so the marker only ever starts a message.
        psubscribe = "*" in (peer_pattern(peer, pattern) or "")
        marker = b"$8\r\npmessage\r\n" if psubscribe else b"$7\r\nmessage\r\n"
        self.marks = MarkCounter(b"MSG " if peer == "nats" else marker)
        self.tail = b""

    def feed(self, data: bytes) -> int:
        if self.peer == "mosquitto":
            return self._mqtt(data)
        return self.marks.feed(data)

    def _mqtt(self, data: bytes) -> int:
        buffer = self.tail + data
        position, count = 0, 0
        while position + 2 <= len(buffer):
            length, shift, index = 0, 0, position + 1
            while index < len(buffer):
                byte = buffer[index]
                length |= (byte & 0x7F) << shift
                shift += 7
                index += 1
                if not byte & 0x80:
                    break
            else:
                break
            if index + length > len(buffer):
                break
            if buffer[position] >> 4 == 3:
                count += 1
            position = index + length
        self.tail = buffer[position:]
        return count


def peer_subscribers(
    peer: str,
    address: tuple[str, int],
    patterns: Sequence[str],
    received: Synchronized[int],
    dropped: Synchronized[int],
    ready: Event,
    stop: Event,
) -> None:
    """Like ``loadgen.raw_subscribers``, for a peer broker (one socket per key;
    ``dropped`` stays 0: the peers do not report drops to subscribers)."""
    sockets = []
    for index, pattern in enumerate(patterns):
        sock = _subscribed(peer, address, pattern, f"bench-sub-{index}")
        sockets.append((sock, _Counter(peer, pattern)))
    ready.set()
    threads = [
        threading.Thread(target=_count, args=(sock, counter, received, stop), daemon=True)
        for sock, counter in sockets
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for sock, _ in sockets:
        sock.close()


_count_lock = threading.Lock()


def _count(
    sock: socket.socket, counter: _Counter, received: Synchronized[int], stop: Event
) -> None:
    def handle(data: bytes) -> None:
        if counter.peer == "nats" and b"PING\r\n" in data:
            sock.sendall(b"PONG\r\n")
        count = counter.feed(data)
        with _count_lock:
            received.value += count

    read_until(sock, stop, handle)
