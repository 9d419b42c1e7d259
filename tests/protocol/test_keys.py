"""The key text rule (docs/protocol.md section 8) against an independent reference.

The reference is written from the rule's words: strict UTF-8, no character of
Unicode category Cc, none that ``str.isspace`` accepts. It shares no code with
``broky.protocol.keys`` (which uses a byte table and a regex of ranges).
"""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.constants import ErrorCode
from broky.protocol.errors import LocalProtocolError
from broky.protocol.keys import encode_key, key_bytes_problem, text_problem


def reference_allows_text(text: str) -> bool:
    return not any(unicodedata.category(c) == "Cc" or c.isspace() for c in text)


def reference_allows(value: bytes) -> bool:
    try:
        text = value.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        return False
    return reference_allows_text(text)


#: Pieces near the rule's edges, joined at random: allowed text, forbidden
#: ASCII, C1 controls and Unicode spaces in UTF-8, stray and truncated bytes,
#: an encoded surrogate, an overlong ".".
EDGES = (
    *(b"a", b".", b"\xc3\xa9", b"\xf0\x9f\x92\xbb"),
    *(b" ", b"\x00", b"\x1f", b"\x7f", b"\xc2\x85", b"\xc2\xa0", b"\xe2\x80\xa8"),
    *(b"\xff", b"\x80", b"\xc3", b"\xed\xa0\x80", b"\xc0\xae"),
)
tricky_bytes = st.lists(st.sampled_from(EDGES), max_size=8).map(b"".join)
#: Any text, lone surrogates included (drawn explicitly: they are rare otherwise).
any_text = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=20),
    st.lists(st.sampled_from(["a", ".", " ", "\x00", "\x85", "\u2028", "\xe9", "\ud800"])).map(
        "".join
    ),
)


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=40),
        tricky_bytes,
        any_text.map(lambda text: text.encode("utf-8", "surrogatepass")),
    )
)
def test_bytes_rule_matches_the_reference(value: bytes) -> None:
    problem = key_bytes_problem(value)
    assert (problem is None) == reference_allows(value), (value, problem)


@settings(max_examples=500, deadline=None)
@given(any_text)
def test_encode_key_refuses_exactly_what_the_broker_refuses(text: str) -> None:
    try:
        encoded = text.encode()
    except UnicodeEncodeError:
        allowed = False  # a lone surrogate has no UTF-8 form
    else:
        allowed = reference_allows_text(text)
    if allowed:
        assert encode_key(text, ErrorCode.INVALID_KEY) == encoded
        assert text_problem(text) is None
        return
    with pytest.raises(LocalProtocolError) as caught:
        encode_key(text, ErrorCode.INVALID_PATTERN)
    assert caught.value.code is ErrorCode.INVALID_PATTERN


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"bad.\xff\xfe", "is not UTF-8 (invalid byte at offset 4)"),
        (b"a.\x00", "contains '\\x00' at character 2"),
        (b"a b", "contains ' ' at character 1"),
        ("\u00e9\u3000".encode(), "contains '\\u3000' at character 1"),
    ],
)
def test_problems_name_the_byte_or_character(value: bytes, says: str) -> None:
    problem = key_bytes_problem(value)
    assert problem is not None
    assert problem.startswith(says)


def test_lone_surrogate_is_named() -> None:
    with pytest.raises(LocalProtocolError, match="lone surrogate at character 2"):
        encode_key("a.\udcff", ErrorCode.INVALID_KEY)


def test_a_key_given_as_bytes_is_a_clear_type_error() -> None:
    """``client.publish(b"orders.eu", ...)``: a TypeError that says keys are
    text, not an AttributeError from inside the encoder."""
    with pytest.raises(TypeError, match=r"text \(str\), not bytes: b'orders.eu'"):
        encode_key(b"orders.eu", ErrorCode.INVALID_KEY)  # type: ignore[arg-type]
