"""``gpu-watchdog run``: build the configuration, the telemetry source and the daemon; run until
a signal. Errors in the configuration or the environment exit 2 with a message naming the culprit."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from gpu_triage.daemon.config import ConfigError, load_config, override, resolve_config_path

log = logging.getLogger("gpu_watchdog")


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {}
    for flag, key in (
        ("source", "daemon.source"),
        ("listen", "daemon.listen"),
        ("state_dir", "daemon.state_dir"),
        ("progress_dir", "progress.dir"),
        ("period", "daemon.period_s"),
        ("mode", "actions.mode"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            out[key] = str(value) if isinstance(value, Path) else value
    return out


def run_daemon(args: argparse.Namespace) -> int:
    from gpu_triage.daemon.loop import Daemon, install_signal_handlers, summary_line
    from gpu_triage.serving.http_server import PortInUseError
    from gpu_triage.telemetry.factory import make_source
    from gpu_triage.telemetry.types import TelemetryUnavailable

    try:
        path = resolve_config_path(Path(args.config) if args.config else None)
        config = load_config(path, os.environ)
        flags = _overrides(args)
        if flags:
            config = override(config, flags, origin="command line")
    except ConfigError as e:
        print(f"gpu-watchdog run: {e}", file=sys.stderr)
        return 2
    from gpu_triage.journal.logs import configure as configure_logging

    configure_logging(config.daemon.log_level, config.daemon.log_format, stream=sys.stderr)
    try:
        source = make_source(config.daemon.source, deadline_s=config.daemon.nvml_deadline_s, log=log)
    except (ValueError, TelemetryUnavailable) as e:
        print(f"gpu-watchdog run: daemon.source = {config.daemon.source!r}: {e}", file=sys.stderr)
        return 2
    if getattr(args, "sim_start", None) is not None and hasattr(source, "start_s"):
        source.start_s = args.sim_start
    last_print = [0.0]

    def print_summary(snap) -> None:
        if snap.time - last_print[0] >= 1.0:
            last_print[0] = snap.time
            print(summary_line(snap), flush=True)

    daemon = Daemon(
        config,
        source,
        config_path=path,
        on_cycle=print_summary if args.summary else None,
        overrides=flags,
    )
    try:
        daemon.start()
    except PortInUseError as e:
        print(f"gpu-watchdog run: daemon.listen: {e} (another gpu-watchdog?)", file=sys.stderr)
        source.close()
        return 2
    except (ConfigError, OSError) as e:
        print(f"gpu-watchdog run: {e}", file=sys.stderr)
        source.close()
        return 2
    install_signal_handlers(daemon)
    log.info(
        "gpu-watchdog listening on %s (source %s, mode %s, state %s)",
        daemon.url,
        source.name,
        daemon.mode,
        config.daemon.state_dir,
    )
    started = time.monotonic()
    try:
        daemon.run_forever()
    finally:
        daemon.close()
    log.info(
        "stopped after %.0f s, %d cycles, %d missed",
        time.monotonic() - started,
        daemon.stats.cycles,
        daemon.stats.missed,
    )
    return 0
