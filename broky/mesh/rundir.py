"""The supervisor's run directory: its workers' link sockets, and who owns it.

Why: a supervisor removes its run directory when it stops, but one killed
by SIGKILL (or the OOM killer) cannot, and each such death left a directory
of dead Unix sockets behind in the temporary directory. A run directory now
records its owner (``supervisor.pid``: the PID and the process's start time,
so that a reused PID is not mistaken for it), and every supervisor removes
the run directories whose owner is gone before it makes its own. Directories
of older versions, without the file, are removed when they hold nothing but
worker sockets that nobody listens on. A directory whose owner lives is never
touched.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Final

log = logging.getLogger("broky.mesh")

#: Run directories are made in the temporary directory with this prefix.
RUN_DIR_PREFIX: Final = "broky-run-"
#: The prefix of older versions' run directories (no owner file).
LEGACY_PREFIX: Final = "broky-"
OWNER_FILE: Final = "supervisor.pid"
_WORKER_SOCKET: Final = re.compile(r"worker-\d+\.sock")


def process_start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, from
    /proc), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[19]  # field 22 of stat(5), counted after "pid (comm)"


def make_run_dir(base: str | None = None) -> Path:
    """Remove stale run directories under ``base`` (default: the temporary
    directory), then make this process's own, with its owner file."""
    base_dir = Path(base or tempfile.gettempdir())
    for stale in stale_run_dirs(base_dir):
        shutil.rmtree(stale, ignore_errors=True)
        log.info("removed the run directory of a supervisor that is gone: %s", stale)
    run_dir = Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=base_dir))
    pid = os.getpid()
    (run_dir / OWNER_FILE).write_text(f"{pid} {process_start_time(pid)}\n", encoding="ascii")
    return run_dir


def stale_run_dirs(base: Path) -> list[Path]:
    """Run directories under ``base`` whose supervisor is gone."""
    stale: list[Path] = []
    try:
        candidates = [path for path in base.iterdir() if path.name.startswith(LEGACY_PREFIX)]
    except OSError:
        return stale
    for path in candidates:
        try:
            if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            owner = path / OWNER_FILE
            if owner.exists():
                if not _owner_alive(owner.read_text(encoding="ascii")):
                    stale.append(path)
            elif _only_dead_worker_sockets(path):
                stale.append(path)
        except OSError:
            continue  # vanished meanwhile, or not ours to read
    return stale


def _owner_alive(text: str) -> bool:
    pid_text, _, started = text.strip().partition(" ")
    if not pid_text.isdigit():
        return False
    now = process_start_time(int(pid_text))
    return now is not None and (started in ("", "None") or now == started)


def _only_dead_worker_sockets(path: Path) -> bool:
    """Whether ``path`` holds worker sockets only, none of them listened on."""
    entries = list(path.iterdir())
    if not entries or not all(_WORKER_SOCKET.fullmatch(entry.name) for entry in entries):
        return False
    for entry in entries:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(entry))
            except (ConnectionRefusedError, FileNotFoundError):
                continue
            except OSError:
                return False
            return False  # someone listens: a live node of an older version
    return True
