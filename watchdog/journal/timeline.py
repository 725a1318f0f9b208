"""A job's incident as one picture: per-rank steps (and per-GPU power where there is telemetry) over
time, the verdict as coloured bands (hatched and labelled where it blames the node, the network or
nobody known rather than the job), and the daemon's actions as marks - evidence, alert, SIGTERM,
SIGKILL, resolve, node drained, requeued.

Inputs are what any client of the daemon can read: ``/status`` documents polled over time (steps and
power are not events) and ``/events`` (verdict changes and actions). :func:`build_timeline` is pure
(documents in, a typed :class:`Timeline` out); :func:`timeline_figure` draws it with matplotlib
(every drawn span and mark carries a ``gid`` naming what it is, so a test can read the figure back);
:func:`plot_timeline` writes the PNG. ``make demo`` writes ``out/demo/timeline.png`` with it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_triage.model.jsonable import finite_number

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Verdict -> band colour (healthy green, suspected amber, confirmed red, the rest muted).
VERDICT_COLOURS: dict[str, str] = {
    "healthy": "#2e9d4a",
    "checkpoint": "#4a7bd0",
    "deadlock_suspected": "#f0a020",
    "deadlock_confirmed": "#c62828",
    "stalled": "#8e6bb8",
    "stalled_checkpoint": "#8e6bb8",
    "data_starvation": "#3aa6b9",
    "slow": "#b0a040",
    "suspended": "#909090",
    "telemetry_lost": "#606060",
}
OTHER_COLOUR = "#9e9e9e"

#: (event kind, action, result) -> (mark kind, label). ``None`` matches anything.
MARKS: tuple[tuple[str, str | None, str | None, str, str], ...] = (
    ("action", "capture", "started", "evidence", "evidence"),
    ("action", "alert", "queued", "alert", "alert"),
    ("alert", None, "delivered", "alert_delivered", "alert delivered"),
    ("action", "sigterm", "started", "sigterm", "SIGTERM"),
    ("action", "sigkill", "ok", "sigkill", "SIGKILL"),
    ("action", "resolve", "queued", "resolve", "resolved"),
    ("action", "drain", "started", "drain", "node drained"),
    ("action", "requeue", "ok", "requeue", "requeued"),
)
MARK_COLOURS = {
    "onset": "#555555",
    "evidence": "#1565c0",
    "alert": "#ef6c00",
    "alert_delivered": "#ef6c00",
    "sigterm": "#b71c1c",
    "sigkill": "#4a0000",
    "resolve": "#2e7d32",
    "job_gone": "#555555",
    "drain": "#6d4c41",
    "requeue": "#00838f",
}
#: Blame -> the hatch over its verdict band (the job's own blame: none).
BLAME_HATCHES = {"node": "//", "network": "xx", "unknown": ".."}


@dataclass(frozen=True, slots=True)
class StatusPoint:
    """One ``/status`` poll, reduced to one job: epoch time, per-rank step, per-GPU power."""

    time_s: float
    steps: Mapping[int, int]
    power_w: Mapping[int, float]
    verdict: str | None
    step_since: Mapping[int, float] = field(default_factory=dict)
    """Per rank, when it took its step (``/status``'s ``step_since``: the clock of the onset mark)."""


@dataclass(frozen=True, slots=True)
class VerdictSpan:
    verdict: str
    start_s: float
    end_s: float
    blame: str = "job"
    """Whom the verdict blamed (the verdict event's ``blame``; ``job`` from an older daemon)."""


@dataclass(frozen=True, slots=True)
class Mark:
    time_s: float
    kind: str
    """``onset``, ``evidence``, ``alert``, ``alert_delivered``, ``sigterm``, ``sigkill``, ``resolve``,
    ``job_gone`` (no rank left), ``drain`` (the node drained for this job's hang), ``requeue``."""
    label: str


@dataclass(frozen=True, slots=True)
class Timeline:
    job: str
    points: tuple[StatusPoint, ...]
    spans: tuple[VerdictSpan, ...]
    marks: tuple[Mark, ...]
    start_s: float
    end_s: float

    @property
    def has_power(self) -> bool:
        return any(p.power_w for p in self.points)


def status_point(doc: Mapping[str, Any], job: str, time_s: float | None = None) -> StatusPoint | None:
    """The part of one ``/status`` document that concerns ``job`` (``None`` when the document has no
    time). Power is the node's GPUs that the job's ranks use, or every GPU when no rank names one."""
    t = finite_number(time_s) if time_s is not None else finite_number(doc.get("time"))
    if t is None:
        return None
    jobs = [j for j in doc.get("jobs") or [] if isinstance(j, dict) and j.get("job") == job]
    steps: dict[int, int] = {}
    step_since: dict[int, float] = {}
    gpus_of_job: set[int] = set()
    verdict = None
    for j in jobs[:1]:
        verdict = str(j.get("verdict")) if j.get("verdict") is not None else None
        for r in j.get("ranks") or []:
            if not isinstance(r, dict) or not isinstance(r.get("rank"), int):
                continue
            if isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool):
                steps[r["rank"]] = r["step"]
                since = finite_number(r.get("step_since"))
                if since is not None:
                    step_since[r["rank"]] = min(since, t)
            if isinstance(r.get("gpu"), int):
                gpus_of_job.add(r["gpu"])
    power: dict[int, float] = {}
    for g in doc.get("gpus") or []:
        if not isinstance(g, dict) or not isinstance(g.get("gpu"), int):
            continue
        watts = finite_number(g.get("power_w"))
        if watts is not None and (not gpus_of_job or g["gpu"] in gpus_of_job):
            power[g["gpu"]] = watts
    return StatusPoint(t, steps, power, verdict, step_since)


