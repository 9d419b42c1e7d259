"""Exceptions the client raises: each carries the broker's wire code.

The two context managers at the end keep it that way at the client's
boundary: the caller sees these exceptions themselves, never a trio
TooSlowError or an exception group.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import trio

from broky.protocol.constants import ErrorCode


class BrokyError(Exception):
    """An error reported by (or about) the broker; ``code`` says which."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{message} [{code.name}]")
        self.code = code
        #: The message without the code: what the broker (or client) said.
        self.reason = message


class ConnectionClosed(BrokyError):
    """The connection is gone; the message says why."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL) -> None:
        super().__init__(code, message)


class SubscriptionError(BrokyError):
    """The broker refused or ended one subscription; the connection stays up."""


class ConsumerRefused(SubscriptionError):
    """The broker refused to attach a consumer to a durable subscription
    (``SubscriptionRefused``): an exclusive subscription already has its
    consumer, the subscription exists with another type, or the broker serves
    no durable subscriptions. ``reason`` says which, in the broker's words."""


class AuthenticationError(BrokyError):
    """The broker refused this client's credentials (or wanted some)."""


class AckTimeout(BrokyError):
    """Acked frames went unanswered for ``ack_timeout`` seconds on an open
    connection (a stuck fsync, a stopped owner): raised by ``flush_acks``.
    Nothing is given up: the frames stay in flight, and calling
    ``flush_acks`` again waits for them (or, if the connection is lost, an
    idempotent client resends them, stored once). ``frames`` and ``keys``
    say what is unanswered."""

    def __init__(self, message: str, frames: int, keys: tuple[str, ...]) -> None:
        # OwnerUnavailable, as the broker's own answer to a stalled owner: retriable.
        super().__init__(ErrorCode.OWNER_UNAVAILABLE, message)
        self.frames = frames
        self.keys = keys


class PublishRefused(BrokyError):
    """The broker refused some published messages (permissions, message size);
    raised by ``flush``. The connection stays up; the rest was routed."""


@contextmanager
def deadline(seconds: float, message: str) -> Iterator[None]:
    """``trio.fail_after(seconds)`` that raises ConnectionClosed(``message``)
    (caused by the TooSlowError): a connection that could not be set up is a
    broker error to the caller, not a stray trio exception."""
    try:
        with trio.fail_after(seconds):
            yield
    except trio.TooSlowError as exc:
        raise ConnectionClosed(message) from exc


@contextmanager
def unwrapped() -> Iterator[None]:
    """Around the client's nursery: re-raise a group of one as that one exception.

    A trio nursery wraps whatever escapes it in an exception group, and the
    client's nursery runs the caller's ``async with`` body, so without this a
    caller would catch ``ExceptionGroup([BrokyError(...)])`` instead of the
    documented ``BrokyError``, and their own exceptions would come back
    wrapped too. The one exception propagates as the very object that was
    raised, its ``__cause__`` and ``__context__`` as they were (a group the
    caller's own nursery raised stays that group). A group of several (two
    tasks failed at once) propagates whole: picking one would hide the other.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) != 1:
            raise
        _raise_as_is(group.exceptions[0])


def _raise_as_is(error: BaseException) -> NoReturn:
    """Raise ``error`` without Python setting the group it came out of as its context."""
    context = error.__context__
    try:
        raise error
    finally:
        error.__context__ = context
