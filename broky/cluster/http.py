"""Just enough HTTP/1.1 for etcd's JSON gateway: h11 on trio TCP streams.

Why not httpx: its request and response bodies are nested async
generators, and a request cancelled mid-flight (a node shutting down, a
lease-bound task stopped, a timeout) leaves them to the garbage collector,
which trio reports as a ResourceWarning every time. Here a cancelled
request just closes its connection. h11 is the sans-IO HTTP/1.1 engine
httpx itself runs on; this module owns the sockets around it.

Only POST with a JSON body, on plain TCP (etcd's client port on loopback
or a private network; TLS to etcd is not supported yet).
"""

from __future__ import annotations

import h11
import trio

#: Largest answer accepted: a range over every cluster key (256 vbuckets,
#: a few hundred bytes each, plus nodes) is well under a megabyte.
MAX_ANSWER_BYTES = 16 * 1024 * 1024

#: Idle connections kept per client for reuse.
POOL_SIZE = 8


class HttpError(Exception):
    """The connection failed or the peer did not speak HTTP/1.1 properly."""


class HttpConnection:
    """One HTTP/1.1 connection; one request at a time."""

    def __init__(self, stream: trio.SocketStream, netloc: str) -> None:
        self._stream = stream
        self._netloc = netloc
        self._http = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise HttpError(f"cannot connect to {host}:{port}: {exc}") from exc
        return cls(stream, f"{host}:{port}")

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self._stream)

    def close(self) -> None:
        """Close the socket now, without a checkpoint (safe in a cancelled
        scope, where an ``await`` would raise before the next one is closed)."""
        self._stream.socket.close()

    @property
    def reusable(self) -> bool:
        return self._http.our_state is h11.IDLE and self._http.their_state is h11.IDLE

    async def send_request(self, path: str, body: bytes) -> int:
        """Send a POST of ``body``; returns the answer's status code once its
        headers are in (read the body with ``next_data``)."""
        headers = [
            ("Host", self._netloc),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
        ]
        request = h11.Request(method="POST", target=path, headers=headers)
        data = b"".join(
            self._http.send(event) or b""
            for event in (request, h11.Data(data=body), h11.EndOfMessage())
        )
        try:
            await self._stream.send_all(data)
        except trio.BrokenResourceError as exc:
            raise HttpError(f"sending to {self._netloc} failed: {exc}") from exc
        event = await self._next_event()
        if not isinstance(event, h11.Response):
            raise HttpError(f"{self._netloc} answered {event!r} instead of a response")
        return event.status_code

    async def next_data(self) -> bytes | None:
        """The next piece of the answer's body; None at its end."""
        event = await self._next_event()
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            self._http.start_next_cycle()
            return None
        raise HttpError(f"{self._netloc} closed the connection mid-answer")

    async def read_body(self) -> bytes:
        body = b""
        while (data := await self.next_data()) is not None:
            body += data
            if len(body) > MAX_ANSWER_BYTES:
                raise HttpError(f"{self._netloc} sent an answer over {MAX_ANSWER_BYTES} bytes")
        return body

    async def _next_event(self) -> h11.Event:
        while True:
            try:
                event = self._http.next_event()
            except h11.RemoteProtocolError as exc:
                raise HttpError(f"{self._netloc} sent invalid HTTP: {exc}") from exc
            if event is h11.PAUSED:
                raise HttpError(f"{self._netloc} sent data after its answer")
            if event is not h11.NEED_DATA:
                assert isinstance(event, h11.Event)
                return event
            try:
                data = await self._stream.receive_some(65536)
            except trio.BrokenResourceError as exc:
                raise HttpError(f"receiving from {self._netloc} failed: {exc}") from exc
            self._http.receive_data(data)


class HttpPool:
    """Reusable connections to one ``host:port`` at a time."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[HttpConnection]] = {}
        self._closed = False

    async def post(self, host: str, port: int, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body``; returns (status, answer body). A connection that
        fails, or is cancelled mid-request, is closed rather than reused."""
        idle = self._idle.setdefault((host, port), [])
        reused = bool(idle)
        connection = idle.pop() if idle else await HttpConnection.open(host, port)
        try:
            status = await connection.send_request(path, body)
            answer = await connection.read_body()
        except HttpError:
            await connection.aclose()
            if not reused:
                raise
            # An idle connection the server had closed: once more, fresh.
            # (Every request this client sends is safe to repeat.)
            connection = await HttpConnection.open(host, port)
            try:
                status = await connection.send_request(path, body)
                answer = await connection.read_body()
            except BaseException:
                await connection.aclose()
                raise
        except BaseException:
            await connection.aclose()
            raise
        if connection.reusable and len(idle) < POOL_SIZE and not self._closed:
            idle.append(connection)
        else:
            await connection.aclose()
        return status, answer

    async def aclose(self) -> None:
        self._closed = True
        connections = [connection for idle in self._idle.values() for connection in idle]
        self._idle.clear()
        for connection in connections:
            connection.close()
        await trio.lowlevel.checkpoint()
