"""Config: every bad setting is refused with a message that names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from broky import Config, ConfigError
from broky.config import DEFAULT_PORT, LOG_LEVELS
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES, MIN_MAX_FRAME_BYTES

SETTINGS = [field.name for field in attrs.fields(Config)]


def test_defaults_serve_a_local_broker() -> None:
    config = Config()
    assert (config.host, config.port, config.listen) == ("127.0.0.1", DEFAULT_PORT, True)
    assert config.max_frame_bytes == DEFAULT_MAX_FRAME_BYTES
    assert config.log_level == "info"
    assert Config.from_mapping({}) == config


def test_unknown_key_is_named_with_the_accepted_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_mapping({"port": 1, "max_frame_byte": 70000})
    message = str(caught.value)
    assert "'max_frame_byte'" in message
    for name in SETTINGS:
        assert name in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("port", "7722"),
        ("port", 7722.0),
        ("port", True),
        ("listen", 1),
        ("listen", "yes"),
        ("host", 127),
        ("log_level", None),
        ("idle_timeout", "30"),
        ("idle_timeout", False),
        ("outbox_bytes", 1.5),
        ("max_frame_bytes", [65536]),
    ],
)
def test_wrong_type_is_named(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"^{key} must be of type") as caught:
        Config.from_mapping({key: value})
    assert repr(value) in str(caught.value)


def test_int_is_accepted_for_a_float_setting() -> None:
    config = Config.from_mapping({"idle_timeout": 5, "heartbeat_interval": 0.5})
    assert config.idle_timeout == 5
    assert config.heartbeat_interval == 0.5


@pytest.mark.parametrize("port", [-1, 65536, 100_000])
def test_bad_port(port: int) -> None:
    with pytest.raises(ConfigError, match=r"^port must be 0\.\.65535"):
        Config.from_mapping({"port": port})


@pytest.mark.parametrize("port", [0, 1, 65535])
def test_port_bounds_are_inclusive(port: int) -> None:
    assert Config.from_mapping({"port": port}).port == port


@pytest.mark.parametrize("level", ["verbose", "INFO", "", "warn"])
def test_bad_log_level_lists_the_levels(level: str) -> None:
    with pytest.raises(ConfigError, match=r"^log_level must be one of") as caught:
        Config.from_mapping({"log_level": level})
    for name in LOG_LEVELS:
        assert name in str(caught.value)


@pytest.mark.parametrize(
    "key",
    [
        "heartbeat_interval",
        "idle_timeout",
        "handshake_timeout",
        "frame_timeout",
        "outbox_messages",
        "outbox_bytes",
        "write_batch_bytes",
        "max_subscriptions_per_connection",
    ],
)
@pytest.mark.parametrize("value", [0, -1])
def test_non_positive_settings_are_refused(key: str, value: int) -> None:
    with pytest.raises(ConfigError, match=rf"^{key} must be > 0"):
        Config.from_mapping({key: value})


def test_negative_fractional_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^idle_timeout must be > 0, got -0\.5"):
        Config(idle_timeout=-0.5)


def test_frame_limit_below_the_protocol_minimum() -> None:
    with pytest.raises(ConfigError, match=rf"^max_frame_bytes must be >= {MIN_MAX_FRAME_BYTES}"):
        Config.from_mapping({"max_frame_bytes": MIN_MAX_FRAME_BYTES - 1})
    assert Config(max_frame_bytes=MIN_MAX_FRAME_BYTES).max_frame_bytes == MIN_MAX_FRAME_BYTES


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "broky.toml"
    path.write_text(
        "\n".join(
            [
                "# a broker for tests",
                'host = "0.0.0.0"',
                "port = 7000",
                "listen = false",
                'log_level = "debug"',
                "max_frame_bytes = 1048576",
                "heartbeat_interval = 2.5",
                "idle_timeout = 10",
                "outbox_bytes = 262144",
            ]
        )
    )
    config = Config.from_toml(path)
    assert config == Config(
        host="0.0.0.0",
        port=7000,
        listen=False,
        log_level="debug",
        max_frame_bytes=1024 * 1024,
        heartbeat_interval=2.5,
        idle_timeout=10,
        outbox_bytes=256 * 1024,
    )
    assert config.router_limits.outbox_bytes == 256 * 1024
    assert config.connection_settings.heartbeat_interval == 2.5
    assert config.connection_settings.max_frame_bytes == 1024 * 1024


def test_file_with_a_bad_value_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "broky.toml"
    path.write_text('port = "http"\n')
    with pytest.raises(ConfigError, match=r"^port must be of type int"):
        Config.from_toml(path)


def test_file_with_a_table_is_an_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "broky.toml"
    path.write_text("[broker]\nport = 7000\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'broker'"):
        Config.from_toml(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match=r"cannot read config file .*absent\.toml"):
        Config.from_toml(path)


def test_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("port = = 3\n")
    with pytest.raises(ConfigError, match=r"is not valid TOML"):
        Config.from_toml(path)


def test_heartbeat_must_be_shorter_than_the_idle_timeout() -> None:
    with pytest.raises(ConfigError, match="heartbeat_interval"):
        Config(heartbeat_interval=30.0, idle_timeout=30.0)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"cluster_etcd": "etcd://127.0.0.1:2379"}, "needs node_id"),
        ({"node_id": "n1"}, "node_id needs cluster_etcd"),
        ({"cluster_etcd": "127.0.0.1:2379", "node_id": "n1"}, "cluster must be etcd://"),
        ({"cluster_etcd": "etcd://127.0.0.1:2379", "node_id": "n/1"}, "node_id must be"),
        (
            {"cluster_etcd": "etcd://a:1", "node_id": "n1", "cluster_name": ""},
            "cluster_name must be",
        ),
        ({"cluster_lease_ttl": 0}, "cluster_lease_ttl must be > 0"),
        ({"replication_factor": 0}, "replication_factor must be > 0"),
    ],
)
def test_replicated_cluster_settings_are_checked(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_mapping(values)
