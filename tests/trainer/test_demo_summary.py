"""`make demo`'s summary lists its milestones in the order they happened (an alert seen in Alertmanager
before the detection it follows was a polling artefact read as the story)."""

from __future__ import annotations

from ft_trainer.devtools.demo import TIMELINE_LABELS, timeline_rows


def test_the_summary_orders_milestones_by_time_and_puts_the_missing_last() -> None:
    times = {
        "alert_delivered": 3.0,
        "detection": 1.5,
        "evidence": 1.6,
        "confirmed": 21.5,
        "sigterm": 26.6,
        "alert_resolved": None,
    }
    rows = timeline_rows(times)
    assert [label for label, _ in rows] == [
        "deadlock_suspected raised",
        "evidence bundle written",
        "alert seen in Alertmanager",
        "deadlock_confirmed",
        "SIGTERM to the job's group",
        "alert resolved",
    ]
    values = [v for _, v in rows if v is not None]
    assert values == sorted(values)
    # the alert before the detection in the input's order: still printed after it
    swapped = timeline_rows({"alert_delivered": 1.0, "detection": 2.0})
    assert [label for label, _ in swapped][:2] == ["alert seen in Alertmanager", "deadlock_suspected raised"]
    assert len(rows) == len(TIMELINE_LABELS)
