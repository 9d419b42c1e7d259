"""``broky pub`` and ``broky sub`` start without the broker's own modules.

The CLI builds one parser for every command; the server, the workers,
replication and the ``top`` view (prometheus_client with it) are imported
by the commands that run them (see ``broky/cli.py``). Checked in a fresh
interpreter: this test process imported all of them long before."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_parser_leaves_the_broker_modules_unimported() -> None:
    code = (
        "import sys\n"
        "from broky.cli import build_parser\n"
        "build_parser().parse_args(['pub', 'greet.world', 'hello'])\n"
        "heavy = ('broky.server', 'broky.mesh.workers', 'broky.replication.attach',\n"
        "         'broky.observability.top', 'prometheus_client', 'numpy')\n"
        "print(sorted(name for name in heavy if name in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
