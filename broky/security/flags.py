"""The client-side TLS and credential flags of ``broky pub``, ``sub``, ``top`` and ``bench``.

One definition, so that every command that connects to a broker spells them
the same way and builds the same ``client_context``.
"""

from __future__ import annotations

import argparse
import os
import ssl

from broky.client.credentials import ANONYMOUS, Credentials
from broky.config import ConfigError
from broky.security.tls import client_context


def add_client_tls_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--tls``, ``--tls-ca``, ``--tls-cert`` and ``--tls-key``."""
    group = parser.add_argument_group("TLS (for a broker with tls_cert set)")
    group.add_argument(
        "--tls", action="store_true", help="speak TLS, trusting the system's CAs (or --tls-ca)"
    )
    group.add_argument("--tls-ca", help="PEM CA bundle the broker's certificate must chain to")
    group.add_argument("--tls-cert", help="PEM client certificate chain, for mTLS")
    group.add_argument("--tls-key", help="PEM key of --tls-cert (if not in the same file)")


def wants_tls(args: argparse.Namespace) -> bool:
    """Whether any client TLS flag was given (each one turns TLS on)."""
    return bool(args.tls or args.tls_ca or args.tls_cert or args.tls_key)


def client_tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The context the flags describe (None: plain TCP); reads the files.

    Raises ConfigError naming the flags when a file cannot be loaded, so the
    command stops before it connects.
    """
    if not wants_tls(args):
        return None
    if args.tls_key and not args.tls_cert:
        raise ConfigError("--tls-key needs --tls-cert (the certificate the key belongs to)")
    try:
        return client_context(args.tls_ca or "", args.tls_cert or "", args.tls_key or "")
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load --tls-ca/--tls-cert/--tls-key: {exc}") from exc


def add_client_auth_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--user``, ``--password`` and ``--token`` (secrets also from the environment)."""
    group = parser.add_argument_group("credentials (for a broker with [[users]])")
    group.add_argument("--user", default="", help="user name (with --password or BROKY_PASSWORD)")
    group.add_argument(
        "--password",
        default=None,
        help="password; prefer the BROKY_PASSWORD environment variable (ps shows arguments)",
    )
    group.add_argument(
        "--token", default=None, help="token; prefer the BROKY_TOKEN environment variable"
    )


def client_credentials(args: argparse.Namespace) -> Credentials:
    """The credentials the flags and environment describe; ConfigError if incomplete."""
    password = args.password if args.password is not None else os.environ.get("BROKY_PASSWORD")
    token = args.token if args.token is not None else os.environ.get("BROKY_TOKEN")
    if args.user:
        if not password:
            raise ConfigError("--user needs a password: --password or BROKY_PASSWORD")
        return Credentials(user=args.user, password=password)
    if args.password is not None:
        raise ConfigError("--password needs --user")
    if token:
        return Credentials(token=token)
    return ANONYMOUS
