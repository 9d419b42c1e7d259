"""Who gets the slow password hash next: a fair queue with per-source budgets.

Why: the scrypt check of a password (or hand-chosen token) takes tens of
milliseconds in one of ``HASH_THREADS`` worker threads. With a plain FIFO,
200 connections retrying a wrong password at once kept the threads busy for
longer than ``handshake_timeout``, and a real user's first login timed out
behind them. Failures are never cached (every guess must stay slow), so the
queue itself has to be fair:

- Attempts are keyed by *source* (the peer's host) and *user name*. Free
  threads go round-robin over sources, and within a source round-robin over
  its user names: one address, or one account under attack, gets its share
  and no more, and another user from the same address is not stuck behind it.
- A key has at most ``PENDING_PER_KEY`` checks queued or running, and a
  source at most ``KEYS_PER_SOURCE`` user names pending: beyond that an
  attempt is refused at once, without starting the slow check.
- After ``FREE_FAILURES`` failures of one key, its next attempts are refused
  at once for a cool-down that doubles with each further failure, up to
  ``MAX_BACKOFF_SECONDS``; a success forgets them. (Per key, not per source:
  a guesser sharing an address with real users cannot lock them out.)
- Memory is bounded: at most ``TRACKED_KEYS`` keys' failures are remembered
  (the oldest are forgotten), and the queue holds at most what the budgets
  allow per source.

Time comes from ``trio.current_time``; the queue lives on the broker's trio
thread, like the Authenticator that owns it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Final, TypeVar

import attrs
import trio

T = TypeVar("T")

#: Slow hashes computed at once; more logins wait their turn.
HASH_THREADS: Final = 2
#: Checks one (source, user) may have queued or running: a client retrying
#: never needs more, a flood gets no deeper into the queue.
PENDING_PER_KEY: Final = 2
#: User names one source may have pending at once.
KEYS_PER_SOURCE: Final = 16
#: Failures of one (source, user) before its attempts meet a cool-down: a
#: person mistyping a password is not slowed down.
FREE_FAILURES: Final = 5
#: The longest cool-down; it starts at 1 s and doubles with each failure.
MAX_BACKOFF_SECONDS: Final = 60.0
#: Keys whose failures are remembered; the oldest beyond it are forgotten.
TRACKED_KEYS: Final = 10_000


class LoginRefused(Exception):
    """An attempt refused before any check: over budget or cooling down.
    The message is safe to send to the peer."""


@attrs.define(slots=True)
class _Failures:
    count: int = 0
    #: Attempts are refused until this time (trio clock).
    until: float = 0.0


class LoginQueue:
    """Runs slow checks in worker threads, fairly (see the module docstring)."""

    def __init__(self, threads: int = HASH_THREADS) -> None:
        self._free = threads
        #: source -> user -> waiters (each a granting callback), round-robin order.
        self._queues: OrderedDict[str, OrderedDict[str, deque[Callable[[], None]]]] = OrderedDict()
        #: (source, user) -> checks queued or running.
        self._pending: dict[tuple[str, str], int] = {}
        self._failures: OrderedDict[tuple[str, str], _Failures] = OrderedDict()
        #: Attempts refused without a check (a statistic).
        self.refused = 0

    async def check(self, source: str, user: str, check: Callable[[], T]) -> T:
        """Run ``check()`` in a worker thread when it is this key's turn.

        Raises LoginRefused at once if the key or its source is over budget
        or cooling down. The caller reports the outcome with ``succeeded``
        or ``failed``.
        """
        key = (source, user)
        self._admit(key)
        self._pending[key] = self._pending.get(key, 0) + 1
        try:
            if self._free > 0 and not self._queues:
                self._free -= 1
            else:
                granted = trio.Event()
                self._enqueue(key, granted.set)
                try:
                    await granted.wait()
                except BaseException:
                    if not granted.is_set():
                        self._dequeue(key, granted.set)
                    else:
                        self._release()  # granted and cancelled at once
                    raise
            try:
                return await trio.to_thread.run_sync(check)
            finally:
                self._release()
        finally:
            left = self._pending[key] - 1
            if left:
                self._pending[key] = left
            else:
                del self._pending[key]

    def succeeded(self, source: str, user: str) -> None:
        """The key proved its credentials: forget its failures."""
        self._failures.pop((source, user), None)

    def failed(self, source: str, user: str) -> None:
        """The key's check failed: count it, and start or lengthen its cool-down."""
        key = (source, user)
        record = self._failures.pop(key, None) or _Failures()
        record.count += 1
        if record.count >= FREE_FAILURES:
            backoff = min(MAX_BACKOFF_SECONDS, 2.0 ** (record.count - FREE_FAILURES))
            record.until = trio.current_time() + backoff
        self._failures[key] = record
        while len(self._failures) > TRACKED_KEYS:
            self._failures.popitem(last=False)

    def _admit(self, key: tuple[str, str]) -> None:
        source, user = key
        record = self._failures.get(key)
        if record is not None and record.until > trio.current_time():
            self.refused += 1
            wait = record.until - trio.current_time()
            raise LoginRefused(
                f"too many failed logins{f' for {user!r}' if user else ''} from {source}; "
                f"retry in {wait:.0f} s"
            )
        if self._pending.get(key, 0) >= PENDING_PER_KEY:
            self.refused += 1
            raise LoginRefused(
                f"too many logins{f' for {user!r}' if user else ''} in progress from {source}"
            )
        users = self._queues.get(source)
        if users is not None and user not in users and len(users) >= KEYS_PER_SOURCE:
            self.refused += 1
            raise LoginRefused(f"too many logins in progress from {source}")

    def _enqueue(self, key: tuple[str, str], grant: Callable[[], None]) -> None:
        source, user = key
        users = self._queues.get(source)
        if users is None:
            users = self._queues[source] = OrderedDict()
        waiters = users.get(user)
        if waiters is None:
            waiters = users[user] = deque()
        waiters.append(grant)

    def _dequeue(self, key: tuple[str, str], grant: Callable[[], None]) -> None:
        source, user = key
        users = self._queues[source]
        waiters = users[user]
        waiters.remove(grant)
        if not waiters:
            del users[user]
            if not users:
                del self._queues[source]

    def _release(self) -> None:
        """A thread is free: grant it to the next source's next user, round-robin."""
        if not self._queues:
            self._free += 1
            return
        source, users = next(iter(self._queues.items()))
        user, waiters = next(iter(users.items()))
        grant = waiters.popleft()
        if waiters:
            users.move_to_end(user)
        else:
            del users[user]
        if users:
            self._queues.move_to_end(source)
        else:
            del self._queues[source]
        grant()
