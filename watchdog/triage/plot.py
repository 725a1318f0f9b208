"""PNG of power per GPU over time, coloured by state, with the table's band edges and any verdict, and
the GPU's utilisation under it; the time axis is the recording's wall clock (as nvidia-smi wrote it)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from gpu_triage.model.states import GPU_STATES, GpuState
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
    """Write the figure of :func:`figure` as a PNG to ``out``."""
    fig = figure(result, max_panels=max_panels)  # selects the Agg backend first
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def figure(result: TriageResult, *, max_panels: int = 16):
    """The matplotlib figure: per GPU a power panel (states, band edges, verdicts) and a utilisation
    panel under it, on the recording's wall clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    assert result.plot is not None, "triage_file(..., keep_plot_points=True) keeps the points to plot"
    n = min(result.gpus, max_panels)
    # Per GPU: power (tall) and utilisation (short) beneath it, sharing the wall-clock axis.
    fig, axes = plt.subplots(
        2 * n,
        1,
        figsize=(12, 2.0 * n + 1.4),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 1] * n},
    )
    lim = result.power_limit_w
    compute_w = result.table.bands[GpuState.COMPUTE].power_min * lim
    spin_w = result.table.bands[GpuState.CHECKPOINT_OR_DEADLOCK].power_max * lim

    def clock(seconds: np.ndarray | float) -> np.ndarray:
        # nvidia-smi times are read unchanged (no zone): show them as written, i.e. as UTC here.
        return np.asarray(seconds, dtype=float) / 86400.0 + mdates.date2num(
            np.datetime64(int(result.start_time * 1e6), "us")
        )

    for g in range(n):
        ax, util_ax = axes[2 * g][0], axes[2 * g + 1][0]
        t, p, codes, u = result.plot[g]
        colours = np.array([COLOURS[s] for s in GPU_STATES])[codes] if len(codes) else []
        x = clock(t)
        ax.scatter(x, p, c=colours, s=2, linewidths=0, rasterized=True)
        ax.axhline(compute_w, color=COLOURS[GpuState.COMPUTE], lw=0.6, ls="--")
        ax.axhline(spin_w, color=COLOURS[GpuState.CHECKPOINT_OR_DEADLOCK], lw=0.6, ls="--")
        util_ax.plot(x, u * 100.0, color="#424242", lw=0.6, rasterized=True)
        for v in result.verdicts:
            if g not in v["gpus"]:
                continue
            end = v["ended_s"] if v["ended_s"] is not None else result.duration_s
            for a in (ax, util_ax):
                a.axvspan(clock(v["onset_s"]), clock(end), color="#c62828", alpha=0.12)
            ax.axvline(clock(v["detected_s"]), color="#c62828", lw=1.0)
        ax.set_ylim(0, lim * 1.05)
        ax.set_ylabel(f"GPU {g}\nW", fontsize=8)
        util_ax.set_ylim(0, 105)
        util_ax.set_ylabel("util\n%", fontsize=7)
        for a in (ax, util_ax):
            a.tick_params(labelsize=7)
    bottom = axes[-1][0]
    bottom.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    day = time.strftime("%Y-%m-%d", time.gmtime(result.start_time))
    bottom.set_xlabel(
        f"clock time as recorded (started {day} {time.strftime('%H:%M:%S', time.gmtime(result.start_time))})"
    )
    title = f"{Path(result.file).name}: {result.gpus} x {result.model}, limit {lim:.0f} W"
    if result.verdicts:
        title += f" - suspected deadlock (rule fired at {result.verdicts[0]['detected_s']:.0f} s)"
    fig.suptitle(title, fontsize=10)
    handles = [Line2D([], [], marker="o", ls="", color=COLOURS[s], label=str(s)) for s in GPU_STATES]
    handles += [
        Line2D([], [], ls="--", color=COLOURS[GpuState.COMPUTE], label="compute floor"),
        Line2D([], [], ls="--", color=COLOURS[GpuState.CHECKPOINT_OR_DEADLOCK], label="spin ceiling"),
    ]
    handles.append(Line2D([], [], color="#424242", label="utilisation"))
    fig.legend(handles=handles, loc="lower center", ncol=9, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    return fig
