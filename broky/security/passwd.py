"""``broky passwd``: make the hashes that ``[[users]]`` tables hold.

``broky passwd`` reads a password (prompting without echo on a terminal,
else one line from stdin) and prints its ``password_hash``;
``broky passwd --token`` makes a fresh random token and prints it once with
its ``token_hash`` (a SHA-256: 256 random bits need no slow hash, see
broky.security.passwords). The broker never needs the secret itself.
"""

from __future__ import annotations

import argparse
import getpass
import secrets
import sys
from typing import Any

from broky.security.passwords import DEFAULT_LOG_N, MAX_LOG_N, MIN_LOG_N, hash_secret, hash_token

#: Bytes of randomness in a generated token (256 bits, URL-safe text).
TOKEN_BYTES = 32


def add_parser(commands: Any) -> None:
    """Add ``passwd`` to the ``broky`` subcommands."""
    passwd = commands.add_parser(
        "passwd",
        help="hash a password (or make a token) for a [[users]] table",
        description="Print the scrypt hash to put in a [[users]] table of the config file.",
    )
    passwd.add_argument(
        "--token", action="store_true", help="generate a random token and print it with its hash"
    )
    passwd.add_argument(
        "--cost",
        type=int,
        default=DEFAULT_LOG_N,
        choices=range(MIN_LOG_N, MAX_LOG_N + 1),
        metavar=f"{{{MIN_LOG_N}..{MAX_LOG_N}}}",
        help=f"scrypt cost as log2(N) (default {DEFAULT_LOG_N}; +1 doubles time and memory; "
        "not used with --token)",
    )
    passwd.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the hash (and a generated token); returns the exit status."""
    if args.token:
        token = secrets.token_urlsafe(TOKEN_BYTES)
        print(f"token      = {token}")
        print(f'token_hash = "{hash_token(token)}"')
        print("# give the token to the client; put only token_hash in the config", file=sys.stderr)
        return 0
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("broky passwd: the passwords differ", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("broky passwd: empty password", file=sys.stderr)
        return 1
    print(f'password_hash = "{hash_secret(password, log_n=args.cost)}"')
    return 0
