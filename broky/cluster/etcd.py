"""A small trio client for etcd v3, over etcd's JSON gateway.

Why not a library: no maintained etcd client runs on trio. The gRPC ones
are synchronous (``etcd3``, which no longer imports with protobuf >= 4) or
asyncio-only (``aetcd`` and friends); OpenStack's ``etcd3gw`` speaks the same
gateway but blocks a thread per call and per watch. The gateway is stable
HTTP/1.1 + JSON that etcd 3.4 and later serve on the client port, and
Patroni elects PostgreSQL primaries through it. The request and answer
formats live in broky.cluster.etcd_wire (no I/O); broky.cluster.http moves
the bytes (h11 on trio; it says why not httpx).

Retry contract: a request whose answer was lost may have been applied.
Callers only send writes that are safe to repeat: compare-and-swap txns (a
retry of an applied CAS fails and the caller re-reads), lease keepalives,
and puts of a key the caller alone owns.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import attrs
import trio

from broky.cluster.etcd_wire import (
    Compare,
    Delete,
    EtcdError,
    Get,
    Json,
    Operation,
    Put,
    RangeResult,
    TxnResult,
    WatchBatch,
    check,
    decode,
    parse_range,
    parse_txn,
    parse_watch_line,
    txn_json,
    watch_create_json,
)
from broky.cluster.http import HttpConnection, HttpError, HttpPool

#: How long one unary request may take. etcd answers in milliseconds (a txn
#: is ~2 ms here, it fsyncs its WAL); seconds mean it lost its quorum or the
#: machine is stalled, and the caller should learn that before a lease runs out.
REQUEST_TIMEOUT = 3.0


class EtcdUnavailable(EtcdError):
    """No etcd endpoint could be reached (connection refused, reset or timed
    out). The request may or may not have been applied."""


def parse_endpoints(url: str) -> tuple[str, ...]:
    """``etcd://host:port[,host:port...]`` (or ``http://...``) as base URLs.

    Raises ValueError with the reason for anything else."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("etcd", "http"):
        raise ValueError(f"cluster must be etcd://HOST:PORT[,HOST:PORT...], got {url!r}")
    endpoints = []
    for item in rest.rstrip("/").split(","):
        parts = urlsplit(f"http://{item}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None or parts.path:
            raise ValueError(f"etcd endpoint must be HOST:PORT, got {item!r} in {url!r}")
        endpoints.append(f"http://{item}")
    return tuple(endpoints)


@attrs.frozen
class Lease:
    """A lease etcd granted: ``ttl`` is what etcd granted, which can be more
    than asked (its floor is 1.5 x its election timeout)."""

    id: int
    ttl: int


class EtcdClient:
    """One connection pool to an etcd cluster; safe to share between tasks.

    ``endpoints`` are tried in turn: a transport failure moves to the next
    one and raises EtcdUnavailable for the caller to retry."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = tuple(endpoints)
        self._current = 0
        self._pool = HttpPool()

    @classmethod
    def from_url(cls, url: str) -> EtcdClient:
        return cls(parse_endpoints(url))

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._current]

    def _host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.endpoint)
        return parts.hostname or "", parts.port or 80

    def _failed(self, exc: Exception, path: str) -> EtcdUnavailable:
        failed = self.endpoint
        self._current = (self._current + 1) % len(self.endpoints)
        return EtcdUnavailable(f"etcd at {failed} unreachable on {path}: {exc}")

    async def call(self, path: str, body: Json) -> Json:
        """POST ``body`` to the gateway's ``path`` (``/v3/kv/range``...)."""
        host, port = self._host_port()
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                _status, answer = await self._pool.post(host, port, path, json.dumps(body).encode())
        except (HttpError, trio.TooSlowError) as exc:
            raise self._failed(exc, path) from exc
        return check(decode(answer))

    async def get(self, key: bytes) -> RangeResult:
        return await self.range(Get(key))

    async def get_prefix(self, prefix: bytes) -> RangeResult:
        return await self.range(Get.prefix(prefix))

    async def range(self, request: Get) -> RangeResult:
        """A linearizable read (etcd's default: it goes through its leader)."""
        return parse_range(await self.call("/v3/kv/range", request.to_json()))

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Set ``key``; returns the revision of the write."""
        answer = await self.call("/v3/kv/put", Put(key, value, lease).to_json())
        return int(answer.get("header", {}).get("revision", 0))

    async def delete(self, key: bytes, range_end: bytes = b"") -> int:
        """Delete ``key`` (or the range); returns how many keys went."""
        answer = await self.call("/v3/kv/deleterange", Delete(key, range_end).to_json())
        return int(answer.get("deleted", 0))

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Operation] = (),
        failure: Sequence[Operation] = (),
    ) -> TxnResult:
        """If every compare holds run ``success``, else ``failure``, atomically."""
        return parse_txn(await self.call("/v3/kv/txn", txn_json(compare, success, failure)))

    async def grant(self, ttl: int) -> Lease:
        """A new lease of about ``ttl`` seconds (see Lease.ttl)."""
        answer = await self.call("/v3/lease/grant", {"TTL": str(ttl)})
        try:
            return Lease(int(answer["ID"]), int(answer["TTL"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise EtcdError(f"etcd granted no lease: {answer}") from exc

    async def keepalive(self, lease: int) -> int:
        """Renew ``lease`` once; returns its new TTL, 0 if it has expired."""
        answer = await self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", {}).get("TTL", 0))

    async def time_to_live(self, lease: int) -> int:
        """Seconds ``lease`` has left (rounded down by etcd), -1 if it is gone:
        how a process that does not hold a lease learns it is still alive."""
        answer = await self.call("/v3/lease/timetolive", {"ID": str(lease)})
        return int(answer.get("TTL", -1))

    async def revoke(self, lease: int) -> bool:
        """End ``lease`` now, deleting its keys; False if it was already gone."""
        try:
            await self.call("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if exc.code == 5:  # NOT_FOUND: expired or revoked already
                return False
            raise
        return True

    @asynccontextmanager
    async def watch(
        self, key: bytes, range_end: bytes = b"", start_revision: int = 0
    ) -> AsyncIterator[WatchStream]:
        """Watch ``key`` (or the range) from ``start_revision`` (0: from now),
        on a connection of its own (a watch is one long chunked answer).

        The stream ends with EtcdUnavailable when the connection drops and
        with WatchCompacted when the start revision is gone; restarting is
        the caller's (broky.cluster.mirror does it), since only the caller
        knows the last revision it applied."""
        host, port = self._host_port()
        body = json.dumps(watch_create_json(key, range_end, start_revision)).encode()
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                connection = await HttpConnection.open(host, port)
        except (HttpError, trio.TooSlowError) as exc:
            raise self._failed(exc, "/v3/watch") from exc
        try:
            stream = WatchStream(self, connection)
            try:
                with trio.fail_after(REQUEST_TIMEOUT):
                    await stream.start(body)
            except trio.TooSlowError as exc:
                raise self._failed(exc, "/v3/watch") from exc
            yield stream
        finally:
            await connection.aclose()


class WatchStream:
    """The batches of one open watch, in revision order; iterate it."""

    def __init__(self, client: EtcdClient, connection: HttpConnection) -> None:
        self._client = client
        self._connection = connection
        self._pending = b""

    async def start(self, body: bytes) -> None:
        try:
            status = await self._connection.send_request("/v3/watch", body)
            if status != 200:
                check(decode(await self._connection.read_body()))
                raise EtcdError(f"etcd answered a watch with HTTP {status}")
        except HttpError as exc:
            raise self._client._failed(exc, "/v3/watch") from exc

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchBatch:
        while True:
            line, newline, rest = self._pending.partition(b"\n")
            if newline:
                self._pending = rest
                if line.strip():
                    return parse_watch_line(line.decode())
                continue
            try:
                data = await self._connection.next_data()
            except HttpError as exc:
                raise self._client._failed(exc, "/v3/watch") from exc
            if data is None:
                raise EtcdUnavailable("etcd ended the watch stream")
            self._pending += data
