"""SIGHUP and the other signals: the main thread owns them (SIGTERM/SIGINT stop the loop cleanly,
SIGHUP asks it to reload); the reload itself runs on the loop's thread between two cycles
(:meth:`gpu_triage.daemon.loop.Daemon.reload`), from the configuration :func:`reread` returns."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from gpu_triage.daemon.build import validate_classifier
from gpu_triage.daemon.config import Config, load_config, load_token, override

log = logging.getLogger("gpu_watchdog")

RESTART_ONLY = ("listen", "state_dir", "source")
"""``[daemon]`` keys a reload cannot change (logged; they take effect after a restart)."""


def reread(
    path: Path | None, overrides: Mapping[str, Any], running: Config, *, serving: bool
) -> tuple[Config, str | None]:
    """The configuration file read again, with the same command-line overrides as at start (a flag is
    no change), checked as at start, and the keys that need a restart kept at their running values;
    with the token when the daemon serves HTTP. Raises whatever loading or checking raises (the
    caller keeps the running configuration)."""
    new = load_config(path, os.environ)
    if overrides:
        new = override(new, dict(overrides), origin="command line")
    validate_classifier(new)
    token = load_token(new) if serving else None
    for key in RESTART_ONLY:
        if getattr(new.daemon, key) != getattr(running.daemon, key):
            log.warning("daemon.%s changed: takes effect after a restart", key)
    pinned = replace(
        new,
        daemon=replace(
            new.daemon,
            listen=running.daemon.listen,
            state_dir=running.daemon.state_dir,
            source=running.daemon.source,
        ),
    )
    return pinned, token


class Controllable(Protocol):
    def stop(self) -> None: ...

    def request_reload(self) -> None: ...


def install_signal_handlers(daemon: Controllable) -> None:
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: daemon.request_reload())
