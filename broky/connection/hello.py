"""The broker's answer to a Hello: the link settings it implies and the Welcome.

A Hello that opens a router link (another worker of this node, a peer
node, a durable owner) changes how the connection's outlet is bounded; a
cluster link from a node with another worker count is refused, since worker
i links to worker i of each peer. Admission (credentials, permissions) is
decided before this, in broky.connection.admission.
"""

from __future__ import annotations

from typing import Final

from broky.connection.settings import ConnectionSettings
from broky.protocol.constants import MIN_MAX_FRAME_BYTES, PROTOCOL_VERSION, ErrorCode, LinkKind
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Hello, Welcome
from broky.router.outbox import Outlet
from broky.router.pressure import LOCAL_LINK_STALL_SECONDS
from broky.security.auth import Principal

SERVER_NAME: Final = "broky/0.1.0"


def accept_hello(
    hello: Hello,
    outlet: Outlet,
    node_id: str,
    settings: ConnectionSettings,
    peer: str,
    principal: Principal | None,
) -> Welcome:
    """Set up ``outlet`` for the link ``hello`` opens; the Welcome to send.

    Raises RemoteProtocolError for a router linking to its own node or a
    cluster link from a node with another worker count.
    """
    if hello.link is not LinkKind.CLIENT:
        if hello.link is LinkKind.CLUSTER and hello.node == node_id:
            raise RemoteProtocolError(
                "a router tried to link to its own node (check --peers)",
                ErrorCode.MALFORMED_FRAME,
            )
        _check_workers(hello, settings.workers)
        outlet.kind = hello.link
        outlet.max_pending_bytes = 0  # links: per-subscription bounds only
        if hello.link is LinkKind.LOCAL:
            # Another worker of this node: part of the broker.
            outlet.local_link = True
            outlet.write_stall_seconds = LOCAL_LINK_STALL_SECONDS
            outlet.max_write_stall_seconds = LOCAL_LINK_STALL_SECONDS
    outlet.peer = f"{hello.client_name}@{peer}"
    if hello.max_frame_bytes:
        outlet.max_frame_bytes = max(hello.max_frame_bytes, MIN_MAX_FRAME_BYTES)
    return _welcome(settings, principal)


def _check_workers(hello: Hello, workers: int) -> None:
    """Refuse a cluster link from a node with another worker count: worker
    i links to worker i of each peer, so some routers would get no link."""
    if hello.link is LinkKind.CLUSTER and workers and hello.workers not in (0, workers):
        raise RemoteProtocolError(
            f"node {hello.node or '?'} runs {hello.workers} workers and this node "
            f"{workers}: every node of a cluster must run the same --workers (worker i "
            "links to worker i of each peer)",
            ErrorCode.MALFORMED_FRAME,
        )


def _welcome(settings: ConnectionSettings, principal: Principal | None) -> Welcome:
    """The Welcome answering an accepted Hello: this broker's limits and timers."""
    return Welcome(
        protocol_version=PROTOCOL_VERSION,
        server_name=SERVER_NAME,
        max_frame_bytes=settings.max_frame_bytes,
        heartbeat_interval_ms=int(settings.heartbeat_interval * 1000),
        idle_timeout_ms=int(settings.idle_timeout * 1000),
        max_message_bytes=settings.max_message_bytes,
        principal=principal.name if principal is not None else "",
    )
