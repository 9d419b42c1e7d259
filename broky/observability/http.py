"""A small HTTP/1.1 endpoint on trio: ``GET /metrics`` and ``GET /healthz``.

Why not prometheus_client's ``start_http_server``: it serves from a thread,
and a scrape would read the router's state while the trio thread changes it.
Served here, a scrape runs on the broker's own thread between two router
calls, so every figure comes from one consistent moment, without a lock.

Bounds: one request per connection (``Connection: close``); the request head
is at most MAX_REQUEST_BYTES and must arrive within REQUEST_TIMEOUT seconds;
anything else is answered with 400, 404, 405, 408 or 431 and the socket closed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Final

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

log = logging.getLogger("broky.metrics")

#: Largest request head accepted: a scraper's GET is a few hundred bytes.
MAX_REQUEST_BYTES: Final = 8 * 1024
#: Seconds a client gets to send its request head.
REQUEST_TIMEOUT: Final = 5.0
#: Seconds a response may take to write before the connection is dropped.
RESPONSE_TIMEOUT: Final = 10.0

_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
}


def _response(status: int, content_type: str, body: bytes, head_only: bool = False) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + body


def _text(status: int, text: str) -> bytes:
    return _response(status, "text/plain; charset=utf-8", text.encode())


class MetricsEndpoint:
    """Serves a registry's text exposition and a health document.

    ``/healthz`` answers 200 with ``health()`` as JSON. The handler runs on
    the router's own thread, so an answer at all means the loop is turning:
    health is liveness plus a few figures (uptime, connections, loop lag).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        health: Callable[[], Mapping[str, object]],
        subscriptions: Callable[[], list[dict[str, object]]] = list,
    ) -> None:
        self._registry = registry
        self._health = health
        #: ``/subscriptions``: this worker's durable subscriptions, as JSON.
        self._subscriptions = subscriptions

    def respond(self, request_head: bytes) -> bytes:
        """The full response to one request head (sans-IO: bytes in, bytes out)."""
        request_line = request_head.split(b"\r\n", 1)[0]
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return _text(400, "bad request line\n")
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if target not in (b"/metrics", b"/healthz", b"/subscriptions"):
            return _text(404, "not found: try /metrics, /healthz or /subscriptions\n")
        if method not in (b"GET", b"HEAD"):
            return _text(405, "only GET and HEAD\n")
        if target == b"/metrics":
            body = generate_latest(self._registry)
            return _response(200, CONTENT_TYPE_PLAIN_0_0_4, body, method == b"HEAD")
        document: object = (
            {"subscriptions": self._subscriptions()}
            if target == b"/subscriptions"
            else self._health()
        )
        body = (json.dumps(document) + "\n").encode()
        return _response(200, "application/json", body, method == b"HEAD")

    async def handle(self, stream: trio.abc.Stream) -> None:
        """Serve one request on ``stream`` and close it."""
        try:
            head = b""
            with trio.move_on_after(REQUEST_TIMEOUT) as timeout:
                while b"\r\n\r\n" not in head and len(head) <= MAX_REQUEST_BYTES:
                    data = await stream.receive_some(MAX_REQUEST_BYTES)
                    if not data:
                        return
                    head += data
            if timeout.cancelled_caught:
                response = _text(408, "request head not received in time\n")
            elif b"\r\n\r\n" not in head:
                response = _text(431, f"request head over {MAX_REQUEST_BYTES} bytes\n")
            else:
                response = self.respond(head)
            with trio.move_on_after(RESPONSE_TIMEOUT):
                await stream.send_all(response)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()

    async def serve(
        self,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on host:port until cancelled; reports the bound address."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        sockname = listeners[0].socket.getsockname()
        address = (sockname[0], sockname[1])
        log.info("metrics on http://%s:%d/metrics", *address)
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_listeners, self.handle, listeners))
            task_status.started(address)
