"""The one line per cycle a foreground ``gpu-watchdog run`` prints: GPU states and job verdicts."""

from __future__ import annotations

import time

from gpu_triage.model.snapshot import Snapshot

_SHORT = {
    "compute": "compute",
    "checkpoint_or_deadlock": "ckpt/deadlock",
    "data_starvation": "starved",
    "communication": "comm",
    "idle": "idle",
    "unknown": "unknown",
}


def summary_line(snap: Snapshot) -> str:
    """One line per cycle for the foreground run: GPU states and job verdicts."""
    counts: dict[str, int] = {}
    for g in snap.gpus:
        counts[str(g.state)] = counts.get(str(g.state), 0) + 1
    gpus = " ".join(f"{_SHORT[k]}={v}" for k, v in sorted(counts.items())) or "no GPUs"
    power = sum(g.power_w or 0.0 for g in snap.gpus)
    jobs = (
        "; ".join(
            f"{j.job}: {j.verdict}"
            + (f" since {time.strftime('%H:%M:%S', time.localtime(j.onset))}" if j.onset else "")
            + (
                f" step {max(s for s in (r.step for r in j.ranks) if s is not None)}"
                if any(r.step is not None for r in j.ranks)
                else ""
            )
            for j in snap.jobs
        )
        or "no jobs"
    )
    clock = time.strftime("%H:%M:%S", time.localtime(snap.time))
    return f"{clock} [{snap.mode}] GPUs {gpus} ({power:,.0f} W) | {jobs}"
