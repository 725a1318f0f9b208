"""``gpu-watchdog run``: the command line's flags become :class:`~gpu_triage.daemon.runner.RunOptions`."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpu_triage.daemon.runner import RunOptions
from gpu_triage.daemon.runner import run_daemon as run_with_options


def options_from_args(args: argparse.Namespace) -> RunOptions:
    def path(value: object) -> Path | None:
        return Path(str(value)) if value is not None else None

    return RunOptions(
        config=path(getattr(args, "config", None)),
        source=getattr(args, "source", None),
        listen=getattr(args, "listen", None),
        state_dir=path(getattr(args, "state_dir", None)),
        progress_dir=path(getattr(args, "progress_dir", None)),
        period_s=getattr(args, "period", None),
        mode=getattr(args, "mode", None),
        summary=bool(getattr(args, "summary", False)),
        sim_start_s=getattr(args, "sim_start", None),
        kernel_log_file=path(getattr(args, "kernel_log_file", None)),
    )


def run_daemon(args: argparse.Namespace) -> int:
    return run_with_options(options_from_args(args))
