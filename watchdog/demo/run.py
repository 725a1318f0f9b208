"""``make run``: the daemon in the foreground, set up for this machine.

Where an NVIDIA driver answers, the daemon watches the real GPUs (``--source nvml``). Elsewhere it says
so and runs the built-in simulation instead: one node of the reference job (8 B300 at 10 Hz, training,
a checkpoint save, a short data stall, then the epoch-end deadlock, looping every ~10 minutes), with a
simulated job of 8 real rank processes writing real progress files - the only processes the daemon
judges then (the simulated job's session: other jobs and test runs on the machine are none of its
business). State lives in ``./state`` (git-ignored).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

BANNER = """\
gpu-watchdog {mode_line}
  status   http://127.0.0.1:{port}/status      health  http://127.0.0.1:{port}/healthz
  metrics  http://127.0.0.1:{port}/metrics     events  http://127.0.0.1:{port}/events
  API      http://127.0.0.1:{port}/docs
  try:     curl -s 127.0.0.1:{port}/status | python3 -m json.tool
  state:   {state}   (Ctrl-C stops)
"""


def main(*, state_dir: str, port: int, sim_skip_s: float = 0.0) -> int:
    """``sim_skip_s`` starts the scenario that far into its timeline (tests: reach the deadlock sooner)."""
    from gpu_triage.daemon.runner import RunOptions, run_daemon
    from gpu_triage.demo import simjob
    from gpu_triage.telemetry.nvml import nvml_available

    state = Path(state_dir).resolve()
    progress = state / "progress"
    progress.mkdir(parents=True, exist_ok=True)
    job = None
    options = RunOptions(
        listen=f"127.0.0.1:{port}",
        state_dir=state / "daemon",
        progress_dir=progress,
        summary=True,
    )
    if nvml_available():
        options = replace(options, source="nvml")
        mode_line = "watching this machine's GPUs through NVML (--source nvml)"
    else:
        start = time.time() + 1.0 - sim_skip_s
        options = replace(options, source="sim", period_s=0.1, sim_start_s=start)
        mode_line = (
            "found no NVIDIA driver here, so it runs the built-in SIMULATION (--source sim): one node of\n"
            "  the reference job, 8 B300 at 10 Hz - training, a checkpoint save, a short data stall, then\n"
            "  the epoch-end deadlock at ~110 s - with 8 real rank processes writing real progress files"
        )
        for stale in progress.glob("*/rank-*.json"):
            stale.unlink()
        job = simjob.start(progress, start, scratch_dir=state / "scratch")
        # The daemon judges the simulated job's session and nothing else of this machine; the demo
        # never reaps the launcher before the end, so its session number cannot be reused meanwhile.
        options = replace(options, sim_job=job.pid)
    print(BANNER.format(mode_line=mode_line, port=port, state=state), flush=True)
    try:
        return run_daemon(options)
    finally:
        if job is not None and job.poll() is None:
            try:
                os.killpg(job.pid, 15)
                job.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(job.pid, 9)
