"""Dead letters reach the dead-letter partition's leader on another node.

Three nodes, ``orders`` with four replicated partitions and the built-in
``_dlq`` topic (one partition). A poison message is published to a
partition whose leader does not lead ``_dlq``; the consumer terms it. The
subscription's node used to append the dead letter locally, be refused
with ``NotLeader`` and retry forever (the message looped); now it publishes
the copy to ``_dlq``'s leader and acks the original once that is acked.
etcd and every node are started here, on 127.0.0.1, and killed by PID.

With ``[[users]]`` configured (``auth``) the copy goes out as the node
itself, with its ``cluster_token``: it used to connect anonymously, be
refused, and the dead letter looped the same way.

With client TLS on every node as well (``tls``: ``tls_cert`` and, for
mutual TLS, ``tls_client_ca``, one throwaway CA) the copy goes out over
TLS, trusting that CA and presenting the node's certificate: it used to
connect in plain TCP, be refused, and loop the same way.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
import trustme

from broky import Start
from broky.client.cluster import ClusterPublisher
from broky.client.cluster_consumer import ClusterConsumer
from broky.client.credentials import ANONYMOUS, Credentials
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.status import read_status
from broky.replication.local_cluster import TopicSpec, fully_in_sync, leaders
from broky.security.passwords import hash_secret
from broky.security.tls import client_context
from broky.storage.topics import partition_for
from tests.cluster.replicated import local_nodes, wait_status
from tests.security.helpers import write_cert

SETTLE = 30.0
ORDERS = TopicSpec(partitions=4)
DEAD_LETTERS = TopicSpec(name="_dlq", pattern="_dlq.>", partitions=1)

NODE_TOKEN = "node-secret-0123456789"
APP = Credentials(user="app", password="app-pw")
#: Every node presents NODE_TOKEN (a link principal's); clients log in as app.
AUTH_CONFIG = f"""cluster_token = "{NODE_TOKEN}"
[[users]]
name = "app"
password_hash = "{hash_secret("app-pw", log_n=10)}"

[[users]]
name = "node"
token_hash = "{hash_secret(NODE_TOKEN, log_n=10)}"
link = true
"""


@pytest.fixture
def cluster_name(prefix: bytes) -> str:
    return "d" + prefix.decode().strip("/").replace("/", "-")


def tls_config(directory: Path) -> tuple[str, ssl.SSLContext]:
    """Every node's client TLS settings (mutual TLS, one throwaway CA, one
    certificate for 127.0.0.1), and the test clients' context."""
    files = write_cert(trustme.CA(), directory, "node", "127.0.0.1")
    config = f'tls_cert = "{files.cert}"\ntls_key = "{files.key}"\ntls_client_ca = "{files.ca}"\n'
    return config, client_context(files.ca, files.cert, files.key)


@pytest.mark.parametrize(
    ("auth", "tls"), [(False, False), (True, False), (True, True)], ids=["anonymous", "auth", "tls"]
)
async def test_a_dead_letter_is_published_to_the_dead_letter_partitions_leader(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path, auth: bool, tls: bool
) -> None:
    keys = ClusterKeys.for_cluster(cluster_name)
    credentials = APP if auth else ANONYMOUS
    extra_config, context = tls_config(tmp_path) if tls else ("", None)
    with (
        trio.fail_after(90),
        local_nodes(
            etcd_url,
            cluster_name,
            tmp_path,
            topic=ORDERS,
            extra_config=extra_config + (AUTH_CONFIG if auth else ""),
        ) as nodes,
    ):
        by_id = {node.node_id: node for node in nodes}
        await wait_status(
            etcd,
            keys,
            lambda s: fully_in_sync(s, ORDERS, 3) and fully_in_sync(s, DEAD_LETTERS, 3),
            SETTLE,
        )
        status = await read_status(etcd, keys)
        dlq_leader = leaders(status, DEAD_LETTERS)[0]
        elsewhere = [p for p, node in leaders(status, ORDERS).items() if node != dlq_leader]
        assert elsewhere, "every orders partition is led by _dlq's leader: no cross-node case"
        poison_key = next(
            f"orders.k{n}"
            for n in range(10_000)
            if partition_for(f"orders.k{n}".encode(), ORDERS.partitions) == elsewhere[0]
        )
        seeds = [node.address for node in nodes]
        async with ClusterPublisher.open(
            seeds, retry_for=SETTLE, credentials=credentials, ssl_context=context
        ) as publisher:
            [run] = await publisher.publish(poison_key, [b"poison"])
        assert dlq_leader is not None
        async with (
            credentials.connect(by_id[dlq_leader].address, ssl_context=context) as reader,
            reader.subscribe("_dlq.>", start=Start.earliest()) as dead,
            ClusterConsumer.open(
                seeds,
                "orders.>",
                subscription="cross",
                start=Start.earliest(),
                credentials=credentials,
                ssl_context=context,
            ) as consumer,
        ):
            async for delivery in consumer:
                assert delivery.payload == b"poison"
                await delivery.term("bad")
                break
            with trio.fail_after(15):  # before the fix: never (refused, retried forever)
                copy = await anext(dead)
            tags = dict(copy.tags)
            assert copy.payload == b"poison"
            assert copy.key == "_dlq.cross.orders"
            assert (tags["dlq.partition"], tags["dlq.offset"]) == (
                str(run.partition),
                str(run.first_offset),
            )
            assert tags["dlq.error"] == "bad"
            await consumer.flush()
            # Acked on the original once the copy was acked: not delivered again.
            with trio.move_on_after(1.0) as quiet:
                again = await anext(consumer)
                raise AssertionError(f"delivered again after its dead letter: {again!r}")
            assert quiet.cancelled_caught
