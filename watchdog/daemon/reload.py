"""SIGHUP and the other signals: the main thread owns them (SIGTERM/SIGINT stop the loop cleanly,
SIGHUP asks it to reload); the reload itself runs on the loop's thread between two cycles
(:meth:`gpu_triage.daemon.loop.Daemon.reload`), from the configuration :func:`reread` returns."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Protocol

from gpu_triage.daemon.build import validate_classifier
from gpu_triage.daemon.config import ActionsConfig, Config, load_config, load_token, override

log = logging.getLogger("gpu_watchdog")

#: What a reload cannot apply (the parts built from it at start keep their values): section -> keys
#: (None: every key). A change to one is logged as needing a restart, and the running value is kept.
RESTART_ONLY: dict[str, tuple[str, ...] | None] = {
    "daemon": ("node", "source", "listen", "allowed_hosts", "state_dir", "nvml_deadline_s"),
    "classifier": None,
    "events": None,
    "evidence": None,
    "actions": tuple(f.name for f in fields(ActionsConfig) if f.name != "mode"),
    "alerts": None,
}


def keep_restart_only(running: Config, new: Config) -> Config:
    """``new`` with the running value of every key in :data:`RESTART_ONLY`, each change logged."""
    sections = {}
    for section, names in RESTART_ONLY.items():
        old_part, new_part = getattr(running, section), getattr(new, section)
        kept = {}
        for f in fields(old_part):
            if names is not None and f.name not in names:
                continue
            if getattr(new_part, f.name) != getattr(old_part, f.name):
                log.warning("%s.%s changed: takes effect after a restart", section, f.name)
                kept[f.name] = getattr(old_part, f.name)
        if kept:
            sections[section] = replace(new_part, **kept)
    return replace(new, **sections) if sections else new


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
    return keep_restart_only(running, new), token


class Controllable(Protocol):
    def stop(self) -> None: ...

    def request_reload(self) -> None: ...


def install_signal_handlers(daemon: Controllable) -> None:
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: daemon.request_reload())
