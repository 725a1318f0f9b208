"""SIGHUP and the other signals: the main thread owns them (SIGTERM/SIGINT stop the loop cleanly,
SIGHUP asks it to reload); the reload itself runs on the loop's thread between two cycles."""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import replace
from typing import TYPE_CHECKING

from gpu_triage.daemon.build import (
    detector_settings,
    make_fleet,
    make_ras,
    make_reader,
    make_sampler,
    validate_classifier,
)
from gpu_triage.daemon.config import load_config, load_token, missing_token_note, override, token_file_absent

if TYPE_CHECKING:
    from gpu_triage.daemon.loop import Daemon

log = logging.getLogger("gpu_watchdog")


def reload(d: Daemon) -> None:
    """Re-read the config file; apply what can change live (mode, detector, classifier dwell,
    progress dir, stacks, RAS, cluster, the token); listen address, state dir and source need a
    restart (logged). A config that does not load keeps the running one."""
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
    for key in ("listen", "state_dir", "source"):
        if getattr(new.daemon, key) != getattr(d.config.daemon, key):
            log.warning("daemon.%s changed: takes effect after a restart", key)
    new = replace(
        new,
        daemon=replace(
            new.daemon,
            listen=d.config.daemon.listen,
            state_dir=d.config.daemon.state_dir,
            source=d.config.daemon.source,
        ),
    )
    d.detector.config = detector_settings(new)
    if new.stacks != d.config.stacks:
        d.stacks.close()
        d.stacks = make_sampler(new, d.clock)
    if new.ras != d.config.ras:
        d.ras = make_ras(new, d.clock)
    if new.cluster != d.config.cluster:
        d.fleet.close()
        d.fleet = make_fleet(new, d.clock)
    if new.health != d.config.health:
        for key in ("enabled", "kernel_log", "kernel_log_file"):
            if getattr(new.health, key) != getattr(d.config.health, key):
                log.warning("health.%s changed: takes effect after a restart", key)
        d.health.reconfigure(
            replace(
                new.health,
                enabled=d.config.health.enabled,
                kernel_log=d.config.health.kernel_log,
                kernel_log_file=d.config.health.kernel_log_file,
            )
        )
        new = replace(new, health=d.health.config)
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
