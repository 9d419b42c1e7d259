"""The HTTP/1.1 layer under the etcd client, against scripted servers,
and a watch that survives its connection being cut (through a proxy)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio

from broky.cluster.etcd import EtcdClient, EtcdUnavailable
from broky.cluster.etcd_wire import EtcdError
from broky.cluster.http import HttpError, HttpPool
from broky.cluster.mirror import PrefixMirror
from tests.conftest import eventually

Handler = Callable[[trio.SocketStream], Awaitable[None]]

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def serve(nursery: trio.Nursery, handler: Handler) -> int:
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    port: int = listeners[0].socket.getsockname()[1]
    return port


async def read_request(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"}"):
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        data += chunk
    return data


async def test_a_pooled_connection_the_server_closed_is_replaced(nursery: trio.Nursery) -> None:
    connections = 0

    async def one_answer_then_close(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        await read_request(stream)
        await stream.send_all(ANSWER)
        await stream.aclose()  # an idle keep-alive connection the server drops

    port = await serve(nursery, one_answer_then_close)
    pool = HttpPool()
    with trio.fail_after(5):
        for _ in range(3):
            assert await pool.post("127.0.0.1", port, "/v3/kv/range", b"{}") == (200, b"{}")
    await pool.aclose()
    assert connections >= 3


async def test_garbage_and_cut_answers_are_errors(nursery: trio.Nursery) -> None:
    async def garbage(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(b"SMTP ready\r\n\r\n")
        await stream.aclose()

    async def cut(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(ANSWER[:-1])
        await stream.aclose()

    pool = HttpPool()
    with trio.fail_after(5):
        for handler in (garbage, cut):
            port = await serve(nursery, handler)
            with pytest.raises(HttpError):
                await pool.post("127.0.0.1", port, "/", b"{}")
            async with EtcdClient([f"http://127.0.0.1:{port}"]) as client:
                with pytest.raises(EtcdUnavailable):
                    await client.get(b"k")
    await pool.aclose()


async def test_a_non_json_answer_is_an_etcd_error(nursery: trio.Nursery) -> None:
    async def not_found(stream: trio.SocketStream) -> None:
        await read_request(stream)
        body = b"404 page not found"
        head = f"HTTP/1.1 404 Not Found\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        await stream.send_all(head + body)
        await stream.aclose()

    port = await serve(nursery, not_found)
    async with EtcdClient([f"http://127.0.0.1:{port}"]) as client:
        with trio.fail_after(5), pytest.raises(EtcdError, match="not JSON"):
            await client.get(b"k")


async def test_a_mirror_resumes_after_its_watch_is_cut(
    etcd: EtcdClient, etcd_url: str, prefix: bytes, nursery: trio.Nursery
) -> None:
    """A proxy between the mirror and etcd cuts every connection; changes
    made meanwhile reach the mirror once it reconnects, none missed."""
    etcd_port = int(etcd_url.rsplit(":", 1)[1])
    cut = trio.Event()
    generation = [cut]
    opened_after_cut = 0

    async def proxy(client_side: trio.SocketStream) -> None:
        nonlocal opened_after_cut
        mine = generation[0]
        opened_after_cut += mine is not cut
        async with await trio.open_tcp_stream("127.0.0.1", etcd_port) as server_side:

            async def pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
                while data := await source.receive_some(65536):
                    await sink.send_all(data)

            async with trio.open_nursery() as pipes:
                pipes.start_soon(pump, client_side, server_side)
                pipes.start_soon(pump, server_side, client_side)
                await mine.wait()
                pipes.cancel_scope.cancel()
        await client_side.aclose()

    port = await serve(nursery, proxy)
    async with EtcdClient([f"http://127.0.0.1:{port}"]) as through_proxy:
        mirror = PrefixMirror(through_proxy, prefix)
        with trio.fail_after(10):
            await etcd.put(prefix + b"a", b"1")
            await nursery.start(mirror.run)
            assert set(mirror.kvs) == {prefix + b"a"}
            generation[0] = trio.Event()
            cut.set()  # every connection so far is cut, the watch's too
            await etcd.put(prefix + b"b", b"2")
            await etcd.delete(prefix + b"a")
            await eventually(lambda: set(mirror.kvs) == {prefix + b"b"})
            assert mirror.kvs[prefix + b"b"].value == b"2"
            assert opened_after_cut >= 1  # the mirror reconnected: the cut was real
        nursery.cancel_scope.cancel()
