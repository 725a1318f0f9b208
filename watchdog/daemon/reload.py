"""SIGHUP and the other signals: the main thread owns them (SIGTERM/SIGINT stop the loop cleanly,
SIGHUP asks it to reload); the reload itself runs on the loop's thread between two cycles."""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import fields, replace
from typing import TYPE_CHECKING

from gpu_triage.daemon.build import (
    detector_settings,
    make_fleet,
    make_ras,
    make_reader,
    make_sampler,
    retarget_captures,
    validate_classifier,
)
from gpu_triage.daemon.config import (
    ActionsConfig,
    Config,
    load_config,
    load_token,
    missing_token_note,
    override,
    token_file_absent,
)
from gpu_triage.journal.logs import configure as configure_logging

if TYPE_CHECKING:
    from gpu_triage.daemon.loop import Daemon

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


def reload(d: Daemon) -> None:
    """Re-read the config file; apply what can change live (mode, detector, progress, stacks, RAS,
    cluster, the cycle periods, log lines, the token); what :data:`RESTART_ONLY` names needs a restart
    (each change logged, the running value kept). A config that does not load keeps the running one."""
    d.notifier.reloading()
    try:
        new = load_config(d.config_path, os.environ)
        if d.overrides:  # the same command line as at start: a flag is no change
            new = override(new, d.overrides, origin="command line")
        validate_classifier(new)
        token = load_token(new) if d._app is not None else None
    except Exception as e:
        log.error("reload failed, keeping the running configuration: %s", e)
        d._event("daemon", {"event": "reload_failed", "error": str(e)})
        d.notifier.ready("reload failed; running configuration kept")
        return
    new = keep_restart_only(d.config, new)
    if (new.daemon.log_level, new.daemon.log_format) != (
        d.config.daemon.log_level,
        d.config.daemon.log_format,
    ):
        configure_logging(new.daemon.log_level, new.daemon.log_format, stream=sys.stderr)
    d.detector.config = detector_settings(new)
    if new.stacks != d.config.stacks:
        d.stacks.close()
        d.stacks = make_sampler(new, d.clock)
    if new.ras != d.config.ras:
        d.ras = make_ras(new, d.clock)
    if d.actions is not None and (new.ras, new.stacks.py_spy) != (d.config.ras, d.config.stacks.py_spy):
        retarget_captures(d.actions, new)
    if new.cluster != d.config.cluster:
        d.fleet.close()
        d.fleet = make_fleet(new, d.clock)
    if new.progress != d.config.progress:
        d.progress = make_reader(new)
    if new.actions.mode != d.config.actions.mode:
        d.mode = new.actions.mode
    if d._app is not None:
        from gpu_triage.serving.api import set_token

        set_token(d._app, token)  # a rotated token file takes effect now; the old one stops
        if token_file_absent(new):
            log.warning("%s", missing_token_note(new))
        else:
            log.info("auth token re-read from %s", new.auth.token_file)
    d.config = new
    d._event("daemon", {"event": "reloaded", "config": new.origin})
    d.notifier.ready("configuration reloaded")
    log.info("configuration reloaded from %s", new.origin)


def install_signal_handlers(daemon: Daemon) -> None:
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: daemon.request_reload())
