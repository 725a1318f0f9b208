"""The alert model and the wire form of each sink (pure: no network)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpu_triage.alerts.model import (
    DEDUP_KEY_MAX,
    Alert,
    Condition,
    build_alert,
    condition_for,
    dedup_key,
    gpu_hours,
    hang_signature,
    resolve,
    rfc3339,
    runbook_url,
)
from gpu_triage.alerts.registry import endpoint, render
from gpu_triage.alerts.sinks.alertmanager import alertmanager_payload
from gpu_triage.alerts.sinks.pagerduty import PAGERDUTY_SUMMARY_MAX, pagerduty_payload
from gpu_triage.alerts.sinks.slack import slack_payload
from gpu_triage.alerts.sinks.webhook import webhook_payload
from gpu_triage.model.evidence import JobEvidence
from gpu_triage.model.runbook import DEFAULT_RUNBOOK_BASE
from gpu_triage.model.snapshot import JobStatus, RankStatus
from gpu_triage.model.states import KILL_WORTHY_VERDICTS, GpuState, Verdict
from gpu_triage.signals.pods import PodRef
from tests.watchdog.snapshots import T0, gpu_status


def make_job(
    verdict: Verdict = Verdict.DEADLOCK_CONFIRMED,
    *,
    job: str = "qwen3-32b-ft",
    ranks: int = 8,
    step: int = 1200,
    onset: float | None = T0 - 600.0,
    pids: list[int] | None = None,
    kill_worthy: bool | None = None,
) -> JobStatus:
    """A job as the detector reports it (evidence keys as ``watchdog/detector.py`` writes them)."""
    pids = pids if pids is not None else [10_000 + r for r in range(ranks)]
    healthy = verdict in (Verdict.HEALTHY, Verdict.CHECKPOINT)
    return JobStatus(
        job=job,
        ranks=tuple(
            RankStatus(
                rank=r,
                pid=pids[r],
                gpu=r,
                step=step,
                phase="train",
                lease_until=None,
                alive=True,
                process_status="running",
            )
            for r in range(ranks)
        ),
        verdict=verdict,
        kill_worthy=verdict in KILL_WORTHY_VERDICTS if kill_worthy is None else kill_worthy,
        onset=None if healthy else onset,
        raised=None if healthy else T0 - 300.0,
        evidence=JobEvidence(
            gpus=tuple(range(ranks)),
            step_by_rank={r: step for r in range(ranks)},
            steps_frozen_since=onset,
            signals=() if healthy else ("steps_frozen", "spin_band", "no_writes"),
        ),
    )


def _deadlock(verdict: Verdict = Verdict.DEADLOCK_CONFIRMED) -> JobStatus:
    return make_job(verdict)


def test_conditions_of_verdicts() -> None:
    assert condition_for(Verdict.DEADLOCK_SUSPECTED) is Condition.DEADLOCK
    assert condition_for(Verdict.DEADLOCK_CONFIRMED) is Condition.DEADLOCK
    assert condition_for(Verdict.STALLED_CHECKPOINT) is Condition.STALLED_CHECKPOINT
    assert condition_for(Verdict.DATA_STARVATION) is Condition.DATA_STARVATION
    assert condition_for(Verdict.TELEMETRY_LOST) is Condition.TELEMETRY_LOST
    assert condition_for(Verdict.HEALTHY) is None
    assert condition_for(Verdict.CHECKPOINT) is None
    assert condition_for("nonsense") is None


def test_dedup_key_is_node_job_condition_and_bounded() -> None:
    assert dedup_key("node-a", "job-1", Condition.DEADLOCK) == "node-a:job-1:deadlock"
    assert dedup_key("node-a", "job-1", Condition.DEADLOCK) == dedup_key("node-a", "job-1", "deadlock")
    long = dedup_key("n" * 200, "j" * 200, Condition.DEADLOCK)
    assert len(long) <= DEDUP_KEY_MAX
    assert long == dedup_key("n" * 200, "j" * 200, Condition.DEADLOCK)
    assert long != dedup_key("n" * 200, "j" * 199 + "x", Condition.DEADLOCK)
    assert long.endswith(":deadlock")


def test_gpu_hours_and_runbook() -> None:
    assert gpu_hours(8, T0 - 1800.0, T0) == 4.0
    assert gpu_hours(8, None, T0) == 0.0
    assert gpu_hours(0, T0 - 1800.0, T0) == 0.0
    assert runbook_url(None, "deadlock_confirmed") == f"{DEFAULT_RUNBOOK_BASE}#deadlock_confirmed"
    assert runbook_url("docs/relative.md", "slow") == f"{DEFAULT_RUNBOOK_BASE}#slow", "never relative"
    assert runbook_url("https://wiki/x#old", "stalled_checkpoint") == "https://wiki/x#stalled_checkpoint"
    assert rfc3339(T0) == "2025-12-02T12:00:00.000Z"


def test_alert_carries_what_a_person_needs() -> None:
    job = _deadlock()
    gpus = [gpu_status(i, state=GpuState.CHECKPOINT_OR_DEADLOCK, power_w=240.0) for i in range(8)]
    onset = job.onset
    assert onset is not None
    alert = build_alert(
        job,
        node="node-a",
        condition=Condition.DEADLOCK,
        now=onset + 1800.0,
        first_seen=onset + 30.0,
        gpus=gpus,
        bundle="/var/lib/gpu-watchdog/evidence/x",
        actions={"next": "SIGTERM at 12:31"},
    )
    assert alert.dedup_key == "node-a:qwen3-32b-ft:deadlock"
    assert alert.severity == "critical"
    assert alert.gpus == tuple(range(8))
    assert [r["rank"] for r in alert.ranks] == list(range(8))
    assert alert.gpu_hours == 4.0  # 8 GPUs x 30 min
    assert alert.starts_at == onset
    assert alert.runbook == f"{DEFAULT_RUNBOOK_BASE}#deadlock_confirmed"
    assert alert.bundle == "/var/lib/gpu-watchdog/evidence/x"
    assert "node-a" in alert.summary and "qwen3-32b-ft" in alert.summary and "GPUs 0-7" in alert.summary
    assert alert.signals
    for needle in ("since:", "ranks:", "GPU-hours", "runbook:", "evidence bundle:", "next: SIGTERM at 12:31"):
        assert needle in alert.description
    assert [g["power_w"] for g in alert.gpu_details] == [240.0] * 8
    again = Alert.from_dict(json.loads(json.dumps(alert.to_dict())))
    assert again == alert


def test_suspected_is_error_and_deterministic_hang_is_distinct() -> None:
    job = _deadlock(Verdict.DEADLOCK_SUSPECTED)
    suspected = build_alert(job, node="n", condition=Condition.DEADLOCK, now=T0, first_seen=T0)
    assert suspected.severity == "error"
    deterministic = build_alert(job, node="n", condition=Condition.DETERMINISTIC_HANG, now=T0, first_seen=T0)
    assert deterministic.dedup_key != suspected.dedup_key
    assert deterministic.summary.startswith("DETERMINISTIC HANG - do not restart")
    assert deterministic.runbook.endswith("#deterministic_hang")
    assert deterministic.severity == "critical"


def test_hang_signature_is_job_and_frozen_steps() -> None:
    job = _deadlock()
    assert hang_signature(job) == "qwen3-32b-ft@1200"
    assert hang_signature(make_job(step=1201)) == "qwen3-32b-ft@1201"
    assert hang_signature(make_job(job="other")) != hang_signature(job)


def test_alertmanager_payload_shape_firing_and_resolved() -> None:
    job = _deadlock()
    alert = build_alert(job, node="node-a", condition=Condition.DEADLOCK, now=T0, first_seen=T0 - 60)
    body = alertmanager_payload([alert], now=T0, resend_interval_s=60.0)
    assert isinstance(body, list) and len(body) == 1
    item = body[0]
    assert item["labels"] == {
        "alertname": "GpuTrainingDeadlock",
        "node": "node-a",
        "training_job": "qwen3-32b-ft",
        "condition": "deadlock",
        "severity": "critical",
        "service": "gpu-watchdog",
    }
    annotations = item["annotations"]
    assert annotations["summary"] == alert.summary
    assert annotations["runbook_url"] == f"{DEFAULT_RUNBOOK_BASE}#deadlock_confirmed"
    assert annotations["gpus"] == "0-7"
    assert json.loads(annotations["evidence"])["steps"]
    assert item["startsAt"] == rfc3339(alert.starts_at)
    assert item["endsAt"] == rfc3339(T0 + 240.0)  # 4 resend intervals ahead
    gone = resolve(alert, T0 + 100.0, "verdict is now healthy")
    item = alertmanager_payload([gone], now=T0 + 100.0, resend_interval_s=60.0)[0]
    assert item["endsAt"] == rfc3339(T0 + 100.0)
    assert item["labels"] == body[0]["labels"]  # the same alert, now ended


def test_pagerduty_payload_shape() -> None:
    job = _deadlock()
    alert = build_alert(job, node="node-a", condition=Condition.DEADLOCK, now=T0, first_seen=T0)
    alert = Alert.from_dict({**alert.to_dict(), "summary": "x" * 5000})
    event = pagerduty_payload(alert, "R0UTINGKEY")
    assert event["routing_key"] == "R0UTINGKEY"
    assert event["event_action"] == "trigger"
    assert event["dedup_key"] == "node-a:qwen3-32b-ft:deadlock"
    assert len(event["payload"]["summary"]) <= PAGERDUTY_SUMMARY_MAX
    assert event["payload"]["severity"] in ("critical", "error", "warning", "info")
    assert event["payload"]["source"] == "node-a"
    assert event["payload"]["custom_details"]["gpu_hours_burned"] == alert.gpu_hours
    assert event["links"] == [{"href": f"{DEFAULT_RUNBOOK_BASE}#deadlock_confirmed", "text": "Runbook"}]
    resolved = pagerduty_payload(resolve(alert, T0 + 5, "healthy"), "R0UTINGKEY")
    assert resolved == {"routing_key": "R0UTINGKEY", "event_action": "resolve", "dedup_key": alert.dedup_key}
    with pytest.raises(ValueError, match="routing key"):
        render("pagerduty", alert, now=T0, resend_interval_s=60)


def test_slack_and_webhook_payloads() -> None:
    job = _deadlock()
    alert = build_alert(job, node="node-a", condition=Condition.DEADLOCK, now=T0, first_seen=T0, bundle="/b")
    msg = slack_payload(alert)
    assert "qwen3-32b-ft" in msg["text"] and msg["text"].startswith(":rotating_light:")
    assert [b["type"] for b in msg["blocks"]] == ["section", "section", "context"]
    assert "Evidence: /b" in msg["blocks"][2]["elements"][0]["text"]
    assert slack_payload(resolve(alert, T0, "ok"))["text"].startswith(":white_check_mark:")
    hook = webhook_payload(alert)
    assert hook["status"] == "firing" and hook["source"] == "gpu-watchdog"
    assert hook["dedup_key"] == alert.dedup_key and hook["gpu_hours"] == alert.gpu_hours
    json.dumps(hook, allow_nan=False)


def test_endpoints() -> None:
    assert endpoint("alertmanager", "http://am:9093") == "http://am:9093/api/v2/alerts"
    assert endpoint("alertmanager", "http://am:9093/api/v2/alerts") == "http://am:9093/api/v2/alerts"
    assert endpoint("pagerduty", "https://events.pagerduty.com/v2/enqueue").endswith("/v2/enqueue")


def test_alert_names_where_each_rank_waits_from_its_stack() -> None:
    where = "rank 0: collective barrier @ t.py:80 main; rank 1: collective all_gather @ t.py:52 step"
    job = _deadlock()
    assert job.evidence is not None
    job = replace(job, evidence=replace(job.evidence, stacks_where=where))
    alert = build_alert(job, node="node-a", condition=Condition.DEADLOCK, now=T0, first_seen=T0 - 60)
    assert f"stacks: {where}" in alert.description
    item = alertmanager_payload([alert], now=T0, resend_interval_s=60.0)[0]
    assert item["annotations"]["stacks"] == where
    plain = build_alert(_deadlock(), node="node-a", condition=Condition.DEADLOCK, now=T0, first_seen=T0 - 60)
    assert "stacks:" not in plain.description
    assert "stacks" not in alertmanager_payload([plain], now=T0, resend_interval_s=60.0)[0]["annotations"]


def test_ranks_in_pods_are_named_in_the_alert() -> None:
    job = _deadlock()
    pod = PodRef("3f2a91c4-1b2d-4e5f-8a9b-0c1d2e3f4a5b", "ml-team", "qwen3-ft-worker-0", "trainer", "ab" * 32)
    unnamed = PodRef("77777777-1b2d-4e5f-8a9b-0c1d2e3f4a5b")
    ranks = (replace(job.ranks[0], pod=pod), replace(job.ranks[1], pod=unnamed), *job.ranks[2:])
    alert = build_alert(
        replace(job, ranks=ranks), node="node-a", condition=Condition.DEADLOCK, now=T0, first_seen=T0
    )
    assert alert.ranks[0]["pod"]["pod"] == "qwen3-ft-worker-0"
    assert "rank 0 pid" in alert.description and "pod ml-team/qwen3-ft-worker-0/trainer" in alert.description
    assert "pod 77777777-1b2d-4e5f-8a9b-0c1d2e3f4a5b" in alert.description
    (item,) = alertmanager_payload([alert], now=T0, resend_interval_s=60.0)
    assert (
        item["annotations"]["pods"]
        == "77777777-1b2d-4e5f-8a9b-0c1d2e3f4a5b,ml-team/qwen3-ft-worker-0/trainer"
    )
    assert (
        "pods" not in alertmanager_payload([_alert_of(job)], now=T0, resend_interval_s=60.0)[0]["annotations"]
    )


def _alert_of(job: JobStatus):
    return build_alert(job, node="node-a", condition=Condition.DEADLOCK, now=T0, first_seen=T0)


def test_a_sink_is_its_name_its_payload_and_data() -> None:
    """Issue 29: the sink interface is what a sink must do - render an alert - plus its traits as data
    (it was six members, four of them flags or URL rules each sink re-implemented)."""
    from gpu_triage.alerts.registry import SINK_KINDS
    from gpu_triage.alerts.sinks.protocol import SinkKind, SinkTraits

    assert {n for n in vars(SinkKind) if not n.startswith("_")} == {"name", "traits", "payload"}
    assert all(isinstance(kind.traits, SinkTraits) for kind in SINK_KINDS.values())
    assert SinkTraits().endpoint("http://hook/x/") == "http://hook/x/"  # a plain URL is used as given
