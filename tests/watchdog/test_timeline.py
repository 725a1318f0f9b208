"""The incident timeline picture: verdict bands and action marks from the daemon's events, steps (and
power) from polled /status documents, drawn where the events say and written as a real PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from gpu_triage.journal.timeline import (
    VERDICT_COLOURS,
    build_timeline,
    plot_timeline,
    status_point,
    timeline_figure,
)
from tests.watchdog.snapshots import T0

JOB = "tiny-cpu"


def event(i: int, t: float, kind: str, payload: dict[str, Any], job: str = JOB) -> dict[str, Any]:
    return {"id": i, "time": T0 + t, "kind": kind, "gpu": None, "job": job, "payload": payload}


# The demo's incident as /events returns it (times in seconds from T0), another job's events mixed in.
EVENTS = [
    event(1, 0.0, "verdict", {"from": None, "to": "healthy", "onset": None}),
    event(2, 3.0, "verdict", {"from": None, "to": "deadlock_suspected", "onset": T0}, job="other"),
    event(3, 21.0, "verdict", {"from": "healthy", "to": "deadlock_suspected", "onset": T0 + 6.0}),
    event(4, 21.0, "action", {"action": "capture", "result": "started"}),
    event(5, 21.0, "action", {"action": "alert", "result": "queued"}),
    event(6, 21.3, "alert", {"event": "delivered", "status": "firing"}),
    event(7, 22.0, "evidence", {"path": "/x"}),
    event(8, 30.0, "verdict", {"from": "deadlock_suspected", "to": "deadlock_confirmed", "onset": T0 + 6.0}),
    event(9, 30.0, "action", {"action": "alert", "result": "updated"}),
    event(10, 32.0, "action", {"action": "sigterm", "result": "started"}),
    event(11, 33.0, "action", {"action": "sigterm", "result": "ok"}),
    event(12, 33.5, "action", {"action": "resolve", "result": "queued"}),
    event(13, 35.0, "verdict", {"from": "deadlock_confirmed", "to": None, "event": "job_gone"}),
    event(14, 3.5, "action", {"action": "sigterm", "result": "started"}, job="other"),
]


def status_doc(t: float, steps: dict[int, int], power: dict[int, float] | None = None) -> dict[str, Any]:
    return {
        "time": T0 + t,
        "gpus": [{"gpu": g, "power_w": w} for g, w in (power or {}).items()],
        "jobs": [
            {"job": "other", "verdict": "healthy", "ranks": [{"rank": 0, "step": 999, "gpu": None}]},
            {
                "job": JOB,
                "verdict": "healthy",
                "ranks": [{"rank": r, "step": s, "gpu": r if power else None} for r, s in steps.items()],
            },
        ],
    }


def polls(power: bool) -> list[dict[str, Any]]:
    out = []
    for t in range(0, 36):
        step = min(t, 6) // 2  # steps advance until the hang's onset at 6 s, then freeze
        watts = {0: 600.0 if t < 6 else 150.0, 1: 610.0 if t < 6 else 140.0} if power else None
        out.append(status_doc(float(t), {0: step, 1: step}, watts))
    return out


def test_status_point_keeps_only_the_job() -> None:
    p = status_point(status_doc(5.0, {0: 2, 1: 3}, {0: 500.0, 1: 510.0, 7: 90.0}), JOB)
    assert p is not None
    assert p.time_s == T0 + 5.0 and dict(p.steps) == {0: 2, 1: 3}
    assert dict(p.power_w) == {0: 500.0, 1: 510.0}  # GPU 7 is not the job's
    assert status_point({"jobs": []}, JOB) is None  # no time


def test_bands_and_marks_come_from_the_events() -> None:
    points = [status_point(d, JOB) for d in polls(power=False)]
    tl = build_timeline(JOB, [p for p in points if p is not None], EVENTS)
    assert [(s.verdict, s.start_s - T0, s.end_s - T0) for s in tl.spans] == [
        ("healthy", 0.0, 21.0),
        ("deadlock_suspected", 21.0, 30.0),
        ("deadlock_confirmed", 30.0, 35.0),
    ]
    assert [(m.kind, m.time_s - T0) for m in tl.marks] == [
        ("onset", 6.0),
        ("evidence", 21.0),
        ("alert", 21.0),
        ("alert_delivered", pytest.approx(21.3)),
        ("sigterm", 32.0),
        ("resolve", 33.5),
        ("job_gone", 35.0),
    ]
    assert not tl.has_power


def _drawn(fig) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[float]], dict[str, Any]]:
    spans: dict[str, list[tuple[float, float]]] = {}
    marks: dict[str, list[float]] = {}
    lines: dict[str, Any] = {}
    for ax in fig.axes:
        for patch in ax.patches:
            gid = patch.get_gid() or ""
            if gid.startswith("verdict:"):
                x0, width = patch.get_x(), patch.get_width()  # axvspan draws a Rectangle
                spans.setdefault(gid.split(":", 1)[1], []).append((x0, x0 + width))
        for line in ax.lines:
            gid = line.get_gid() or ""
            if gid.startswith("mark:"):
                marks.setdefault(gid.split(":")[1], []).append(float(line.get_xdata()[0]))
            elif gid:
                lines[gid] = line
    return spans, marks, lines


@pytest.mark.parametrize("power", [False, True])
def test_the_figure_places_every_band_mark_and_rank_where_the_events_say(power: bool) -> None:
    points = [p for p in (status_point(d, JOB) for d in polls(power)) if p is not None]
    tl = build_timeline(JOB, points, EVENTS)
    fig = timeline_figure(tl)
    spans, marks, lines = _drawn(fig)
    assert spans == {
        "healthy": [(0.0, 21.0)],
        "deadlock_suspected": [(21.0, 30.0)],
        "deadlock_confirmed": [(30.0, 35.0)],
    }
    panels = 3 if power else 2
    assert len(fig.axes) == panels
    assert {k: sorted(v) for k, v in marks.items()} == {
        "onset": [6.0] * panels,
        "evidence": [21.0] * panels,
        "alert": [21.0] * panels,
        "alert_delivered": [pytest.approx(21.3)] * panels,
        "sigterm": [32.0] * panels,
        "resolve": [33.5] * panels,
        "job_gone": [35.0] * panels,
    }
    # steps per rank: each polled step from the poll that saw it (these documents say no step_since),
    # frozen from the onset to the last poll
    for rank in (0, 1):
        steps = lines[f"steps:{rank}"]
        assert list(steps.get_xdata()) == [0.0, 2.0, 4.0, 6.0, 35.0]
        assert list(steps.get_ydata()) == [0, 1, 2, 3, 3]
    assert ("power:0" in lines) is power
    if power:
        assert list(lines["power:1"].get_ydata())[:7] == [610.0] * 6 + [140.0]


def test_the_png_is_written_and_shows_the_bands(tmp_path: Path) -> None:
    points = [p for p in (status_point(d, JOB) for d in polls(power=False)) if p is not None]
    out = plot_timeline(build_timeline(JOB, points, EVENTS), tmp_path / "pics" / "timeline.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    image = imread(out)[..., :3]
    assert image.shape[0] > 300 and image.shape[1] > 1000

    def share(colour: str) -> float:
        target = np.array(to_rgb(colour))
        return float(np.mean(np.all(np.abs(image - target) < 0.12, axis=-1)))

    # the three bands, blended at alpha 0.85 on white; confirmed is the shortest (5 s of 35)
    for verdict in ("healthy", "deadlock_suspected", "deadlock_confirmed"):
        blended = 0.85 * np.array(to_rgb(VERDICT_COLOURS[verdict])) + 0.15
        hex_colour = "#" + "".join(f"{int(255 * c):02x}" for c in blended)
        assert share(hex_colour) > 0.003, verdict


def test_an_empty_timeline_still_draws(tmp_path: Path) -> None:
    out = plot_timeline(build_timeline(JOB, [], []), tmp_path / "empty.png")
    assert out.stat().st_size > 5_000


def test_the_onset_mark_sits_on_rank_0s_last_step_drawn_from_real_status_documents() -> None:
    """Issue 28 (7): the onset mark and the step curve it annotates are on one clock. The detector sees
    steps taken between two polls (here at 100.3 s, polled every second): /status carries when each
    step was taken, the curve is drawn there, and "onset (last step)" sits on rank 0's last step - not
    on the step the poll saw 0.4 s later."""
    from gpu_triage.model.snapshot import Snapshot
    from gpu_triage.model.states import Mode
    from gpu_triage.serving.api import status_document
    from gpu_triage.verdicts.detector import Detector, GpuView, JobView
    from tests.watchdog.test_detector import SPIN, C, ranks_view

    det, docs, events, verdict = Detector(), [], [], "healthy"
    for t in range(0, 141):
        now = T0 + t + 0.7  # polled every second, 0.4 s after each step
        step = min(t // 10, 10)  # a step every 10 s, taken at 10 k + 0.3 s; the last at 100.3 s
        views = [GpuView(g, C, T0) if t <= 100 else GpuView(g, SPIN, T0 + 101.0) for g in range(4)]
        ranks = ranks_view(4, step=step, changed=T0 + 10.0 * step + 0.3)
        (job,) = det.update(now, views, [JobView(JOB, ranks, True, 4, "job")])
        snap = Snapshot(
            node="n",
            source="none",
            mode=Mode.OBSERVE,
            armed=False,
            cycle=t,
            time=now,
            period_s=1.0,
            jobs=(job,),
        )
        docs.append(status_document(snap))
        if str(job.verdict) != verdict:
            change = {"from": verdict, "to": str(job.verdict), "onset": job.onset}
            events.append(event(len(events) + 1, now - T0, "verdict", change))
            verdict = str(job.verdict)
    assert verdict in ("deadlock_suspected", "deadlock_confirmed"), verdict
    timeline = build_timeline(JOB, [status_point(d, JOB) for d in docs], events)
    (onset,) = [m for m in timeline.marks if m.kind == "onset"]
    assert onset.time_s == pytest.approx(T0 + 100.3)
    fig = timeline_figure(timeline)
    (curve,) = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "steps:0"]
    (mark,) = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "mark:onset:steps"]
    xs, ys = np.asarray(curve.get_xdata(), float), np.asarray(curve.get_ydata(), float)
    last_step_x = xs[int(np.argmax(ys == ys.max()))]
    assert last_step_x == pytest.approx(float(mark.get_xdata()[0]), abs=0.05), (last_step_x, mark.get_xdata())
