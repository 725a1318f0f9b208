"""The power tables as a figure: each band's boxes in the (power, utilisation) plane, per model."""

from __future__ import annotations

import math
from pathlib import Path

from gpu_triage.classify.power_table import BAND_ORDER, PowerTable
from gpu_triage.model.states import GpuState

COLOURS = {  # lighter than the triage plot's, so the hatching of estimates stays readable
    GpuState.IDLE: "#d0d0d0",
    GpuState.COMPUTE: "#a5d6a7",
    GpuState.COMMUNICATION: "#90caf9",
    GpuState.DATA_STARVATION: "#ffcc80",
    GpuState.CHECKPOINT_OR_DEADLOCK: "#ef9a9a",
}


def plot_tables(tables: list[PowerTable], out: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    cols = min(3, len(tables))
    rows = math.ceil(len(tables) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False)
    for ax, table in zip((a for row in axes for a in row), tables, strict=False):
        limit = table.power_limit_w or 1.0
        unit = "W" if table.power_limit_w else "x limit"
        # paint in reverse priority so the band that wins a point is drawn on top
        for state in reversed(BAND_ORDER):
            band = table.bands[state]
            for pmin, pmax, umin, umax in band.enter_boxes():
                x0, x1 = pmin * limit, min(pmax, 1.1) * limit
                y0, y1 = umin * 100, min(umax, 1.0) * 100 + (1 if umax > 1 else 0)
                ax.add_patch(
                    Rectangle(
                        (x0, y0),
                        x1 - x0,
                        y1 - y0,
                        facecolor=COLOURS[state],
                        edgecolor="white",
                        alpha=1.0,
                        hatch="//" if band.estimate else None,
                        lw=0,
                    )
                )
        ax.set_xlim(0, 1.1 * limit)
        ax.set_ylim(0, 101)
        ax.set_title(
            f"{table.model}" + (f" ({limit:.0f} W limit)" if table.power_limit_w else " (fractions)"),
            fontsize=9,
        )
        ax.set_xlabel(f"board power ({unit})", fontsize=8)
        ax.set_ylabel("utilisation (%)", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in [a for row in axes for a in row][len(tables) :]:
        ax.axis("off")
    handles = [Patch(color=COLOURS[s], label=str(s)) for s in BAND_ORDER]
    handles.append(
        Patch(facecolor="white", edgecolor="black", hatch="//", label="estimate (no public figure)")
    )
    fig.legend(handles=handles, loc="lower center", ncol=6, fontsize=8, frameon=False)
    fig.suptitle("gpu-watchdog power tables: enter boxes per state (exit boxes add the margins)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
