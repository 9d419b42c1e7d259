"""Broker configuration: a few named settings, loadable from TOML.

Errors name the bad key and what it accepts; there are no hidden knobs.
"""

from __future__ import annotations

import ipaddress
import ssl
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import attrs

from broky.cluster.etcd import parse_endpoints
from broky.cluster.keys import check_name
from broky.connection.settings import ConnectionSettings
from broky.durable.config import DurableConfigError, parse_policies
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES, MIN_MAX_FRAME_BYTES
from broky.router.limits import RouterLimits
from broky.security.auth import AuthConfigError, User, parse_users
from broky.security.tls import client_context, server_context
from broky.storage.topics import TopicPolicy

#: Broky's registered-looking default port (NATS uses 4222, MQTT 1883).
DEFAULT_PORT: Final = 7722
#: The Prometheus endpoint's default port (when metrics_listen is on).
DEFAULT_METRICS_PORT: Final = 7723
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
ACCEPT_MODES: Final = ("reuseport", "handoff")
#: Largest single message by default: 1 MiB, nats-server's max_payload.
DEFAULT_MAX_MESSAGE_BYTES: Final = 1024 * 1024
#: Connections one broker (one worker) serves at once by default.
DEFAULT_MAX_CONNECTIONS: Final = 10_000
#: Bytes queued for one connection across all its subscriptions, by default.
DEFAULT_MAX_PENDING_BYTES: Final = 64 * 1024 * 1024


