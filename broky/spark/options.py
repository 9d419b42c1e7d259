"""The connector's options, parsed once into typed values.

Spark hands a data source its options as a case-insensitive mapping that
stores keys lowercased; copying it into a plain dict keeps only the
lowercase keys, so every lookup here goes through ``_get`` with the
lowercased name. Options are documented camelCase, as Spark's own are.

Errors are ``BrokyOptionError`` and name the option and what it accepts: a
bad option is the caller's mistake and must not surface as a stray
KeyError from a Spark worker.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import tempfile
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Final

import attrs

from broky.client.client import Client
from broky.client.credentials import ANONYMOUS, Credentials
from broky.security.tls import client_context
from broky.spark.planning import OffsetSpec, TopicSelection

#: Rows a read task covers at most when the source knows partition sizes
#: (a broker): a million 100-byte messages take a core about a second, so
#: a big partition still spreads over every core without tiny tasks.
DEFAULT_ROWS_PER_RANGE: Final = 1_000_000
#: Bytes one Fetch asks for: large enough for few round trips, within the
#: broker's default frame limit.
DEFAULT_FETCH_BYTES: Final = 4 * 1024 * 1024


class BrokyOptionError(ValueError):
    """An option is missing or malformed; the message names it."""


@attrs.frozen
class BrokerEndpoint:
    """How to reach a broker: its address, credentials and TLS files.

    Plain values, so that it pickles to Spark's Python workers; each
    connection builds its TLS context there (an SSLContext does not pickle).
    """

    address: str
    credentials: Credentials = ANONYMOUS
    #: Speak TLS (trusting ``tls_ca``, or the system's CAs when empty).
    tls: bool = False
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""

    def __str__(self) -> str:
        return self.address

    def connect(self, name: str) -> AbstractAsyncContextManager[Client]:
        """``broky.connect`` to this broker."""
        context: ssl.SSLContext | None = None
        if self.tls:
            context = client_context(self.tls_ca, self.tls_cert, self.tls_key)
        return self.credentials.connect(self.address, name, context)

    @classmethod
    def parse(cls, options: Mapping[str, str], address: str) -> BrokerEndpoint:
        """From options ``user``, ``password``, ``token``, ``tls``, ``tlsCa``,
        ``tlsCert`` and ``tlsKey`` (any TLS file turns TLS on)."""
        user, password, token = (_get(options, name) for name in ("user", "password", "token"))
        if bool(user) != bool(password):
            raise BrokyOptionError("options user and password go together")
        if token and user:
            raise BrokyOptionError("give options user and password, or option token, not both")
        files = {name: _get(options, name) or "" for name in ("tlsCa", "tlsCert", "tlsKey")}
        if files["tlsKey"] and not files["tlsCert"]:
            raise BrokyOptionError("option tlsKey needs option tlsCert")
        return cls(
            address=address,
            credentials=Credentials(user or "", password or "", token or ""),
            tls=_bool(options, "tls", False) or any(files.values()),
            tls_ca=files["tlsCa"],
            tls_cert=files["tlsCert"],
            tls_key=files["tlsKey"],
        )


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    if value is None:
        value = options.get(name)
    return None if value is None else str(value)


def _int(options: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    text = _get(options, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BrokyOptionError(f"option {name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise BrokyOptionError(f"option {name} must be at least {minimum}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _get(options, name)
    if text is None:
        return default
    if text.lower() not in {"true", "false"}:
        raise BrokyOptionError(f"option {name} must be true or false, got {text!r}")
    return text.lower() == "true"


def parse_offsets(name: str, text: str | None, default: str) -> OffsetSpec:
    """``earliest`` / ``latest``, one offset for every partition, or JSON
    ``{"topic": {"partition": offset}}``."""
    if text is None:
        return default
    text = text.strip()
    if text in {"earliest", "latest"}:
        return text
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        table = json.loads(text)
        if not isinstance(table, dict):
            raise TypeError("not an object")
        return {
            str(topic): {str(int(partition)): int(offset) for partition, offset in entry.items()}
            for topic, entry in table.items()
        }
    except (ValueError, TypeError, AttributeError):
        raise BrokyOptionError(
            f'option {name} must be earliest, latest, an offset or JSON {{"topic": '
            f'{{"partition": offset}}}}, got {text!r}'
        ) from None


def parse_time(name: str, text: str) -> int:
    """A time option as ns since the epoch: an integer (ns) or ISO 8601
    (UTC when it names no zone)."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BrokyOptionError(
            f"option {name} must be ns since the epoch or an ISO 8601 time, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def parse_selection(options: Mapping[str, str]) -> TopicSelection:
    """``topic`` (comma-separated names), ``topicPattern`` (a regex the whole
    name must match) and ``partitions`` (comma-separated numbers)."""
    names = frozenset(
        name.strip() for name in (_get(options, "topic") or "").split(",") if name.strip()
    )
    pattern_text = _get(options, "topicPattern")
    pattern = None
    if pattern_text is not None:
        try:
            pattern = re.compile(pattern_text)
        except re.error as exc:
            raise BrokyOptionError(f"option topicPattern is not a valid regex: {exc}") from None
    partitions_text = _get(options, "partitions") or ""
    try:
        partitions = frozenset(int(item) for item in partitions_text.split(",") if item.strip())
    except ValueError:
        raise BrokyOptionError(
            f"option partitions must be comma-separated numbers, got {partitions_text!r}"
        ) from None
    return TopicSelection(names, pattern, partitions)