def _payload(event: Mapping[str, Any]) -> Mapping[str, Any]:
    p = event.get("payload")
    return p if isinstance(p, dict) else {}


def build_timeline(
    job: str,
    points: Iterable[StatusPoint],
    events: Iterable[Mapping[str, Any]],
    *,
    end_s: float | None = None,
) -> Timeline:
    """Verdict bands and action marks of ``job`` from its events (``/events`` rows, any order), with
    the polled points; the last band runs to ``end_s`` (default: the last point or event)."""
    pts = tuple(sorted((p for p in points if p is not None), key=lambda p: p.time_s))
    mine = sorted(
        (e for e in events if e.get("job") == job and finite_number(e.get("time")) is not None),
        key=lambda e: (float(e["time"]), int(e.get("id") or 0)),
    )
    times = [p.time_s for p in pts] + [float(e["time"]) for e in mine]
    start = min(times) if times else 0.0
    end = end_s if end_s is not None else (max(times) if times else start)
    spans: list[VerdictSpan] = []
    marks: list[Mark] = []
    current: tuple[str, float, str] | None = None
    seen: set[str] = set()
    for e in mine:
        t, kind, p = float(e["time"]), e.get("kind"), _payload(e)
        if kind == "verdict":
            if current is not None and t > current[1]:
                spans.append(VerdictSpan(current[0], current[1], t, current[2]))
            to = p.get("to")
            blame = p.get("blame") if p.get("blame") in ("job", "node", "network", "unknown") else "job"
            current = (str(to), t, str(blame)) if to is not None else None
            if to is None and p.get("event") == "job_gone" and "job_gone" not in seen:
                seen.add("job_gone")
                marks.append(Mark(t, "job_gone", "job gone"))
            onset = finite_number(p.get("onset"))
            if (
                to in ("deadlock_suspected", "deadlock_confirmed")
                and onset is not None
                and "onset" not in seen
            ):
                seen.add("onset")
                marks.append(Mark(onset, "onset", "onset (last step)"))
            continue
        for mk, action, result, mark_kind, label in MARKS:
            if kind != mk or mark_kind in seen:
                continue
            got_action = p.get("action") if mk == "action" else None
            got_result = p.get("result") if mk == "action" else p.get("event")
            if (action is None or got_action == action) and (result is None or got_result == result):
                seen.add(mark_kind)
                marks.append(Mark(t, mark_kind, label))
    if current is not None and end > current[1]:
        spans.append(VerdictSpan(current[0], current[1], end, current[2]))
    marks.sort(key=lambda m: m.time_s)
    start = min([start, *(m.time_s for m in marks)]) if marks else start
    return Timeline(job, pts, tuple(spans), tuple(marks), start, max(end, start))


def step_curve(tl: Timeline, rank: int) -> tuple[list[float], list[int]]:
    """Rank ``rank``'s steps as (epoch times, steps) for a step plot: each step drawn from when the rank
    took it (``step_since``, the onset's clock; else the poll that saw it), held until the last poll."""
    xs: list[float] = []
    ys: list[int] = []
    seen = [p for p in tl.points if rank in p.steps]
    for p in seen:
        step = p.steps[rank]
        if ys and step == ys[-1]:
            continue
        x = max(p.step_since.get(rank, p.time_s), tl.start_s, xs[-1] if xs else tl.start_s)
        xs.append(x)
        ys.append(step)
    if seen and xs and seen[-1].time_s > xs[-1]:
        xs.append(seen[-1].time_s)
        ys.append(ys[-1])
    return xs, ys


