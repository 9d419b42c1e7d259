"""Reloading a running broker's configuration on SIGHUP.

Users and ``allow_anonymous`` are what an operator changes while clients
stay connected (a new service, a revoked one, a rotated secret); they take
effect at once, live connections included (see Broker.reload). Every other
setting shapes listeners, workers or storage already built: a changed one is
named in a warning and takes effect at the next restart, so the broker never
runs half of a new configuration silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import attrs

from broky.config import Config, ConfigError

log = logging.getLogger("broky.reload")

#: The settings a reload applies to a running broker.
RELOADABLE: Final = frozenset({"users", "allow_anonymous"})


def needs_restart(running: Config, loaded: Config) -> list[str]:
    """The settings that differ between ``running`` and ``loaded`` but only
    take effect at a restart."""
    return [
        field.name
        for field in attrs.fields(Config)
        if field.name not in RELOADABLE
        and getattr(running, field.name) != getattr(loaded, field.name)
    ]


def reread(load: Callable[[], Config], running: Config) -> Config | None:
    """``running`` with the users and ``allow_anonymous`` loaded anew; None
    (logged) if the new configuration is invalid, so that a typo in the file
    keeps the running configuration rather than stopping the broker or
    applying part of it."""
    try:
        loaded = load()
        # The new users on the running listeners must pass the exposure rule.
        applied = attrs.evolve(running, users=loaded.users, allow_anonymous=loaded.allow_anonymous)
    except ConfigError as exc:
        log.error("configuration reload failed, nothing changed: %s", exc)
        return None
    restart = needs_restart(running, loaded)
    if restart:
        log.warning(
            "configuration reload: %s changed and take effect at the next restart",
            ", ".join(restart),
        )
    log.info(
        "configuration reloaded: %d user(s), allow_anonymous=%s",
        len(loaded.users),
        loaded.allow_anonymous,
    )
    return applied
