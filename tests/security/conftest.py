"""Fixtures shared by the security tests: a throwaway CA with the broker's
certificate, and a record of the slow hash checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from broky.security.passwords import SecretHash
from tests.security.helpers import CertFiles, write_cert


@pytest.fixture
def ca() -> trustme.CA:
    """A CA made for this test only."""
    return trustme.CA()


@pytest.fixture
def server(ca: trustme.CA, tmp_path: Path) -> CertFiles:
    """The broker's certificate for 127.0.0.1, signed by ``ca``."""
    return write_cert(ca, tmp_path, "server", "127.0.0.1")


@pytest.fixture
def hash_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The secrets every slow hash check was given, in order (from worker threads)."""
    checked: list[str] = []
    matches = SecretHash.matches

    def counting(self: SecretHash, secret: str) -> bool:
        checked.append(secret)
        return matches(self, secret)

    monkeypatch.setattr(SecretHash, "matches", counting)
    return checked
