"""Who a client says it is: user and password, a token, or nobody.

One value that command-line tools and load generators pass around (it
pickles into forked load-generator processes), with the two ways a Hello is
made: by the client library and by a raw socket.
"""

from __future__ import annotations

import ssl
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import attrs

from broky.protocol.frames import Hello

if TYPE_CHECKING:
    from broky.client.client import Client


@attrs.frozen(slots=True)
class Credentials:
    """A client's credentials; all empty: anonymous."""

    user: str = ""
    password: str = attrs.field(default="", repr=False)
    token: str = attrs.field(default="", repr=False)

    def hello(self, client_name: str) -> Hello:
        """The Hello a raw-socket client sends."""
        return Hello(
            client_name=client_name, user=self.user, password=self.password, token=self.token
        )

    def connect(
        self,
        address: str,
        name: str = "",
        ssl_context: ssl.SSLContext | None = None,
        *,
        idempotent: bool = True,
    ) -> AbstractAsyncContextManager[Client]:
        """``broky.connect`` with these credentials."""
        # Imported here: raw-socket load generators use only ``hello`` and
        # should not load the client library in every spawned process.
        from broky.client.tcp import connect  # noqa: PLC0415

        opened: AbstractAsyncContextManager[Client] = connect(
            address,
            name=name,
            ssl_context=ssl_context,
            user=self.user,
            password=self.password,
            token=self.token,
            idempotent=idempotent,
        )
        return opened


ANONYMOUS = Credentials()
