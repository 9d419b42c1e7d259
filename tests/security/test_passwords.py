"""Password and token hashes: round trip, fresh salts, and every malformed form named.

Hashes use the cheapest accepted cost (log_n=10, ~1 MiB, a few ms).
"""

from __future__ import annotations

import base64
from typing import Final

import pytest

from broky.security.passwords import (
    DEFAULT_P,
    DEFAULT_R,
    HASH_BYTES,
    MAX_LOG_N,
    MIN_LOG_N,
    SALT_BYTES,
    SecretHash,
    SecretHashError,
    TokenDigest,
    hash_secret,
    hash_token,
    parse_hash,
    parse_token_hash,
)

CHEAP: Final = MIN_LOG_N
SALT: Final = base64.b64encode(b"s" * SALT_BYTES).decode()
DIGEST: Final = base64.b64encode(b"d" * HASH_BYTES).decode()


def encoded(*, params: str = "ln=10,r=8,p=1", salt: str = SALT, digest: str = DIGEST) -> str:
    return f"scrypt${params}${salt}${digest}"


@pytest.mark.parametrize("secret", ["hunter2", "correct horse battery staple", "pässwörd ✓"])
def test_round_trip(secret: str) -> None:
    decoded = parse_hash(hash_secret(secret, log_n=CHEAP))
    assert (decoded.log_n, decoded.r, decoded.p) == (CHEAP, DEFAULT_R, DEFAULT_P)
    assert (len(decoded.salt), len(decoded.digest)) == (SALT_BYTES, HASH_BYTES)
    assert decoded.matches(secret)


def test_a_wrong_secret_does_not_match() -> None:
    decoded = parse_hash(hash_secret("hunter2", log_n=CHEAP))
    for wrong in ("hunter3", "Hunter2", "hunter2 ", "hunter", ""):
        assert not decoded.matches(wrong), wrong


def test_each_hash_has_a_fresh_salt() -> None:
    first, second = (hash_secret("hunter2", log_n=CHEAP) for _ in range(2))
    assert first != second
    assert parse_hash(first).salt != parse_hash(second).salt
    assert parse_hash(first).matches("hunter2")
    assert parse_hash(second).matches("hunter2")


def test_the_cost_travels_with_the_hash() -> None:
    stronger = hash_secret("hunter2", log_n=CHEAP + 1, r=4)
    assert stronger.startswith(f"scrypt$ln={CHEAP + 1},r=4,p=1$")
    decoded = parse_hash(stronger)
    assert (decoded.log_n, decoded.r) == (CHEAP + 1, 4)
    assert decoded.matches("hunter2")


def test_the_digest_is_kept_out_of_repr() -> None:
    decoded = parse_hash(encoded())
    assert "digest" not in repr(decoded)
    assert repr(b"d" * HASH_BYTES) not in repr(decoded)


def test_a_tampered_digest_does_not_match() -> None:
    good = hash_secret("hunter2", log_n=CHEAP)
    scheme, params, salt, digest = good.split("$")
    flipped = bytearray(base64.b64decode(digest))
    flipped[-1] ^= 1
    tampered = "$".join((scheme, params, salt, base64.b64encode(bytes(flipped)).decode()))
    assert not parse_hash(tampered).matches("hunter2")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hunter2",
        encoded().replace("scrypt$", "bcrypt$"),
        encoded().replace("scrypt$", "argon2id$"),
        encoded(params="ln=10,r=8"),
        encoded(params="ln=-1,r=8,p=1"),
        encoded(salt=""),
        encoded(digest="not base64!"),
        encoded() + "$extra",
        " " + encoded(),
    ],
)
def test_other_forms_are_not_scrypt_hashes(text: str) -> None:
    with pytest.raises(SecretHashError, match=r"not an scrypt hash \(expected scrypt\$ln=N"):
        parse_hash(text)


