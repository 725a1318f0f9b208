"""Human-readable triage report (the JSON form is TriageResult.to_json)."""

from __future__ import annotations

import time
from typing import Any

from gpu_triage.model.states import GPU_STATES
from gpu_triage.triage.deadlock_rule import CADENCE_FACTOR
from gpu_triage.triage.engine import TriageResult

#: How many of the longest waits (spin episodes, one per GPU group) the report lists.
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
    """The longest waits (``checkpoint_or_deadlock`` stretches of one GPU group with no compute burst),
    longest first (ties: earliest first): one entry per group, not one per GPU."""
    waits = [w.to_json() for w in result.waits if w.end_s > w.start_s]
    waits.sort(key=lambda w: (-w["duration_s"], w["start_s"], w["gpus"]))
    return waits[:limit]


def gpu_list(gpus: list[int] | tuple[int, ...]) -> str:
    """``GPUs 1-7``, ``GPUs 0, 2``, ``GPU 3``."""
    g = sorted(gpus)
    if len(g) > 2 and g == list(range(g[0], g[-1] + 1)):
        return f"GPUs {g[0]}-{g[-1]}"
    return ("GPU " if len(g) == 1 else "GPUs ") + ", ".join(map(str, g))


_KIND = {
    "checkpoint": "checkpoint",
    "wait": "wait",
    "open": "still waiting at the end of the recording",
    "suspected_deadlock": "SUSPECTED DEADLOCK",
}
_ENDED = {"progress": "then computed", "left_band": "then left the band without computing", "open": ""}


def _describe(e: dict[str, Any]) -> str:
    kind = e["kind"]
    text = _KIND.get(kind, kind)
    notes = []
    if kind in ("checkpoint", "wait") and _ENDED.get(e["ended_by"]):
        notes.append(_ENDED[e["ended_by"]])
    if e.get("writer_gpu") is not None:
        notes.append(f"writer GPU {e['writer_gpu']}")
    if e.get("out_of_line"):
        notes.append("longer than the cadence before it allowed")
    return text + (f" ({'; '.join(notes)})" if notes else "")


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
        seconds = r.states_s[str(s)]
        if seconds > 0:
            lines.append(f"    {s!s:<24} {seconds:>12,.1f}  {100 * seconds / total:5.1f} %")
    cols = [s for s in GPU_STATES if r.states_s[str(s)] > 0]
    lines.append("  per GPU (% of its time): " + "  ".join(f"{_SHORT[str(s)]:>8}" for s in cols))
    for g, d in enumerate(r.per_gpu_states_s):
        tot = sum(d.values()) or 1.0
        lines.append(f"    gpu {g:<3}{'':17}" + "  ".join(f"{100 * d[str(s)] / tot:>7.1f}%" for s in cols))
    rule = (
        f"rule: a GPU group spinning in checkpoint_or_deadlock with no compute burst for >= "
        f"{r.deadlock_after_s:g} s and, once the recording shows its save cadence, for over "
        f"{CADENCE_FACTOR:g}x the longest wait it came back from"
    )
    if r.verdicts:
        for v in r.verdicts:
            end = "until the end of the recording" if v["ended_s"] is None else f"until {v['ended_s']:.1f} s"
            departed = v.get("departed_from_cadence_s")
            since = "" if departed is None else f", out of line with its cadence from {departed:.1f} s"
            lines.append(
                f"  SUSPECTED DEADLOCK on {gpu_list(v['gpus'])}: waiting from {v['onset_s']:.1f} s "
                f"({wall_clock(r, v['onset_s'])}){since}, rule fired at {v['detected_s']:.1f} s, {end}"
            )
            for line in v.get("evidence", []):
                lines.append(f"    - {line}")
        lines.append(f"  ({rule}; suspected: power cannot prove a hang)")
    else:
        lines.append(f"  no suspected deadlock ({rule})")
    for gpus, cadence in r.cadences:
        every = f", one every {_fmt_s(cadence.every_s)}" if cadence.every_s is not None else ""
        between = f", {_fmt_s(cadence.work_s)} of work between" if cadence.work_s is not None else ""
        lines.append(
            f"  cadence of {gpu_list(gpus)}: {cadence.waits} wait(s) ended in progress, median "
            f"{_fmt_s(cadence.median_s)}, longest {_fmt_s(cadence.longest_s)}{every}{between}"
        )
    episodes = spin_episodes(r)
    if episodes:
        lines.append("  longest waits (checkpoint_or_deadlock, one per GPU group, clock time as recorded):")
        for e in episodes:
            start, end = e["start_s"], e["end_s"]
            lines.append(
                f"    {gpu_list(e['gpus']):<12} {_fmt_s(e['duration_s']):>9}  {wall_clock(r, start)} .. "
                f"{wall_clock(r, end)[11:]}  ({start:.1f} s .. {end:.1f} s)  {_describe(e)}"
            )
    for w in r.warnings:
        lines.append(f"  warning: {w}")
    return "\n".join(lines)
