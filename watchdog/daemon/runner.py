"""Run the daemon from typed launch options: what ``gpu-watchdog run`` and the ``make run`` demo share.

Errors in the configuration or the environment exit 2 with a message naming the culprit.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpu_triage.daemon.config import ConfigError, load_config, override, resolve_config_path
from gpu_triage.model.snapshot import Snapshot

log = logging.getLogger("gpu_watchdog")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What a launcher may set on top of the configuration file (``None``: the file's value)."""

    config: Path | None = None
    source: str | None = None
    listen: str | None = None
    state_dir: Path | None = None
    progress_dir: Path | None = None
    period_s: float | None = None
    mode: str | None = None
    summary: bool = False
    """Print a one-line state summary every second."""
    sim_start_s: float | None = None
    """Epoch second at which a ``sim`` source's scenario starts (the demo starts it mid-timeline)."""
    kernel_log_file: Path | None = None
    """A kernel log FILE for the health signal (``[health] kernel_log_file``): a replay's, or lines
    fed to a simulation."""

    def overrides(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for value, key in (
            (self.source, "daemon.source"),
            (self.listen, "daemon.listen"),
            (self.state_dir, "daemon.state_dir"),
            (self.progress_dir, "progress.dir"),
            (self.period_s, "daemon.period_s"),
            (self.mode, "actions.mode"),
            (self.kernel_log_file, "health.kernel_log_file"),
        ):
            if value is not None:
                out[key] = str(value) if isinstance(value, Path) else value
        return out


NOFILE_TARGET = 65536
"""Open files the daemon wants (the systemd unit sets LimitNOFILE= to the same)."""


def raise_nofile(target: int = NOFILE_TARGET) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE toward ``target`` (within the hard limit): at the usual soft 1024,
    a thousand client sockets would starve the process scan and the event store of descriptors
    (EMFILE). Returns (before, after); logs when it stays low."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (OSError, ValueError) as e:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, want, e)
            return soft, soft
        log.info("open-files limit raised from %d to %d", soft, want)
        return soft, want
    if soft != resource.RLIM_INFINITY and soft < 4096:
        log.warning("open-files limit is %d (hard %d): set LimitNOFILE=%d in the unit", soft, hard, target)
    return soft, soft


def run_daemon(options: RunOptions) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT; 0 after a clean stop, 2 on bad config."""
    from gpu_triage.daemon.loop import Daemon
    from gpu_triage.daemon.reload import install_signal_handlers
    from gpu_triage.daemon.summary import summary_line
    from gpu_triage.model.samples import TelemetryUnavailable
    from gpu_triage.serving.http_server import PortInUseError
    from gpu_triage.telemetry.factory import make_source

    try:
        path = resolve_config_path(options.config)
        config = load_config(path, os.environ)
        flags = options.overrides()
        if flags:
            config = override(config, flags, origin="command line")
    except ConfigError as e:
        print(f"gpu-watchdog run: {e}", file=sys.stderr)
        return 2
    from gpu_triage.journal.logs import configure as configure_logging

    configure_logging(config.daemon.log_level, config.daemon.log_format, stream=sys.stderr)
    raise_nofile()
    try:
        source = make_source(config.daemon.source, deadline_s=config.daemon.nvml_deadline_s, log=log)
    except (ValueError, TelemetryUnavailable) as e:
        print(f"gpu-watchdog run: daemon.source = {config.daemon.source!r}: {e}", file=sys.stderr)
        return 2
    if options.sim_start_s is not None and hasattr(source, "start_s"):
        source.start_s = options.sim_start_s
    last_print = [0.0]

    def print_summary(snap: Snapshot) -> None:
        if snap.time - last_print[0] >= 1.0:
            last_print[0] = snap.time
            print(summary_line(snap), flush=True)

    daemon = Daemon(
        config,
        source,
        config_path=path,
        on_cycle=print_summary if options.summary else None,
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
