"""`make demo` end to end (issue 7): the gate refuses the imbalanced plan, the real 2-rank DeepSpeed job
deadlocks at epoch end, the real daemon (--source none) raises deadlock_suspected, captures evidence,
alerts a real Alertmanager and - armed - kills exactly the job; the equalized plan completes. The
summary must report the detection, alert and kill times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, require_binary

pytestmark = [pytest.mark.slow, pytest.mark.trainer, pytest.mark.timeout(900), pytest.mark.isolated]


def test_make_demo_catches_and_kills_the_real_deadlock(tmp_path: Path) -> None:
    require_binary("prometheus-alertmanager", "Debian package prometheus-alertmanager (the demo's receiver)")
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "ft_trainer.devtools.demo", "--out", str(out), "--no-color"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] is True
    assert summary["gate"]["exit"] == 2 and summary["gate"]["seconds"] < 10
    times = summary["times_s"]
    for key in ("detection", "evidence", "alert_delivered", "sigterm", "alert_resolved"):
        assert times[key] is not None, (key, times)
    assert 0 < times["detection"] <= 60
    assert times["detection"] <= times["evidence"] <= times["sigterm"]
    assert times["alert_delivered"] <= times["sigterm"]
    assert summary["job_killed"] is True and summary["equalized_exit_codes"] == [0, 0]
    assert "phase_disagreement" in summary["signals"] or "steps_frozen" in summary["signals"]
    assert summary["alertmanager_alerts"][0]["training_job"] == "tiny-cpu"
    # The daemon's log has the verdict, the evidence and the kill, each as one line (gpu_triage.journal.logs).
    logged = summary["daemon_log"]
    assert logged["verdict"].startswith("verdict job=tiny-cpu "), logged
    assert "-> deadlock_suspected" in logged["verdict"] and "signals=" in logged["verdict"], logged
    assert logged["evidence"].startswith("evidence job=tiny-cpu bundle written path="), logged
    assert logged["kill"].startswith("kill job=tiny-cpu sigterm ok signal="), logged
    assert f"daemon log: {logged['kill']}" in r.stdout
    text = r.stdout
    assert "deadlock_suspected raised" in text and "SIGTERM to the job's group" in text
    assert "no GPU" in text  # says plainly which signals carried the verdict
    # The pictures: the timeline PNG drawn from the daemon's own events, the bundle's HTML report.
    pictures = summary["pictures"]
    png = Path(pictures["timeline_png"])
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    assert pictures["verdicts"][:3] == ["healthy", "deadlock_suspected", "deadlock_confirmed"]
    marks = pictures["marks"]
    for kind in ("onset", "evidence", "alert", "sigterm"):
        assert kind in marks, marks
    assert marks.index("onset") < marks.index("evidence") < marks.index("sigterm")
    report = Path(pictures["evidence_report"]).read_text()
    assert report.count("rank 0 (pid ") >= 1 and report.count("rank 1 (pid ") >= 1
    assert "<script" not in report
