"""Run the daemon from typed launch options: what ``gpu-watchdog run`` and the ``make run`` demo share.

Errors in the configuration or the environment exit 2 with a message naming the culprit.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_triage.daemon.config import Config, ConfigError, load_config, override, resolve_config_path
from gpu_triage.model.snapshot import Snapshot

if TYPE_CHECKING:
    from gpu_triage.daemon.loop import Daemon

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
    sim_job: int | None = None
    """A ``sim`` source's simulated job: its launcher's pid, a session leader. The daemon judges that
    session's processes and no other process of the machine (None: no process at all)."""
    on_started: Callable[[], None] | None = field(default=None, compare=False)
    """Called once the daemon listens, before its first cycle (``make run`` prints its banner there,
    so a port in use exits 2 before any URL is shown)."""

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


class SimJobError(ValueError):
    """``--sim-job`` cannot be honoured (the message says why)."""


def build_daemon(
    config: Config,
    *,
    config_path: Path | None = None,
    overrides: dict[str, object] | None = None,
    on_cycle: Callable[[Snapshot], None] | None = None,
    sim_start_s: float | None = None,
    sim_job: int | None = None,
) -> Daemon:
    """The daemon ``run`` starts, built from ``config``: the log lines (``daemon.log_level``,
    ``log_format``), the telemetry source (``daemon.source``, ``nvml_deadline_s``), then the
    :class:`~gpu_triage.daemon.loop.Daemon` (its parts from ``daemon/build.py``). Not started.
    ``sim_job``: the simulated job's session leader, the only processes a ``sim`` source's daemon judges.
    Raises ValueError (a malformed source), TelemetryUnavailable (the source cannot start) or
    :class:`SimJobError` (``sim_job`` with another source, or a pid that leads no session)."""
    from gpu_triage.daemon.loop import Daemon
    from gpu_triage.journal.logs import configure as configure_logging
    from gpu_triage.telemetry.factory import make_source

    configure_logging(config.daemon.log_level, config.daemon.log_format, stream=sys.stderr)
    raise_nofile()
    source = make_source(
        config.daemon.source,
        deadline_s=config.daemon.nvml_deadline_s,
        pids_interval_s=config.daemon.process_period_s,  # the processes are read each process period
        log=log,
    )
    if sim_start_s is not None and hasattr(source, "start_s"):
        source.start_s = sim_start_s
    if sim_job is not None:
        if not hasattr(source, "job_session"):
            source.close()
            raise SimJobError(f"--sim-job needs a simulated source, not {source.name!r}")
        source.job_session = sim_job
    try:
        flags = dict(overrides or {})
        return Daemon(config, source, config_path=config_path, on_cycle=on_cycle, overrides=flags)
    except ValueError as e:  # the simulated job's session (process_scope)
        source.close()
        raise SimJobError(str(e)) from None


def settle_heap() -> None:
    """Take what start-up built (the modules, the configuration, the app, the power tables: ~70,000
    objects that live as long as the process) out of the garbage collector's reach.

    A full collection walks every object tracked; with the start-up heap in it, each took up to ~95 ms
    on the 2-core bench machine while connections churned (1,000 slow sockets), and CPython holds
    the GIL meanwhile, so the health door stood still too. Frozen, that heap is never walked again
    (``gc.freeze``, as long-lived servers do); a collection first so that no garbage is frozen with it.
    """
    gc.collect()
    gc.freeze()


def run_daemon(options: RunOptions) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT; 0 after a clean stop, 2 on bad config."""
    from gpu_triage.daemon.reload import install_signal_handlers
    from gpu_triage.daemon.summary import summary_line
    from gpu_triage.model.samples import TelemetryUnavailable
    from gpu_triage.serving.http_server import PortInUseError

    try:
        path = resolve_config_path(options.config)
        config = load_config(path, os.environ)
        flags = options.overrides()
        if flags:
            config = override(config, flags, origin="command line")
    except ConfigError as e:
        print(f"gpu-watchdog run: {e}", file=sys.stderr)
        return 2
    last_print = [0.0]

    def print_summary(snap: Snapshot) -> None:
        if snap.time - last_print[0] >= 1.0:
            last_print[0] = snap.time
            print(summary_line(snap), flush=True)

    try:
        daemon = build_daemon(
            config,
            config_path=path,
            overrides=flags,
            on_cycle=print_summary if options.summary else None,
            sim_start_s=options.sim_start_s,
            sim_job=options.sim_job,
        )
    except SimJobError as e:  # --sim-job: not a simulated source, or its session cannot be proven
        print(f"gpu-watchdog run: {e}", file=sys.stderr)
        return 2
    except (ValueError, TelemetryUnavailable) as e:
        print(f"gpu-watchdog run: daemon.source = {config.daemon.source!r}: {e}", file=sys.stderr)
        return 2
    source = daemon.source
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
    settle_heap()
    install_signal_handlers(daemon)
    if options.on_started is not None:
        try:
            options.on_started()
        except BaseException:
            daemon.close()
            raise
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