_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "bool | None": (bool,),
    "tuple[str, ...]": (list, tuple),
}


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key."""


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{attribute.name} must be > 0, got {value!r}")


def _not_negative(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ConfigError(f"{attribute.name} must be >= 0 (0 turns it off), got {value!r}")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (an empty host means every interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def _users(users: Iterable[User]) -> tuple[User, ...]:
    return tuple(users)


def _policies(policies: Iterable[TopicPolicy]) -> tuple[TopicPolicy, ...]:
    return tuple(policies)


def _valid_port(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not 0 <= value <= 65535:
        raise ConfigError(f"{attribute.name} must be 0..65535 (0 picks a free port), got {value!r}")


@attrs.frozen(kw_only=True)
class Config:
    """Everything a broker can be told. Defaults serve a local in-memory broker."""

    host: str = "127.0.0.1"
    port: int = attrs.field(default=DEFAULT_PORT)
    listen: bool = True
    #: Worker processes for ``broky serve`` (0: one per core); each runs a router.
    workers: int = attrs.field(default=0, validator=_not_negative)
    #: How connections reach workers: "reuseport" (each worker accepts on its
    #: own SO_REUSEPORT socket) or "handoff" (the supervisor accepts and hands
    #: sockets to workers round-robin). See docs/architecture.md.
    accept: str = attrs.field(default="reuseport")
    #: HOST:PORT for other nodes' links; worker i listens on PORT + i. Empty: no cluster.
    cluster_listen: str = ""
    #: Other nodes' cluster_listen addresses (HOST:PORT each), for a full mesh.
    peers: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    log_level: str = attrs.field(default="info")
    max_frame_bytes: int = attrs.field(default=DEFAULT_MAX_FRAME_BYTES)
    heartbeat_interval: float = attrs.field(default=10.0, validator=_positive)
    idle_timeout: float = attrs.field(default=30.0, validator=_positive)
    handshake_timeout: float = attrs.field(default=5.0, validator=_positive)
    #: Seconds of grace a started frame gets before it must keep arriving at
    #: MIN_FRAME_BYTES_PER_SECOND (see broky.connection.liveness).
    frame_timeout: float = attrs.field(default=10.0, validator=_positive)
    outbox_messages: int = attrs.field(default=RouterLimits().outbox_messages, validator=_positive)
    outbox_bytes: int = attrs.field(default=RouterLimits().outbox_bytes, validator=_positive)
    write_batch_bytes: int = attrs.field(
        default=RouterLimits().write_batch_bytes, validator=_positive
    )
    max_subscriptions_per_connection: int = attrs.field(
        default=RouterLimits().max_subscriptions_per_connection, validator=_positive
    )
    #: Bound of what one router queues for one peer router's link.
    link_outbox_bytes: int = attrs.field(
        default=RouterLimits().link_outbox_bytes, validator=_positive
    )
    #: PEM certificate chain and key of the client listener; both set: the
    #: listener speaks TLS only (1.2 or newer). See docs/security.md.
    tls_cert: str = ""
    tls_key: str = ""
    #: PEM CA bundle; set: clients must present a certificate it signed (mTLS).
    tls_client_ca: str = ""
    #: PEM certificate chain and key of this node on cluster links: the cluster
    #: listener's certificate, and the client certificate its outgoing links
    #: present. Both set: node-to-node links are mutual TLS only.
    cluster_tls_cert: str = ""
    cluster_tls_key: str = ""
    #: PEM CA bundle every peer node's certificate must chain to (required
    #: with cluster_tls_cert). Use a CA for nodes alone: it admits any holder.
    cluster_tls_ca: str = ""
    #: Certificate identities (subject CN, DNS or email name) of the nodes the
    #: cluster port admits; empty: any holder of a cluster_tls_ca certificate.
    cluster_tls_names: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    #: Serve Prometheus /metrics and /healthz on metrics_host:metrics_port.
    metrics_listen: bool = False
    metrics_host: str = "127.0.0.1"
    metrics_port: int = attrs.field(default=DEFAULT_METRICS_PORT, validator=_valid_port)
    #: How many of the busiest keys get per-topic figures (K).
    metrics_top_topics: int = attrs.field(default=RouterLimits().top_topics, validator=_positive)
    #: Seconds between $SYS.metrics snapshots (0: none).
    system_metrics_interval: float = attrs.field(default=5.0, validator=_not_negative)
    #: Publish advisories on $SYS.events.*.
    system_events: bool = True
    #: Where durable topics keep their logs (required when ``durable`` is set).
    data_dir: str = ""
    #: Durable topic policies (``[[durable]]`` tables; broky.durable.config).
    #: Keys matching none stay ephemeral. Needs a single worker per node.
    durable: tuple[TopicPolicy, ...] = attrs.field(default=(), converter=_policies)
    #: Principals and their permissions (``[[users]]`` tables; broky.security.auth).
    #: None: no authentication (then only loopback listeners, unless allow_anonymous).
    users: tuple[User, ...] = attrs.field(default=(), converter=_users)
    #: Accept connections without credentials. Default (unset): only when no
    #: users are configured. Set true to listen beyond loopback with no users.
    allow_anonymous: bool | None = None
    #: Token this node's outgoing cluster links present to peers (whose
    #: [[users]] must hold it with ``link = true``). Keep the file private.
    cluster_token: str = ""
    #: Connections served at once (per worker); more are refused with LimitExceeded.
    max_connections: int = attrs.field(default=DEFAULT_MAX_CONNECTIONS, validator=_positive)
    #: Largest single message accepted; a publish with a bigger one gets a
    #: LimitExceeded stream error and that run is not delivered.
    max_message_bytes: int = attrs.field(default=DEFAULT_MAX_MESSAGE_BYTES, validator=_positive)
    #: Bytes queued for one connection across all its subscriptions; beyond
    #: it, each subscription's slow-consumer policy applies (drop or disconnect).
    max_pending_bytes: int = attrs.field(default=DEFAULT_MAX_PENDING_BYTES, validator=_positive)
    #: etcd holding the replicated cluster's metadata, ``etcd://HOST:PORT[,...]``
    #: (broky.cluster); empty: no replicated cluster.
    cluster_etcd: str = ""
    #: This node's id in the replicated cluster (required with cluster_etcd).
    node_id: str = ""
    #: The cluster's keys live under ``/broky/<cluster_name>/`` in etcd.
    cluster_name: str = "broky"
    #: Seconds a node's lease lasts without renewal: how long the partitions
    #: of a crashed node wait for new leaders (etcd may raise it to its floor).
    cluster_lease_ttl: int = attrs.field(default=1, validator=_positive)
    #: Copies of each partition; fixed by the first node of a new cluster.
    replication_factor: int = attrs.field(default=3, validator=_positive)
    #: Vbuckets the partitions are spread over; fixed like replication_factor.
    vbuckets: int = attrs.field(default=256, validator=_positive)
    #: HOST:PORT where this member serves replication fetches of its durable
    #: topics' partitions (broky.replication); empty: durable topics are not
    #: replicated (a member without it serves them alone, as before).
    replication_listen: str = ""
    #: Replicas (the leader included) that must be in sync for an
    #: ``acks = "all"`` publish; fewer and publishes fail with the retriable
    #: NotEnoughReplicas (Kafka's min.insync.replicas; 2 of 3 keeps every
    #: acked publish on two disks).
    min_insync_replicas: int = attrs.field(default=2, validator=_positive)
    #: Seconds a follower may stay behind the leader's log end before the
    #: leader drops it from the ISR (acks then wait for one fewer replica).
    replica_lag_max: float = attrs.field(default=5.0, validator=_positive)

    @port.validator
    def _check_port(self, attribute: attrs.Attribute[int], value: int) -> None:
        if not 0 <= value <= 65535:
            raise ConfigError(f"port must be 0..65535 (0 picks a free port), got {value!r}")

    @max_frame_bytes.validator
    def _check_frame(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value < MIN_MAX_FRAME_BYTES:
            raise ConfigError(f"max_frame_bytes must be >= {MIN_MAX_FRAME_BYTES}, got {value!r}")

    @log_level.validator
    def _check_level(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {value!r}")

    @accept.validator
    def _check_accept(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in ACCEPT_MODES:
            raise ConfigError(f"accept must be one of {', '.join(ACCEPT_MODES)}, got {value!r}")

    @peers.validator
    def _check_peers(
        self, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
    ) -> None:
        for peer in value:
            host, sep, port = str(peer).rpartition(":")
            if not (isinstance(peer, str) and sep and host and port.isdigit()):
                raise ConfigError(f"peers must be HOST:PORT strings, got {peer!r}")

    def __attrs_post_init__(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together: set both (TLS) or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca needs tls_cert and tls_key (mTLS is TLS first)")
        self._check_cluster_tls()
        self._check_replicated_cluster()
        if self.durable and not self.data_dir:
            raise ConfigError("durable topics need data_dir (where their logs live)")
        if self.cluster_listen:
            host, sep, port = self.cluster_listen.rpartition(":")
            if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
                raise ConfigError(
                    f"cluster_listen must be HOST:PORT with a port 1..65535, "
                    f"got {self.cluster_listen!r}"
                )
        self._check_anonymous()
        self._check_exposure()
        if self.heartbeat_interval >= self.idle_timeout:
            raise ConfigError(
                f"heartbeat_interval ({self.heartbeat_interval}) must be less than idle_timeout "
                f"({self.idle_timeout}): clients answer pings, they do not send them unasked"
            )

    def _check_anonymous(self) -> None:
        if self.allow_anonymous is False and not self.users:
            raise ConfigError(
                "allow_anonymous = false needs [[users]]: without users nobody could connect"
            )

    def _check_exposure(self) -> None:
        """Refuse to listen beyond loopback with nobody to authenticate.

        An open broker on a reachable address lets anyone read every topic;
        that must be the operator's explicit choice (``allow_anonymous``),
        never the accident of a default.
        """
        if self.users or self.allow_anonymous is True:
            return
        exposed = []
        if self.listen and not is_loopback(self.host) and not self.tls_client_ca:
            exposed.append(f"host {self.host!r}")
        if (
            self.cluster_listen
            and not is_loopback(self.cluster_listen.rpartition(":")[0])
            and not self.cluster_tls_ca
        ):
            exposed.append(f"cluster_listen {self.cluster_listen!r}")
        if exposed:
            raise ConfigError(
                f"refusing to listen on {' and '.join(exposed)} without authentication: "
                "configure [[users]] (see docs/security.md), require client certificates "
                "(tls_client_ca; cluster_tls_ca for cluster_listen), or set "
                "allow_anonymous = true to serve anyone who can connect"
            )

    def _check_cluster_tls(self) -> None:
        if bool(self.cluster_tls_cert) != bool(self.cluster_tls_key):
            raise ConfigError(
                "cluster_tls_cert and cluster_tls_key go together: set both (TLS links) or neither"
            )
        if self.cluster_tls_cert and not self.cluster_tls_ca:
            raise ConfigError(
                "cluster_tls_cert needs cluster_tls_ca: links are mutual TLS, and peers' "
                "certificates are checked against that CA"
            )
        if self.cluster_tls_ca and not self.cluster_tls_cert:
            raise ConfigError(
                "cluster_tls_ca needs cluster_tls_cert and cluster_tls_key (this node's own "
                "certificate on its links)"
            )
        if self.cluster_tls_names and not self.cluster_tls_ca:
            raise ConfigError(
                "cluster_tls_names needs cluster_tls_cert, cluster_tls_key and cluster_tls_ca: "
                "the names are read from verified node certificates"
            )
        for name in self.cluster_tls_names:
            if not isinstance(name, str) or not name.strip() or name != name.strip():
                raise ConfigError(
                    f"cluster_tls_names holds certificate identities (a CN, DNS name or email "
                    f"address), not {name!r}"
                )

    def _check_replicated_cluster(self) -> None:
        if not self.cluster_etcd:
            if self.node_id:
                raise ConfigError("node_id needs cluster_etcd (the etcd holding the cluster)")
            return
        if not self.node_id:
            raise ConfigError("cluster_etcd needs node_id: every node of a cluster has its own")
        try:
            parse_endpoints(self.cluster_etcd)
            check_name("node_id", self.node_id)
            check_name("cluster_name", self.cluster_name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def _check_files(self, *names: str) -> None:
        """Name the setting whose file is missing (OpenSSL's errors do not)."""
        for name in names:
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(f"{name}: no such file {path!r}")

    def tls_context(self) -> ssl.SSLContext | None:
        """The client listener's TLS context (None: plain TCP). Reads the files."""
        if not self.tls_cert:
            return None
        self._check_files("tls_cert", "tls_key", "tls_client_ca")
        try:
            return server_context(self.tls_cert, self.tls_key, self.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load tls_cert/tls_key/tls_client_ca: {exc}") from exc

    def cluster_tls_contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
        """The cluster links' TLS contexts, (listener, outgoing links), or None
        for plain TCP links. Reads the files.

        The listener requires a client certificate from ``cluster_tls_ca``;
        outgoing links present ``cluster_tls_cert`` and check the peer's
        certificate against that CA and the host (name or IP) in ``peers``.
        """
        if not self.cluster_tls_cert:
            return None
        self._check_files("cluster_tls_cert", "cluster_tls_key", "cluster_tls_ca")
        cert, key, ca = self.cluster_tls_cert, self.cluster_tls_key, self.cluster_tls_ca
        try:
            return server_context(cert, key, ca), client_context(ca, cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load cluster_tls_cert/cluster_tls_key/cluster_tls_ca: {exc}"
            ) from exc

    def peer_client_context(self) -> tuple[ssl.SSLContext, str] | None:
        """The TLS context this node's own client connections to other
        nodes' client ports use (a dead letter for another node's leader),
        with the prefix of the settings whose certificate it presents (a
        reload loads it again); None for plain TCP. Reads the files.

        None unless this node's client port speaks TLS (``tls_cert``): a
        cluster's nodes share their TLS settings, so its client ports are
        all TLS or all plain. The peer's certificate must chain to
        ``cluster_tls_ca`` (the nodes' CA), else to ``tls_client_ca``, else
        to the system's CAs, and name the host dialled. For a peer that
        requires client certificates (``tls_client_ca``), the node presents
        ``cluster_tls_cert`` (its identity on links), else its ``tls_cert``.
        """
        if not self.tls_cert:
            return None
        prefix = "cluster_tls" if self.cluster_tls_cert else "tls"
        cert, key = getattr(self, f"{prefix}_cert"), getattr(self, f"{prefix}_key")
        ca = self.cluster_tls_ca or self.tls_client_ca
        self._check_files(f"{prefix}_cert", f"{prefix}_key", "cluster_tls_ca", "tls_client_ca")
        try:
            return client_context(ca, cert, key), prefix
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the TLS files for other nodes' client ports: {exc}"
            ) from exc

    @property
    def router_limits(self) -> RouterLimits:
        """The router's share of the settings."""
        return RouterLimits(
            outbox_messages=self.outbox_messages,
            outbox_bytes=self.outbox_bytes,
            write_batch_bytes=self.write_batch_bytes,
            max_subscriptions_per_connection=self.max_subscriptions_per_connection,
            top_topics=self.metrics_top_topics,
            link_outbox_bytes=self.link_outbox_bytes,
            max_pending_bytes=self.max_pending_bytes,
        )

    @property
    def connection_settings(self) -> ConnectionSettings:
        """The connections' share of the settings."""
        return ConnectionSettings(
            max_frame_bytes=self.max_frame_bytes,
            heartbeat_interval=self.heartbeat_interval,
            idle_timeout=self.idle_timeout,
            handshake_timeout=self.handshake_timeout,
            frame_timeout=self.frame_timeout,
            max_message_bytes=self.max_message_bytes,
        )

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> Config:
        """Build from a mapping, checking every key and type."""
        fields = {field.name: field for field in attrs.fields(cls)}
        if "durable" in values:
            try:
                values = {**values, "durable": parse_policies(values["durable"])}
            except DurableConfigError as exc:
                raise ConfigError(str(exc)) from exc
        users = values.get("users", ())
        if not isinstance(users, (list, tuple)) or not all(isinstance(u, User) for u in users):
            try:
                values = {**values, "users": parse_users(values["users"])}
            except AuthConfigError as exc:
                raise ConfigError(str(exc)) from exc
        for key, value in values.items():
            if key in ("durable", "users"):
                continue
            field = fields.get(key)
            if field is None:
                raise ConfigError(
                    f"unknown setting {key!r}; accepted settings: {', '.join(sorted(fields))}"
                )
            expected = _TYPES[str(field.type)]
            if value is None and str(field.type).endswith("| None"):
                continue
            if not isinstance(value, expected) or (
                isinstance(value, bool) and str(field.type) not in ("bool", "bool | None")
            ):
                raise ConfigError(f"{key} must be of type {field.type}, got {value!r}")
        return cls(**values)

    @classmethod
    def from_toml(cls, path: Path) -> Config:
        """Load a TOML file of top-level settings and ``[[durable]]`` tables."""
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        return cls.from_mapping(data)
