"""What a client's caller catches: the documented exceptions, never a group.

The client runs the caller's ``async with`` body inside its own nursery,
which wraps whatever escapes in an exception group; these tests check, over
real sockets, that the caller sees ``ConnectionClosed``/``BrokyError``
themselves and that the caller's own exceptions come back untouched.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import pytest
import trio

import broky
from broky import Broker, Client, Config, ErrorCode
from broky.client.client import CONNECT_TIMEOUT
from tests.conftest import address_of


async def _accept_and_stay_silent(listener: trio.SocketListener) -> None:
    """Accept one connection and never send a byte; cancelled when the test ends."""
    stream = await listener.accept()
    async with stream:
        await trio.sleep_forever()


async def _session(
    connection: AbstractAsyncContextManager[Client], body: Callable[[Client], Awaitable[None]]
) -> None:
    """Run ``body`` inside ``async with connection``, as a caller would."""
    async with connection as client:
        await body(client)


async def _never_returns(client: Client) -> None:
    pytest.fail("connected to a listener that never answers")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ssl_context", "expected"),
    [
        (None, "no Welcome from {address} within 5.0 s: is a Broky broker listening there?"),
        (ssl.create_default_context(), "could not connect to {address} within 5.0 s"),
    ],
    ids=["tcp", "tls"],
)
async def test_connect_to_a_silent_listener_raises_connection_closed(
    nursery: trio.Nursery, ssl_context: ssl.SSLContext | None, expected: str
) -> None:
    """A listener that accepts and never answers: no Welcome (nor TLS handshake)."""
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listener:
        nursery.start_soon(_accept_and_stay_silent, listener)
        host, port = listener.socket.getsockname()[:2]
        address = f"{host}:{port}"
        with trio.fail_after(CONNECT_TIMEOUT + 5), pytest.raises(broky.ConnectionClosed) as caught:
            await _session(broky.connect(address, ssl_context=ssl_context), _never_returns)
    assert str(caught.value).startswith(expected.format(address=address))
    assert isinstance(caught.value.__cause__, trio.TooSlowError)


async def _serve_until(
    broker: Broker, scope: trio.CancelScope, *, task_status: trio.TaskStatus[object]
) -> None:
    with scope:
        await broker.serve(task_status=task_status)


def _over_tcp(broker: Broker) -> AbstractAsyncContextManager[Client]:
    return broky.connect(address_of(broker))


def _in_process(broker: Broker) -> AbstractAsyncContextManager[Client]:
    return broker.connect()


CONNECTIONS = pytest.mark.parametrize("connect", [_over_tcp, _in_process], ids=["tcp", "embedded"])


@CONNECTIONS
async def test_broker_shutdown_mid_session_raises_brokyerror(
    nursery: trio.Nursery, connect: Callable[[Broker], AbstractAsyncContextManager[Client]]
) -> None:
    broker = Broker(Config(port=0))
    scope = trio.CancelScope()
    with trio.fail_after(10):
        await nursery.start(_serve_until, broker, scope)

        async def shut_down_while_iterating(client: Client) -> None:
            subscription = await client.subscribe("mid.>")
            scope.cancel()
            async for _ in subscription:
                pytest.fail("a message after the shutdown")

        with pytest.raises(broky.BrokyError) as caught:
            await _session(connect(broker), shut_down_while_iterating)
    assert caught.value.code is ErrorCode.SERVER_SHUTDOWN
    assert "the broker closed the connection" in str(caught.value)


class Mistake(Exception):
    """The caller's own error, raised inside ``async with``."""


async def _raise_in_a_task(error: BaseException) -> None:
    raise error


async def _a_plain_exception(client: Client) -> None:
    await client.publish("mine.plain", b"x")
    raise Mistake("the caller's")


async def _a_group_of_the_callers_nursery(client: Client) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_raise_in_a_task, Mistake("from the caller's task"))
        await client.flush()


async def _a_brokyerror_of_the_caller(client: Client) -> None:
    raise broky.SubscriptionError(ErrorCode.INVALID_PATTERN, "the caller's own")


@pytest.mark.parametrize(
    "body", [_a_plain_exception, _a_group_of_the_callers_nursery, _a_brokyerror_of_the_caller]
)
async def test_the_callers_exception_propagates_unchanged(
    address: str, body: Callable[[Client], Awaitable[None]]
) -> None:
    """What the body raised, with no group around it and none as its context.

    A plain exception comes back as the very object. A group the caller's own
    nursery raised comes back as that group with the same exceptions in it:
    trio copies a group on its way out of any cancelled scope (``split``),
    and the client's nursery scope is cancelled once its body raised.
    """
    raised: list[BaseException] = []

    async def record(client: Client) -> None:
        try:
            await body(client)
        except (Mistake, ExceptionGroup, broky.BrokyError) as exc:
            raised.append(exc)
            raise

    with trio.fail_after(5), pytest.raises((Mistake, ExceptionGroup, broky.BrokyError)) as caught:
        await _session(broky.connect(address), record)
    (original,) = raised
    if isinstance(original, ExceptionGroup):
        assert type(caught.value) is ExceptionGroup
        assert caught.value.message == original.message
        assert caught.value.exceptions == original.exceptions  # the caller's Mistake itself
    else:
        assert caught.value is original
    assert caught.value.__context__ is None
    assert caught.value.__cause__ is None
