"""PNG of power per GPU over time, coloured by state, with the table's band edges and any verdict."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpu_triage.states import GPU_STATES, GpuState
from gpu_triage.triage.engine import TriageResult

COLOURS = {
    GpuState.IDLE: "#9e9e9e",
    GpuState.COMPUTE: "#2e7d32",
    GpuState.COMMUNICATION: "#1565c0",
    GpuState.DATA_STARVATION: "#ef6c00",
    GpuState.CHECKPOINT_OR_DEADLOCK: "#c62828",
    GpuState.UNKNOWN: "#000000",
}


def plot(result: TriageResult, out: str | Path, *, max_panels: int = 16) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    assert result.plot is not None, "triage_file(..., keep_plot_points=True) keeps the points to plot"
    n = min(result.gpus, max_panels)
    fig, axes = plt.subplots(n, 1, figsize=(12, 1.3 * n + 1.4), sharex=True, squeeze=False)
    lim = result.power_limit_w
    compute_w = result.table.bands[GpuState.COMPUTE].power_min * lim
    spin_w = result.table.bands[GpuState.CHECKPOINT_OR_DEADLOCK].power_max * lim
    for g in range(n):
        ax = axes[g][0]
        t, p, codes = result.plot[g]
        colours = np.array([COLOURS[s] for s in GPU_STATES])[codes] if len(codes) else []
        ax.scatter(t, p, c=colours, s=2, linewidths=0, rasterized=True)
        ax.axhline(compute_w, color=COLOURS[GpuState.COMPUTE], lw=0.6, ls="--")
        ax.axhline(spin_w, color=COLOURS[GpuState.CHECKPOINT_OR_DEADLOCK], lw=0.6, ls="--")
        for v in result.verdicts:
            end = v["ended_s"] if v["ended_s"] is not None else result.duration_s
            ax.axvspan(v["onset_s"], end, color="#c62828", alpha=0.12)
            ax.axvline(v["detected_s"], color="#c62828", lw=1.0)
        ax.set_ylim(0, lim * 1.05)
        ax.set_ylabel(f"GPU {g}\nW", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[-1][0].set_xlabel("seconds from the first sample")
    title = f"{Path(result.file).name}: {result.gpus} x {result.model}, limit {lim:.0f} W"
    if result.verdicts:
        title += f" - DEADLOCK detected at {result.verdicts[0]['detected_s']:.0f} s"
    fig.suptitle(title, fontsize=10)
    handles = [Line2D([], [], marker="o", ls="", color=COLOURS[s], label=str(s)) for s in GPU_STATES]
    handles += [
        Line2D([], [], ls="--", color=COLOURS[GpuState.COMPUTE], label="compute floor"),
        Line2D([], [], ls="--", color=COLOURS[GpuState.CHECKPOINT_OR_DEADLOCK], label="spin ceiling"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=8, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
