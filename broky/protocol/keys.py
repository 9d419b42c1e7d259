"""Which characters a key or pattern may contain (the text rule of protocol.md §8).

Keys and patterns are UTF-8 text with no control character (Unicode category
Cc: U+0000-U+001F, U+007F-U+009F) and no whitespace (U+0020 and every other
character ``str.isspace`` accepts). A key reaches logs, ``$SYS`` JSON,
Prometheus labels and subscribers' strings: two byte keys must never decode to
the same string, and a key must never forge a log line or look like another.
The token structure (dots, wildcards, length) is checked by
``broky.router.matcher``, which calls this first.

Both checks are cheap enough for the broker's route-cache miss, the only place
it validates a key: an ASCII key costs one ``bytes.translate`` (no decode, no
regex); only a non-ASCII key is decoded and searched.
"""

from __future__ import annotations

import re
from typing import Final

from broky.protocol.constants import ErrorCode
from broky.protocol.errors import LocalProtocolError

#: The ASCII bytes a key may not hold: C0 controls, space and DEL.
_FORBIDDEN_ASCII: Final = bytes(range(0x21)) + b"\x7f"
#: Every forbidden character: controls (C0, DEL, C1) and Unicode whitespace.
_FORBIDDEN_TEXT: Final = re.compile(r"[\x00-\x20\x7f-\x9f\s]")


def text_problem(text: str) -> str | None:
    """Why ``text`` may not be a key or pattern (None: its characters are fine)."""
    found = _FORBIDDEN_TEXT.search(text)
    if found is None:
        return None
    return f"contains {found.group()!r} at character {found.start()} (control or whitespace)"


def key_bytes_problem(value: bytes) -> str | None:
    """Why the wire bytes ``value`` are not key text (None: they are)."""
    if value.isascii() and value.translate(None, _FORBIDDEN_ASCII) == value:
        return None  # the usual key: no decode, no regex
    try:
        text = value.decode()
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 (invalid byte at offset {exc.start})"
    return text_problem(text)


def encode_key(text: str, code: ErrorCode) -> bytes:
    """``text`` as wire bytes; LocalProtocolError carrying ``code`` when the
    broker would refuse its characters (a lone surrogate, a control
    character, whitespace), so a client finds out before sending."""
    try:
        encoded = text.encode()
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(
            f"{text!r} is not UTF-8 text (a lone surrogate at character {exc.start})", code
        ) from None
    except AttributeError:
        # Caught, not checked first: the publish path encodes a key per run.
        raise TypeError(
            f"a key or pattern is text (str), not {type(text).__name__}: {text!r}"
        ) from None
    problem = key_bytes_problem(encoded)  # the ASCII fast path: keys change per run
    if problem is not None:
        raise LocalProtocolError(f"{text!r} {problem}", code)
    return encoded
