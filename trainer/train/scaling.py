"""``ft-trainer scaling-report``: runs of one job at different GPU counts -> a strong-scaling table + PNG.

Each run is a metrics directory written by ``ft-trainer train`` (``metrics.dir``): ``run.json`` (world
size, nodes, tokens per step and per epoch, peak FLOP/s) and ``metrics.jsonl`` (one ``step`` record per
log interval). Per run: steady-state throughput = the median ``tokens_per_s`` of the step records,
leaving out the first ``skip_steps`` after every (re)start (warm-up: first allocations, first
all-gathers); MFU likewise. Against the smallest run (the base, ``G0`` GPUs):

- speed-up = ``tokens_per_s / base tokens_per_s``; ideal = ``G / G0``;
- efficiency = speed-up / ideal (1.0 = perfect strong scaling);
- hours per epoch = ``tokens per epoch / tokens_per_s / 3600``; GPU-hours per epoch = that x ``G``.

Runs that differ in job, model, sequence length, micro-batch, tokens per step per GPU or dtype are not
one job's strong scaling (a ratio of two unrelated throughputs can read 132 % efficient): the report
refuses them, naming what differs, unless ``--allow-mixed`` (then it warns above the table).

The table has the columns of the reference report's 4/8/16-GPU strong-scaling table (GPUs, nodes,
tokens/s, tokens/s per GPU, speed-up, efficiency) plus step time, MFU and the epoch's cost.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ft_trainer.train.throughput import read_metrics

__all__ = [
    "RunError",
    "RunSummary",
    "ScalingRow",
    "load_run",
    "plot_scaling",
    "render_table",
    "run_differences",
    "scaling_rows",
]


class RunError(ValueError):
    """A run directory that cannot be summarised (missing files, no steps)."""


@dataclass(frozen=True)
class RunSummary:
    path: str
    gpus: int
    nodes: int
    device_name: str
    model: str
    tokens_per_step: int
    tokens_per_epoch: float
    tokens_per_s: float
    step_time_s: float
    mfu: float | None
    steps_used: int
    job: str | None = None
    seq_len: int | None = None
    micro_batch: int | None = None
    dtype: str | None = None

    def comparable(self) -> dict[str, Any]:
        """What must agree between runs for their ratio to be strong scaling (None: not recorded)."""
        return {
            "job": self.job,
            "model": self.model if self.model != "?" else None,
            "seq_len": self.seq_len,
            "micro_batch": self.micro_batch,
            "tokens per step per GPU": self.tokens_per_step // self.gpus if self.gpus else None,
            "dtype": self.dtype,
        }


def run_differences(runs: list[RunSummary]) -> list[str]:
    """How the runs differ in what makes their throughputs comparable (job, model, sequence length,
    micro-batch, tokens per step per GPU, dtype), one line per field; empty when they agree. A field a
    run did not record is not compared."""
    out: list[str] = []
    if len(runs) < 2:
        return out
    for key in runs[0].comparable():
        values = {r.path: r.comparable()[key] for r in runs if r.comparable()[key] is not None}
        if len(set(values.values())) > 1:
            shown = ", ".join(f"{path}: {value}" for path, value in values.items())
            out.append(f"{key} differs ({shown})")
    return out


def steady_steps(records: list[dict[str, Any]], skip_steps: int | None = None) -> list[dict[str, Any]]:
    """Step records without the first ``skip_steps`` after every ``start`` record (default: 10 % of the
    step records, at least 1)."""
    steps_total = sum(1 for r in records if r.get("kind") == "step")
    skip = max(1, steps_total // 10) if skip_steps is None else skip_steps
    out, since_start = [], 0
    for r in records:
        kind = r.get("kind")
        if kind == "start":
            since_start = 0
        elif kind == "step":
            since_start += 1
            if since_start > skip:
                out.append(r)
    return out


def load_run(path: Path, *, skip_steps: int | None = None) -> RunSummary:
    path = Path(path)
    try:
        run = json.loads((path / "run.json").read_text(encoding="utf-8"))
        records = read_metrics(path / "metrics.jsonl")
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: not a training run's metrics directory ({exc})") from None
    steps = steady_steps(records, skip_steps)
    if not steps:
        raise RunError(f"{path}: no step records left after skipping the warm-up (lower --skip-steps)")
    tps = statistics.median(float(r["tokens_per_s"]) for r in steps)
    step_s = statistics.median(float(r["step_time_s"]) for r in steps)
    mfus = [float(r["mfu"]) for r in steps if r.get("mfu") is not None]
    per_epoch = run.get("tokens_per_epoch") or []
    tokens_per_epoch = float(statistics.mean(per_epoch)) if per_epoch else float("nan")
    return RunSummary(
        path=str(path),
        gpus=int(run["world_size"]),
        nodes=int(run.get("nodes", 1)),
        device_name=str(run.get("device_name", "?")),
        model=str(run.get("model", "?")),
        tokens_per_step=int(run["tokens_per_step"]),
        tokens_per_epoch=tokens_per_epoch,
        tokens_per_s=tps,
        step_time_s=step_s,
        mfu=statistics.median(mfus) if mfus else None,
        steps_used=len(steps),
        job=str(run["job"]) if run.get("job") is not None else None,
        seq_len=int(run["seq_len"]) if run.get("seq_len") is not None else None,
        micro_batch=int(run["micro_batch"]) if run.get("micro_batch") is not None else None,
        dtype=str(run["dtype"]) if run.get("dtype") is not None else None,
    )


@dataclass(frozen=True)
class ScalingRow:
    gpus: int
    nodes: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    speedup: float
    ideal_speedup: float
    efficiency: float
    step_time_s: float
    mfu: float | None
    hours_per_epoch: float
    gpu_hours_per_epoch: float
    run: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def scaling_rows(runs: list[RunSummary]) -> list[ScalingRow]:
    """One row per run, by GPU count; the first run with the fewest GPUs is the base."""
    if not runs:
        return []
    ordered = sorted(runs, key=lambda r: (r.gpus, r.path))
    base = ordered[0]
    rows = []
    for r in ordered:
        speedup = r.tokens_per_s / base.tokens_per_s
        ideal = r.gpus / base.gpus
        hours = r.tokens_per_epoch / r.tokens_per_s / 3600.0
        rows.append(
            ScalingRow(
                gpus=r.gpus,
                nodes=r.nodes,
                tokens_per_s=r.tokens_per_s,
                tokens_per_s_per_gpu=r.tokens_per_s / r.gpus,
                speedup=speedup,
                ideal_speedup=ideal,
                efficiency=speedup / ideal,
                step_time_s=r.step_time_s,
                mfu=r.mfu,
                hours_per_epoch=hours,
                gpu_hours_per_epoch=hours * r.gpus,
                run=r.path,
            )
        )
    return rows


def render_table(rows: list[ScalingRow]) -> str:
    head = (
        "| GPUs | nodes | tokens/s | tokens/s/GPU | speed-up (ideal) | efficiency | step s | MFU | "
        "h/epoch | GPU-h/epoch | run |"
    )
    lines = [head, "|" + "|".join(["---"] * 11) + "|"]
    for r in rows:
        mfu = "n/a" if r.mfu is None else f"{100 * r.mfu:.1f}%"
        lines.append(
            f"| {r.gpus} | {r.nodes} | {r.tokens_per_s:,.0f} | {r.tokens_per_s_per_gpu:,.0f} | "
            f"{r.speedup:.2f}x ({r.ideal_speedup:.0f}x) | {100 * r.efficiency:.1f}% | "
            f"{r.step_time_s:.3f} | {mfu} | "
            f"{r.hours_per_epoch:.3g} | {r.gpu_hours_per_epoch:.3g} | {r.run} |"
        )
    return "\n".join(lines)


def plot_scaling(rows: list[ScalingRow], png: Path) -> Path:
    """Three panels: tokens/s against GPUs (with ideal linear scaling from the base), efficiency, and
    GPU-hours per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = [r.gpus for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    ax = axes[0]
    ax.plot(gpus, [r.tokens_per_s for r in rows], "o-", label="measured")
    if rows:
        b = rows[0]
        ax.plot(gpus, [b.tokens_per_s * g / b.gpus for g in gpus], "--", color="grey", label="ideal")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s")
    ax.set_title("Throughput")
    ax.legend()
    ax = axes[1]
    ax.plot(gpus, [100 * r.efficiency for r in rows], "o-")
    ax.axhline(100, ls="--", color="grey")
    ax.set_ylim(0, 110)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_title("Strong-scaling efficiency")
    ax = axes[2]
    ax.bar([str(g) for g in gpus], [r.gpu_hours_per_epoch for r in rows])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("GPU-hours per epoch")
    ax.set_title("Cost per epoch")
    for ax in axes[:2]:
        ax.set_xticks(gpus)
    fig.tight_layout()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
