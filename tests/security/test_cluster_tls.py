"""TLS on cluster links: mutual TLS between nodes, refused certificates, settings.

In-process nodes are wired by the same functions a worker uses
(``cluster_listeners``, ``cluster_connectors``); one test runs two real
``broky serve`` processes. All on 127.0.0.1, on free ports.
"""

from __future__ import annotations

import gc
import logging
import shutil
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trustme

import broky
from broky import Broker, BrokyError, Config, ConfigError, ErrorCode
from broky.mesh.link import Connector, LinkHandshakeError, tls_connector
from broky.mesh.workers import join_cluster
from broky.reload import reread
from broky.security.tls import client_context
from tests.conftest import eventually
from tests.mesh.test_nodes import free_ports, nodes
from tests.security.helpers import CertFiles, connect_fails, write_cert


def _config(files: CertFiles, port: int, peer_port: int, **overrides: object) -> Config:
    values: dict[str, object] = {
        "listen": False,
        "cluster_listen": f"127.0.0.1:{port}",
        "peers": (f"127.0.0.1:{peer_port}",),
        "cluster_tls_cert": files.cert,
        "cluster_tls_key": files.key,
        "cluster_tls_ca": files.ca,
        "handshake_timeout": 2.0,
        **overrides,
    }
    return Config.from_mapping(values)


async def _node(nursery: trio.Nursery, config: Config) -> Broker:
    """A one-worker node in this process, linked as ``run_worker`` links it."""
    broker = Broker(config)
    await join_cluster(broker, config, 0)
    await nursery.start(broker.serve)
    return broker


async def _probe_until_delivered(publisher: broky.Client, subscription: broky.Subscription) -> None:
    """Publish probes until the subscription, on another node, holds one:
    cluster interest is eventual (about one link round trip)."""
    for attempt in range(200):
        await publisher.publish("cross.probe", b"%d" % attempt)
        await publisher.flush()
        await trio.sleep(0.05)
        if subscription.statistics().buffered_messages:
            return
    raise AssertionError("nothing crossed the cluster link")


async def _delivered_across(publisher: Broker, subscriber: Broker) -> None:
    async with (
        publisher.connect() as pub,
        subscriber.connect() as sub,
        sub.subscription("cross.>") as subscription,
    ):
        await _probe_until_delivered(pub, subscription)


async def test_two_nodes_link_over_mutual_tls(nursery: trio.Nursery, tmp_path: Path) -> None:
    ca = trustme.CA()
    files = write_cert(ca, tmp_path, "node", "127.0.0.1")
    port_a, port_b = free_ports(2)
    with trio.fail_after(15):
        node_a = await _node(nursery, _config(files, port_a, port_b))
        node_b = await _node(nursery, _config(files, port_b, port_a))
        await _delivered_across(node_a, node_b)
        await _delivered_across(node_b, node_a)
        for node in (node_a, node_b):
            (link,) = node.statistics().links
            assert link.connected
            assert link.connects == 1
        # The cluster port speaks TLS only: a plain client is refused ...
        cluster_a = f"127.0.0.1:{port_a}"
        assert "TLS-only port" in await connect_fails(cluster_a, None)
        # ... and so is a TLS client without a certificate from the cluster CA.
        assert "requires a client certificate" in await connect_fails(
            cluster_a, client_context(ca=files.ca)
        )


@pytest.mark.parametrize(
    ("b_ca", "b_identity", "a_refuses", "b_refuses"),
    [
        # B's certificate comes from another CA: both directions are refused.
        ("other", "127.0.0.1", "CERTIFICATE_VERIFY_FAILED", "TLS handshake failed"),
        # Same CA, but B's certificate does not name the address A dials:
        # A's link refuses B; B's link to A (client certificates carry no
        # address to check) comes up.
        ("same", "elsewhere.example", "IP address mismatch", ""),
    ],
)
async def test_a_node_with_a_wrong_certificate_is_refused(
    nursery: trio.Nursery,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    b_ca: str,
    b_identity: str,
    a_refuses: str,
    b_refuses: str,
) -> None:
    caplog.set_level(logging.WARNING)
    ca = trustme.CA()
    files_a = write_cert(ca, tmp_path, "a", "127.0.0.1")
    files_b = write_cert(ca if b_ca == "same" else trustme.CA(), tmp_path, "b", b_identity)
    port_a, port_b = free_ports(2)
    with trio.fail_after(10):
        node_a = await _node(nursery, _config(files_a, port_a, port_b))
        node_b = await _node(nursery, _config(files_b, port_b, port_a))
        link_a, link_b = node_a.statistics().links[0].name, node_b.statistics().links[0].name

        def refusals(link: str) -> list[str]:
            return [r.getMessage() for r in caplog.records if f"link {link}: refused" in r.message]

        await eventually(lambda: bool(refusals(link_a)))
        assert a_refuses in refusals(link_a)[0]
        assert "cluster_tls_ca" in refusals(link_a)[0]  # says what to fix
        if b_refuses:
            await eventually(lambda: bool(refusals(link_b)))
            assert b_refuses in refusals(link_b)[0]
        else:
            await eventually(lambda: node_b.statistics().links[0].connected)
        # The listeners log their side of each failed handshake.
        await eventually(
            lambda: any("closed: protocol_error (TLS handshake failed" in r.message
                        for r in caplog.records if r.name == "broky.connection")
        )  # fmt: skip
        await trio.sleep(0.3)  # a few reconnection attempts
    (status,) = node_a.statistics().links
    assert not status.connected  # never came up
    assert status.connects == 0
    # Retries do not repeat the warning.
    assert len(refusals(link_a)) == 1