@attrs.frozen
class ReadOptions:
    """Options of ``spark.read`` and ``spark.readStream``.

    Exactly one of ``data_dir`` (``path``/``load(path)``: read segment files
    offline) and ``broker`` (``HOST:PORT``: read through Fetch) is set.
    """

    data_dir: str | None
    broker: BrokerEndpoint | None
    selection: TopicSelection
    starting: OffsetSpec
    ending: OffsetSpec
    #: ``[start, stop)`` on ``ts_broker`` in ns, or None for all time.
    time_range: tuple[int, int] | None
    rows_per_range: int
    fetch_bytes: int
    max_rows_per_batch: int
    fail_on_data_loss: bool
    #: Batch reads only: prune with the query's filters (``FilteringBatchReader``).
    push_filters: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool = False) -> ReadOptions:
        """Parse and check the options; raises BrokyOptionError."""
        data_dir = _get(options, "path") or _get(options, "dataDir")
        broker = _get(options, "broker")
        if (data_dir is None) == (broker is None):
            raise BrokyOptionError(
                "give either a data directory (load(path) or option dataDir) or option broker "
                "(HOST:PORT), not both"
                if data_dir
                else "give a data directory (load(path) or option dataDir) or option broker"
            )
        if streaming and broker is None:
            raise BrokyOptionError(
                "streaming reads need option broker (HOST:PORT): the broker knows which topics "
                "are durable and how far each partition goes"
            )
        start_time = _get(options, "startTime")
        end_time = _get(options, "endTime")
        time_range = None
        if start_time is not None or end_time is not None:
            time_range = (
                parse_time("startTime", start_time) if start_time is not None else -(2**63),
                parse_time("endTime", end_time) if end_time is not None else 2**63 - 1,
            )
        ending_text = _get(options, "endingOffsets")
        push_filters = _bool(options, "pushFilters", False)
        for name, given in (
            ("endingOffsets", ending_text is not None),
            ("pushFilters", push_filters),
        ):
            if streaming and given:
                raise BrokyOptionError(f"option {name} is for batch reads only")
        starting = parse_offsets(
            "startingOffsets",
            _get(options, "startingOffsets"),
            "latest" if streaming else "earliest",
        )
        ending = parse_offsets("endingOffsets", ending_text, "latest")
        if not streaming and (starting == "latest" or ending == "earliest"):
            raise BrokyOptionError(
                "a batch read from startingOffsets=latest or to endingOffsets=earliest reads "
                "nothing; give offsets (or use a stream to read what comes next)"
            )
        return cls(
            data_dir=data_dir,
            broker=BrokerEndpoint.parse(options, broker) if broker is not None else None,
            selection=parse_selection(options),
            starting=starting,
            ending=ending,
            time_range=time_range,
            rows_per_range=_int(options, "maxRowsPerPartition", DEFAULT_ROWS_PER_RANGE),
            fetch_bytes=_int(options, "fetchBytes", DEFAULT_FETCH_BYTES, minimum=1024),
            max_rows_per_batch=_int(options, "maxRowsPerBatch", 0),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            push_filters=push_filters,
        )


@attrs.frozen
class WriteOptions:
    """Options of ``df.write`` and ``df.writeStream``."""

    broker: BrokerEndpoint
    #: Where tasks stage rows until the driver commits; must be visible to
    #: the driver and every executor (shared storage on a cluster).
    staging_dir: str
    #: Key for rows without a ``key`` column (or with a null key).
    default_key: str | None
    #: Batch writes only: the id of this write within ``staging_dir`` (for
    #: ``foreachBatch``: pass its batch id, and a replayed batch is not
    #: published twice). None: a write of its own, never deduplicated.
    batch_id: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> WriteOptions:
        """Parse and check the options; raises BrokyOptionError.

        A streaming sink stages under its checkpoint by default
        (``<checkpointLocation>/broky-sink``), which is what makes replays
        after a restart recognisable; a batch write under the temp dir.
        """
        broker = _get(options, "broker")
        if broker is None:
            raise BrokyOptionError("option broker (HOST:PORT) is required to write to Broky")
        staging = _get(options, "stagingLocation")
        if staging is None:
            checkpoint = _get(options, "checkpointLocation")
            if streaming and checkpoint is None:
                raise BrokyOptionError(
                    "a streaming write needs option checkpointLocation or stagingLocation"
                )
            staging = (
                os.path.join(checkpoint, "broky-sink")
                if streaming and checkpoint is not None
                else os.path.join(tempfile.gettempdir(), "broky-spark-staging")
            )
        if staging.startswith("file:"):
            staging = staging.removeprefix("file:")
        batch_id = None
        if _get(options, "batchId") is not None:
            if streaming:
                raise BrokyOptionError("option batchId is for batch writes (foreachBatch) only")
            if _get(options, "stagingLocation") is None:
                raise BrokyOptionError(
                    "option batchId needs option stagingLocation: the record of published "
                    "batch ids lives there"
                )
            batch_id = _int(options, "batchId", 0)
        return cls(
            broker=BrokerEndpoint.parse(options, broker),
            staging_dir=staging,
            default_key=_get(options, "key"),
            batch_id=batch_id,
        )