def timeline_figure(tl: Timeline, *, title: str | None = None) -> Figure:
    """The picture (x: seconds from the timeline's start). Panels: power per GPU (only with
    telemetry), steps per rank, the verdict band; marks as vertical lines through every panel."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    panels = (["power"] if tl.has_power else []) + ["steps", "verdict"]
    heights = {"power": 3.0, "steps": 3.0, "verdict": 0.8}
    fig = Figure(figsize=(12, 1.2 + sum(heights[p] for p in panels)), dpi=110, layout="constrained")
    # always two panels or more: subplots returns an array of axes
    axes = list(fig.subplots(len(panels), 1, sharex=True, height_ratios=[heights[p] for p in panels]))
    by_name = dict(zip(panels, axes, strict=True))
    t0 = tl.start_s

    def rel(t: float) -> float:
        return t - t0

    if "power" in by_name:
        ax = by_name["power"]
        gpus = sorted({g for p in tl.points for g in p.power_w})
        for g in gpus:
            xs = [rel(p.time_s) for p in tl.points if g in p.power_w]
            ys = [p.power_w[g] for p in tl.points if g in p.power_w]
            ax.plot(xs, ys, lw=1.0, label=f"GPU {g}", gid=f"power:{g}")
        ax.set_ylabel("board power (W)")
        if len(gpus) <= 16:
            ax.legend(loc="upper right", fontsize=7, ncol=min(8, max(1, len(gpus))))
    ax = by_name["steps"]
    ranks = sorted({r for p in tl.points for r in p.steps})
    for r in ranks:
        times, steps = step_curve(tl, r)
        ax.step([rel(x) for x in times], steps, where="post", lw=1.4, label=f"rank {r}", gid=f"steps:{r}")
    ax.set_ylabel("optimizer step")
    if ranks and len(ranks) <= 16:
        ax.legend(loc="lower right", fontsize=7, ncol=min(8, len(ranks)))
    if not ranks:
        ax.text(0.5, 0.5, "no rank reported a step", transform=ax.transAxes, ha="center", color="#777")
    if tl.points and not tl.has_power:
        ax.set_title("no GPU power in the status (source none): steps from progress files", fontsize=9)
    band = by_name["verdict"]
    for s in tl.spans:
        band.axvspan(
            rel(s.start_s),
            rel(s.end_s),
            color=VERDICT_COLOURS.get(s.verdict, OTHER_COLOUR),
            alpha=0.85,
            lw=0,
            gid=f"verdict:{s.verdict}",
        )
        if s.blame != "job":  # hatched, and said in words: the hardware, not the job
            band.axvspan(
                rel(s.start_s),
                rel(s.end_s),
                facecolor="none",
                edgecolor="white",
                hatch=BLAME_HATCHES.get(s.blame, ".."),
                lw=0,
                gid=f"blame:{s.blame}",
            )
            band.text(
                (rel(s.start_s) + rel(s.end_s)) / 2,
                0.5,
                f"blame {s.blame}",
                transform=band.get_xaxis_transform(),
                ha="center",
                va="center",
                fontsize=8,
                color="white",
                gid=f"blame_label:{s.blame}",
            )
    band.set_yticks([])
    band.set_ylabel("verdict", rotation=0, ha="right", va="center")
    shown = list(dict.fromkeys(s.verdict for s in tl.spans))
    blamed = list(dict.fromkeys(s.blame for s in tl.spans if s.blame != "job"))
    if shown:
        band.legend(
            handles=[Patch(color=VERDICT_COLOURS.get(v, OTHER_COLOUR), label=v) for v in shown]
            + [
                Patch(
                    facecolor="#777777",
                    hatch=BLAME_HATCHES.get(b, ".."),
                    edgecolor="white",
                    label=f"blame {b}",
                )
                for b in blamed
            ],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.6),
            ncol=len(shown) + len(blamed),
            fontsize=8,
            frameon=False,
        )
    for m in tl.marks:
        colour = MARK_COLOURS.get(m.kind, "#333333")
        style = "--" if m.kind in ("onset", "job_gone") else "-"
        for name, a in by_name.items():
            a.axvline(rel(m.time_s), color=colour, ls=style, lw=1.2, gid=f"mark:{m.kind}:{name}")
    top = axes[0]
    levels = [0.98, 0.86, 0.74]
    for i, m in enumerate(tl.marks):
        top.text(
            rel(m.time_s),
            levels[i % len(levels)],
            f" {m.label} ",
            transform=top.get_xaxis_transform(),
            fontsize=8,
            va="top",
            ha="left",
            color=MARK_COLOURS.get(m.kind, "#333333"),
            bbox={"facecolor": "white", "alpha": 0.8, "lw": 0, "pad": 0.5},
            gid=f"label:{m.kind}",
        )
    span_s = max(1.0, rel(tl.end_s))
    axes[-1].set_xlim(0.0, span_s * 1.06)  # room for the last mark's label
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t0))
    axes[-1].set_xlabel(f"seconds since {started}")
    fig.suptitle(title or f"gpu-watchdog: job {tl.job}", fontsize=12)
    return fig


def plot_timeline(tl: Timeline, out: Path, *, title: str | None = None) -> Path:
    """Write the timeline PNG to ``out`` (its folder created) and return the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = timeline_figure(tl, title=title)
    fig.savefig(out, format="png")
    return out