@pytest.mark.parametrize(
    "params",
    [
        f"ln={MIN_LOG_N - 1},r=8,p=1",
        f"ln={MAX_LOG_N + 1},r=8,p=1",
        "ln=10,r=0,p=1",
        "ln=10,r=33,p=1",
        "ln=10,r=8,p=0",
        "ln=10,r=8,p=17",
    ],
)
def test_out_of_range_costs_are_named(params: str) -> None:
    with pytest.raises(SecretHashError, match=r"^scrypt parameters out of range") as caught:
        parse_hash(encoded(params=params))
    assert params.replace(",", ", ") in str(caught.value)


@pytest.mark.parametrize(
    ("salt", "digest"),
    [("abc", DIGEST), ("a===", DIGEST), (SALT, "abcde"), (SALT, "=abc")],
)
def test_bad_base64_is_named(salt: str, digest: str) -> None:
    with pytest.raises(SecretHashError, match=r"^bad base64 in the hash"):
        parse_hash(encoded(salt=salt, digest=digest))


@pytest.mark.parametrize(
    ("salt", "digest"),
    [
        (base64.b64encode(b"s" * 7).decode(), DIGEST),
        (SALT, base64.b64encode(b"d" * 15).decode()),
    ],
)
def test_short_salt_or_digest_is_refused(salt: str, digest: str) -> None:
    with pytest.raises(SecretHashError, match=r"^salt or digest too short \(at least 8 and 16"):
        parse_hash(encoded(salt=salt, digest=digest))


def test_shortest_accepted_salt_and_digest() -> None:
    decoded = parse_hash(
        encoded(
            salt=base64.b64encode(b"s" * 8).decode(), digest=base64.b64encode(b"d" * 16).decode()
        )
    )
    assert (len(decoded.salt), len(decoded.digest)) == (8, 16)


def test_secret_hash_error_is_a_value_error() -> None:
    assert issubclass(SecretHashError, ValueError)


def test_an_empty_secret_is_not_hashed() -> None:
    with pytest.raises(ValueError, match=r"^an empty password or token cannot be hashed"):
        hash_secret("", log_n=CHEAP)


@pytest.mark.parametrize("log_n", [0, MIN_LOG_N - 1, MAX_LOG_N + 1])
def test_hash_secret_refuses_an_out_of_range_cost(log_n: int) -> None:
    with pytest.raises(
        ValueError, match=rf"^log_n must be {MIN_LOG_N}\.\.{MAX_LOG_N}, got {log_n}$"
    ):
        hash_secret("hunter2", log_n=log_n)


# --- generated tokens' sha256 hashes -------------------------------------------


def test_token_hash_round_trip() -> None:
    encoded_hash = hash_token("a-generated-token")
    assert encoded_hash.startswith("sha256$")
    parsed = parse_token_hash(encoded_hash)
    assert isinstance(parsed, TokenDigest)
    assert parsed.matches("a-generated-token")
    assert not parsed.matches("a-generated-tokeN")
    assert parsed.encoded == encoded_hash
    assert "digest" not in repr(parsed)


def test_a_token_hash_may_also_be_scrypt() -> None:
    parsed = parse_token_hash(hash_secret("hand-chosen", log_n=CHEAP))
    assert isinstance(parsed, SecretHash)
    assert parsed.matches("hand-chosen")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("sha256$!!!", "not a token hash"),
        ("sha256$" + base64.b64encode(b"x" * 31).decode(), "holds 32 bytes, this one 31"),
        ("sha256$" + "A" * 43, "bad base64"),
        ("md5$abc", "not a token hash"),
        ("plain-token-in-the-config", "not a token hash"),
        ("scrypt$ln=10,r=8,p=1$%%$%%", "not an scrypt hash"),
    ],
)
def test_malformed_token_hashes_are_named(text: str, complaint: str) -> None:
    with pytest.raises(SecretHashError, match=complaint):
        parse_token_hash(text)


def test_an_empty_token_is_not_hashed() -> None:
    with pytest.raises(ValueError, match="empty token"):
        hash_token("")
