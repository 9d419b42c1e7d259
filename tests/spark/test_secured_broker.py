"""The connector against a broker with TLS and users: options ``user``,
``password``, ``token``, ``tlsCa`` (and friends) reach Spark's workers, and
wrong credentials or missing permissions fail with the broker's reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trustme

from broky import AuthenticationError, connect
from broky.client.credentials import Credentials
from broky.security.passwords import hash_secret
from broky.security.tls import client_context
from broky.spark.logs import BrokerLog
from broky.spark.options import BrokerEndpoint, BrokyOptionError
from broky.spark.planning import TopicSelection
from tests.security.helpers import CertFiles, write_cert
from tests.spark.conftest import BrokerProcess

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")

from pyspark.sql import SparkSession  # noqa: E402 - after the importorskip guard

ROWS = 50


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return write_cert(trustme.CA(), tmp_path_factory.mktemp("tls"), "server", "127.0.0.1")


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory, certificate: CertFiles
) -> Iterator[BrokerProcess]:
    """A broker on TLS with an analyst (may read `batch`) and an outsider."""
    process = BrokerProcess(
        tmp_path_factory.mktemp("secured"),
        f'tls_cert = "{certificate.cert}"\ntls_key = "{certificate.key}"\n'
        f'[[users]]\nname = "analyst"\npassword_hash = "{hash_secret("an-pw", log_n=10)}"\n'
        f'[[users]]\nname = "outsider"\ntoken_hash = "{hash_secret("out-tok", log_n=10)}"\n'
        'subscribe = ["elsewhere.>"]\n',
    )

    async def fill() -> None:
        async with connect(
            process.address,
            ssl_context=client_context(certificate.ca),
            user="analyst",
            password="an-pw",
        ) as client:
            for number in range(ROWS):
                await client.publish(f"batch.k{number % 5}", b"%d" % number, ack=True)
            await client.flush_acks()

    try:
        trio.run(fill)
        yield process
    finally:
        process.stop()


def endpoint(process: BrokerProcess, certificate: CertFiles, **options: str) -> BrokerEndpoint:
    return BrokerEndpoint.parse({"tlsca": certificate.ca, **options}, process.address)


def test_options_parse_into_an_endpoint() -> None:
    parsed = BrokerEndpoint.parse({"user": "u", "password": "p", "tlsca": "ca.pem"}, "h:1")
    assert parsed == BrokerEndpoint("h:1", Credentials("u", "p"), True, "ca.pem")
    assert BrokerEndpoint.parse({"token": "t", "tls": "true"}, "h:1").credentials.token == "t"
    assert not BrokerEndpoint.parse({}, "h:1").tls
    for options, message in [
        ({"user": "u"}, "user and password go together"),
        ({"user": "u", "password": "p", "token": "t"}, "not both"),
        ({"tlskey": "k.pem"}, "tlsKey needs option tlsCert"),
    ]:
        with pytest.raises(BrokyOptionError, match=message):
            BrokerEndpoint.parse(options, "h:1")


def test_broker_log_authenticates_and_follows_permissions(
    secured: BrokerProcess, certificate: CertFiles
) -> None:
    everything = TopicSelection()
    analyst = BrokerLog(endpoint(secured, certificate, user="analyst", password="an-pw"), 1 << 20)
    spans = analyst.spans(everything)
    assert sum(span.end - span.start for span in spans if span.topic == "batch") == ROWS
    outsider = BrokerLog(endpoint(secured, certificate, token="out-tok"), 1 << 20)
    assert outsider.spans(everything) == []  # it may read no durable topic
    wrong = BrokerLog(endpoint(secured, certificate, user="analyst", password="nope"), 1 << 20)
    with pytest.raises(AuthenticationError, match="authentication failed"):
        wrong.spans(everything)


def test_spark_reads_a_secured_broker(
    spark: SparkSession, secured: BrokerProcess, certificate: CertFiles
) -> None:
    frame = (
        spark.read.format("broky")
        .option("broker", secured.address)
        .option("topic", "batch")
        .option("user", "analyst")
        .option("password", "an-pw")
        .option("tlsCa", certificate.ca)
        .load()
    )
    payloads = sorted(int(row.payload) for row in frame.select("payload").collect())
    assert payloads == list(range(ROWS))


def test_spark_writes_to_a_secured_broker(
    spark: SparkSession, secured: BrokerProcess, certificate: CertFiles, tmp_path: Path
) -> None:
    rows = [(f"batch.written{number}", b"w%d" % number) for number in range(10)]
    (
        spark.createDataFrame(rows, "key string, payload binary")
        .write.format("broky")
        .mode("append")
        .option("broker", secured.address)
        .option("user", "analyst")
        .option("password", "an-pw")
        .option("tlsCa", certificate.ca)
        .option("stagingLocation", str(tmp_path / "staging"))
        .save()
    )
    analyst = BrokerLog(endpoint(secured, certificate, user="analyst", password="an-pw"), 1 << 20)
    spans = analyst.spans(TopicSelection(frozenset({"batch"})))
    assert sum(span.end - span.start for span in spans) == ROWS + 10
