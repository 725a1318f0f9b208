"""Human-readable triage report (the JSON form is TriageResult.to_json)."""

from __future__ import annotations

import time
from typing import Any

from gpu_triage.model.states import GPU_STATES, GpuState
from gpu_triage.triage.engine import TriageResult

#: How many of the longest checkpoint_or_deadlock (spin) episodes the report lists.
SPIN_EPISODES_LISTED = 5

_SHORT = {
    "idle": "idle",
    "compute": "compute",
    "communication": "comm",
    "data_starvation": "starved",
    "checkpoint_or_deadlock": "ckpt/dl",
    "unknown": "unknown",
}


def _fmt_s(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def spin_episodes(result: TriageResult, limit: int = SPIN_EPISODES_LISTED) -> list[dict[str, Any]]:
    """The longest ``checkpoint_or_deadlock`` segments, longest first (ties: earliest first)."""
    spins = [
        {**s, "duration_s": round(s["end_s"] - s["start_s"], 3)}
        for s in result.segments
        if s["state"] == GpuState.CHECKPOINT_OR_DEADLOCK.value and s["end_s"] > s["start_s"]
    ]
    spins.sort(key=lambda s: (-s["duration_s"], s["start_s"], s["gpu"]))
    return spins[:limit]


def wall_clock(result: TriageResult, offset_s: float) -> str:
    """The wall-clock time of an offset into the recording, as nvidia-smi wrote it (its timestamps
    carry no zone: they are the recording host's local time, read unchanged)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(result.start_time + offset_s))


def render(result: TriageResult) -> str:
    r = result
    lines = [
        f"{r.file}",
        f"  {r.gpus} x {r.model} (table {r.table.model}, power limit {r.power_limit_w:.0f} W), "
        f"{r.samples:,} samples over {_fmt_s(r.duration_s)}",
    ]
    total = sum(r.states_s.values()) or 1.0
    lines.append("  time in each state (GPU-seconds):")
    for s in GPU_STATES:
        v = r.states_s[str(s)]
        if v > 0:
            lines.append(f"    {s!s:<24} {v:>12,.1f}  {100 * v / total:5.1f} %")
    cols = [s for s in GPU_STATES if r.states_s[str(s)] > 0]
    lines.append("  per GPU (% of its time): " + "  ".join(f"{_SHORT[str(s)]:>8}" for s in cols))
    for g, d in enumerate(r.per_gpu_states_s):
        tot = sum(d.values()) or 1.0
        lines.append(f"    gpu {g:<3}{'':17}" + "  ".join(f"{100 * d[str(s)] / tot:>7.1f}%" for s in cols))
    rule = f"every GPU in checkpoint_or_deadlock for >= {r.deadlock_after_s:g} s"
    if r.verdicts:
        for v in r.verdicts:
            end = "until the end of the recording" if v["ended_s"] is None else f"until {v['ended_s']:.1f} s"
            lines.append(
                f"  DEADLOCK on GPUs {v['gpus']}: onset {v['onset_s']:.1f} s, detected "
                f"{v['detected_s']:.1f} s, {end} ({rule})"
            )
    else:
        lines.append(f"  no deadlock ({rule})")
    episodes = spin_episodes(r)
    if episodes:
        lines.append("  longest spin episodes (checkpoint_or_deadlock, clock time as recorded):")
        for e in episodes:
            lines.append(
                f"    gpu {e['gpu']:<3} {_fmt_s(e['duration_s']):>9}  {wall_clock(r, e['start_s'])} .. "
                f"{wall_clock(r, e['end_s'])[11:]}  ({e['start_s']:.1f} s .. {e['end_s']:.1f} s)"
            )
    for w in r.warnings:
        lines.append(f"  warning: {w}")
    return "\n".join(lines)
