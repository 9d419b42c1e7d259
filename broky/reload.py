"""Reloading a running broker's configuration on SIGHUP.

Users and ``allow_anonymous`` are what an operator changes while clients
stay connected (a new service, a revoked one, a rotated secret); they take
effect at once, live connections included (see Broker.reload). TLS
certificates and keys are loaded again too, so that a renewed certificate
serves new handshakes without a restart (turning TLS on or off, or changing
a CA, still needs one). Every other setting shapes listeners, workers or
storage already built: a changed one is named in a warning and takes effect
at the next restart, so the broker never runs half of a new configuration
silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import attrs

from broky.config import Config, ConfigError

log = logging.getLogger("broky.reload")

#: Settings a reload applies to a running broker.
RELOADABLE: Final = frozenset({"users", "allow_anonymous"})
#: Certificate settings a reload applies while TLS stays on (or off) for them.
CERTIFICATES: Final = ("tls_cert", "tls_key", "cluster_tls_cert", "cluster_tls_key")


def applicable(running: Config, loaded: Config) -> dict[str, Any]:
    """The settings of ``loaded`` that a reload applies to ``running``."""
    settings = {name: getattr(loaded, name) for name in RELOADABLE}
    for name in CERTIFICATES:
        if bool(getattr(running, name)) == bool(getattr(loaded, name)):
            settings[name] = getattr(loaded, name)
    return settings


def needs_restart(running: Config, loaded: Config) -> list[str]:
    """The settings that differ between ``running`` and ``loaded`` but only
    take effect at a restart."""
    applied = applicable(running, loaded)
    return [
        field.name
        for field in attrs.fields(Config)
        if field.name not in applied and getattr(running, field.name) != getattr(loaded, field.name)
    ]


def reread(load: Callable[[], Config], running: Config) -> Config | None:
    """``running`` with what a reload applies loaded anew; None (logged) if
    the new configuration is invalid, so that a typo in the file keeps the
    running configuration rather than stopping the broker or applying part
    of it."""
    try:
        loaded = load()
        # The new users on the running listeners must pass the exposure rule.
        applied = attrs.evolve(running, **applicable(running, loaded))
        # The certificate files must load (into throwaway contexts).
        applied.tls_context()
        applied.cluster_tls_contexts()
    except ConfigError as exc:
        log.error("configuration reload failed, nothing changed: %s", exc)
        return None
    restart = needs_restart(running, loaded)
    if restart:
        log.warning(
            "configuration reload: %s changed and take effect at the next restart",
            ", ".join(restart),
        )
    renewed = [prefix for prefix in ("tls", "cluster_tls") if getattr(applied, f"{prefix}_cert")]
    log.info(
        "configuration reloaded: %d user(s), allow_anonymous=%s%s",
        len(loaded.users),
        loaded.allow_anonymous,
        f", certificates loaded again ({', '.join(renewed)})" if renewed else "",
    )
    return applied