async def test_a_reload_renews_the_cluster_certificate(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Renewed cluster certificate files are loaded into the running
    listener's context: here the renewal names another host, so a client
    that checks for 127.0.0.1 is accepted before and refused after."""
    ca = trustme.CA()
    files = write_cert(ca, tmp_path, "node", "127.0.0.1")
    port_a, port_b = free_ports(2)
    config = _config(files, port_a, port_b)
    node = await _node(nursery, config)
    cluster = f"127.0.0.1:{port_a}"
    member = client_context(files.ca, files.cert, files.key)
    with trio.fail_after(10):
        async with broky.connect(cluster, ssl_context=member):
            pass
        renewed = write_cert(ca, tmp_path, "renewed", "elsewhere.example")
        shutil.copyfile(renewed.cert, files.cert)
        shutil.copyfile(renewed.key, files.key)
        applied = reread(lambda: config, node.config)
        assert applied is not None
        node.reload(applied)
        assert "IP address mismatch" in await connect_fails(cluster, member)


async def test_cluster_tls_names_admit_only_the_named_nodes(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Node A admits only "node-b" on its cluster port: B's links come up,
    while another certificate from the same cluster CA is refused, saying
    why, as a link or as a client."""
    ca = trustme.CA()
    files_a = write_cert(ca, tmp_path, "a", "127.0.0.1", common_name="node-a")
    files_b = write_cert(ca, tmp_path, "b", "127.0.0.1", common_name="node-b")
    port_a, port_b = free_ports(2)
    with trio.fail_after(15):
        node_a = await _node(
            nursery, _config(files_a, port_a, port_b, cluster_tls_names=("node-b",))
        )
        node_b = await _node(nursery, _config(files_b, port_b, port_a))
        await _delivered_across(node_a, node_b)  # over B's link, admitted by A
        intruder = write_cert(ca, tmp_path, "intruder", "127.0.0.1", common_name="intruder")
        context = client_context(files_a.ca, intruder.cert, intruder.key)
        with pytest.raises(BrokyError) as refused:
            async with broky.connect(f"127.0.0.1:{port_a}", ssl_context=context):
                pass  # pragma: no cover
    assert refused.value.code is ErrorCode.PERMISSION_DENIED
    assert "admits only the nodes in its cluster_tls_names" in str(refused.value)
    assert "intruder" in str(refused.value)


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    """A port that accepts connections (into the kernel's backlog) and never answers."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port: int = listener.socket.getsockname()[1]
    yield port
    await listener.aclose()


def _dialer(port: int) -> Connector:
    async def connect() -> trio.abc.Stream:
        return await trio.open_tcp_stream("127.0.0.1", port)

    return connect


async def test_a_link_handshake_is_bounded_by_the_timeout(tmp_path: Path, silent_port: int) -> None:
    files = write_cert(trustme.CA(), tmp_path, "node", "127.0.0.1")
    context = client_context(files.ca, files.cert, files.key)
    started = trio.current_time()
    with (
        trio.fail_after(3),
        pytest.raises(LinkHandshakeError, match=r"not completed within 0\.3 s"),
    ):
        await tls_connector(_dialer(silent_port), context, "127.0.0.1", 0.3)()
    assert trio.current_time() - started < 1.5


async def test_a_handshake_cancelled_midway_closes_its_socket(
    tmp_path: Path, silent_port: int
) -> None:
    """A link or client cancelled during its TLS handshake (a broker shutting
    down, a caller's deadline) closes the socket it opened: a leaked one
    would warn when collected, which fails this test."""
    files = write_cert(trustme.CA(), tmp_path, "node", "127.0.0.1")
    context = client_context(files.ca, files.cert, files.key)
    with trio.move_on_after(0.2) as link_scope:
        await tls_connector(_dialer(silent_port), context, "127.0.0.1", 10)()
    with trio.move_on_after(0.2) as client_scope:
        async with broky.connect(f"127.0.0.1:{silent_port}", ssl_context=context):
            pass
    assert link_scope.cancelled_caught
    assert client_scope.cancelled_caught
    gc.collect()


@pytest.mark.slow
async def test_two_broky_serve_nodes_deliver_over_tls_links(tmp_path: Path) -> None:
    files = write_cert(trustme.CA(), tmp_path, "node", "127.0.0.1")
    ports = free_ports(2)
    cluster = [f"127.0.0.1:{port}" for port in ports]
    settings = tmp_path / "cluster.toml"
    settings.write_text(
        f'cluster_tls_cert = "{files.cert}"\n'
        f'cluster_tls_key = "{files.key}"\n'
        f'cluster_tls_ca = "{files.ca}"\n'
    )

    def args(index: int) -> list[str]:
        return ["--workers", "1", "--config", str(settings),
                "--cluster-listen", cluster[index], "--peers", cluster[1 - index]]  # fmt: skip

    with nodes() as start, trio.fail_after(30):
        node_a, node_b = start(args(0)), start(args(1))
        async with (
            broky.connect(node_a.address) as publisher,
            broky.connect(node_b.address) as subscriber,
            subscriber.subscription("cross.>") as subscription,
        ):
            await _probe_until_delivered(publisher, subscription)
            payloads = [b"m%d" % number for number in range(200)]
            for payload in payloads:
                await publisher.publish("cross.data", payload)
            await publisher.flush()
            data: list[bytes] = []
            async for message in subscription:  # late probes may come first
                if message.key == "cross.data":
                    data.append(message.payload)
                    if len(data) == len(payloads):
                        break
            assert data == payloads


def test_cluster_tls_settings_are_checked(tmp_path: Path) -> None:
    files = write_cert(trustme.CA(), tmp_path, "node", "127.0.0.1")
    cluster = {"cluster_listen": "127.0.0.1:7800", "peers": ["127.0.0.1:7801"]}
    with pytest.raises(ConfigError, match="cluster_tls_cert and cluster_tls_key go together"):
        Config.from_mapping({**cluster, "cluster_tls_cert": files.cert})
    with pytest.raises(ConfigError, match="cluster_tls_cert needs cluster_tls_ca"):
        Config.from_mapping(
            {**cluster, "cluster_tls_cert": files.cert, "cluster_tls_key": files.key}
        )
    with pytest.raises(ConfigError, match="cluster_tls_ca needs cluster_tls_cert"):
        Config.from_mapping({**cluster, "cluster_tls_ca": files.ca})
    with pytest.raises(ConfigError, match="cluster_tls_ca: no such file"):
        Config.from_mapping(
            {**cluster, "cluster_tls_cert": files.cert, "cluster_tls_key": files.key,
             "cluster_tls_ca": "/nonexistent.pem"}
        ).cluster_tls_contexts()  # fmt: skip
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate")
    with pytest.raises(
        ConfigError, match="cannot load cluster_tls_cert/cluster_tls_key/cluster_tls_ca"
    ):
        Config.from_mapping(
            {**cluster, "cluster_tls_cert": files.cert, "cluster_tls_key": files.key,
             "cluster_tls_ca": str(not_pem)}
        ).cluster_tls_contexts()  # fmt: skip
    assert Config.from_mapping(cluster).cluster_tls_contexts() is None
    with pytest.raises(ConfigError, match="cluster_tls_names needs cluster_tls_cert"):
        Config.from_mapping({**cluster, "cluster_tls_names": ["node-b"]})
    with pytest.raises(ConfigError, match="cluster_tls_names holds certificate identities"):
        Config.from_mapping(
            {**cluster, "cluster_tls_cert": files.cert, "cluster_tls_key": files.key,
             "cluster_tls_ca": files.ca, "cluster_tls_names": [" padded"]}
        )  # fmt: skip


def test_a_nodes_client_connections_to_its_peers_trust_and_present_its_own_files(
    tmp_path: Path,
) -> None:
    """What a node's dead-letter publisher speaks to other nodes' client
    ports (Config.peer_client_context): TLS only where its own client port
    speaks it; the nodes' CA and certificate when cluster_tls_* is set,
    else tls_client_ca and its tls_cert."""
    client_ca, cluster_ca = trustme.CA(), trustme.CA()
    node = write_cert(client_ca, tmp_path, "node", "127.0.0.1")
    linked = write_cert(cluster_ca, tmp_path, "linked", "127.0.0.1")
    served = {"tls_cert": node.cert, "tls_key": node.key, "tls_client_ca": node.ca}
    cluster = {
        "cluster_tls_cert": linked.cert,
        "cluster_tls_key": linked.key,
        "cluster_tls_ca": linked.ca,
    }
    assert Config.from_mapping({}).peer_client_context() is None
    assert Config.from_mapping(cluster).peer_client_context() is None
    for settings, prefix, ca in [
        (served, "tls", client_ca),
        ({**served, **cluster}, "cluster_tls", cluster_ca),
    ]:
        found = Config.from_mapping(settings).peer_client_context()
        assert found is not None
        context, presented = found
        assert presented == prefix
        # That CA alone: not the system's, nor the other one.
        expected = ssl.PEM_cert_to_DER_cert(ca.cert_pem.bytes().decode())
        assert context.get_ca_certs(binary_form=True) == [expected]
