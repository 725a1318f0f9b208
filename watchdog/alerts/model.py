"""The alert model and deterministic dedup keys (pure); each receiver's wire form is a sink
(:mod:`gpu_triage.alerts.sinks`, registered by name in :mod:`gpu_triage.alerts.registry`).

An :class:`Alert` is sink-neutral: it holds what a person needs at 3 a.m. (node, job, ranks and GPUs,
since when, the evidence, GPU-hours burned since onset, the runbook entry, the evidence bundle). It is
what the outbox stores (as :meth:`Alert.to_dict`); the sink's wire form is rendered at delivery time
by the sink, so secrets (PagerDuty routing key, Slack URL) never reach the event store.

Conditions (one alert each, deduplicated by ``node:job:condition``):

- ``deadlock`` - verdicts ``deadlock_suspected`` and ``deadlock_confirmed`` (one alert that escalates
  from severity ``error`` to ``critical``, so a receiver sees one incident, not two);
- ``deterministic_hang`` - the same hang signature (job + frozen step) seen again: "do not restart";
- ``stalled``, ``slow``, ``suspended``, ``stalled_checkpoint``, ``data_starvation``, ``telemetry_lost``,
  ``cannot_judge`` - alert only, never kill.

Each receiver's wire form is one module in :mod:`gpu_triage.alerts.sinks` (webhook, Alertmanager v2,
PagerDuty Events v2, Slack), registered by name in :mod:`gpu_triage.alerts.registry`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from gpu_triage.model import runbook
from gpu_triage.model.health import Blame
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.snapshot import GpuStatus, JobStatus
from gpu_triage.model.states import Verdict

SOURCE = "gpu-watchdog"
DEDUP_KEY_MAX = 255
"""The longest dedup key: the shortest limit any receiver puts on its key (PagerDuty's ``dedup_key``),
so one key serves every sink. Each sink's own limits live in its module (``alerts/sinks/``)."""


class Condition(StrEnum):
    DEADLOCK = "deadlock"
    DETERMINISTIC_HANG = "deterministic_hang"
    STALLED_CHECKPOINT = "stalled_checkpoint"
    DATA_STARVATION = "data_starvation"
    TELEMETRY_LOST = "telemetry_lost"
    STALLED = "stalled"
    SLOW = "slow"
    SUSPENDED = "suspended"
    CANNOT_JUDGE = "cannot_judge"


class Status(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


_CONDITION_OF: dict[Verdict, Condition] = {
    Verdict.DEADLOCK_SUSPECTED: Condition.DEADLOCK,
    Verdict.DEADLOCK_CONFIRMED: Condition.DEADLOCK,
    Verdict.STALLED_CHECKPOINT: Condition.STALLED_CHECKPOINT,
    Verdict.DATA_STARVATION: Condition.DATA_STARVATION,
    Verdict.TELEMETRY_LOST: Condition.TELEMETRY_LOST,
    Verdict.STALLED: Condition.STALLED,
    Verdict.SLOW: Condition.SLOW,
    Verdict.SUSPENDED: Condition.SUSPENDED,
    Verdict.CANNOT_JUDGE: Condition.CANNOT_JUDGE,
}

ALERT_NAMES: dict[Condition, str] = {
    Condition.DEADLOCK: "GpuTrainingDeadlock",
    Condition.DETERMINISTIC_HANG: "GpuTrainingDeterministicHang",
    Condition.STALLED_CHECKPOINT: "GpuTrainingStalledCheckpoint",
    Condition.DATA_STARVATION: "GpuTrainingDataStarvation",
    Condition.TELEMETRY_LOST: "GpuTelemetryLost",
    Condition.STALLED: "GpuTrainingStalled",
    Condition.SLOW: "GpuTrainingSlow",
    Condition.SUSPENDED: "GpuTrainingSuspended",
    Condition.CANNOT_JUDGE: "GpuTrainingCannotJudge",
}

#: The Alertmanager ``severity`` label of each condition (fixed per alert: labels identify it).
LABEL_SEVERITY: dict[Condition, str] = {
    Condition.DEADLOCK: "critical",
    Condition.DETERMINISTIC_HANG: "critical",
    Condition.STALLED_CHECKPOINT: "warning",
    Condition.DATA_STARVATION: "warning",
    Condition.TELEMETRY_LOST: "warning",
    Condition.STALLED: "warning",
    Condition.SLOW: "info",
    Condition.SUSPENDED: "info",
    Condition.CANNOT_JUDGE: "info",
}


def condition_for(verdict: Verdict | str) -> Condition | None:
    """The alert condition a verdict raises, or None (``healthy``, ``checkpoint``)."""
    try:
        return _CONDITION_OF.get(Verdict(verdict))
    except ValueError:
        return None


def severity_for(condition: Condition, verdict: Verdict | str) -> str:
    """PagerDuty severity: a suspected deadlock is an ``error``, a confirmed one ``critical``."""
    if condition is Condition.DEADLOCK:
        return "critical" if verdict == Verdict.DEADLOCK_CONFIRMED else "error"
    return LABEL_SEVERITY[condition]


def dedup_key(node: str, job: str, condition: Condition | str) -> str:
    """``node:job:condition``, deterministic; over 255 characters the middle is replaced by a hash."""
    key = f"{node}:{job}:{condition}"
    if len(key) <= DEDUP_KEY_MAX:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    tail = f"~{digest}:{condition}"
    return key[: DEDUP_KEY_MAX - len(tail)] + tail


def runbook_url(base: str | None, anchor: str) -> str:
    """``base#anchor``, always absolute: ``alerts.runbook_url`` (config.py checks that it is an absolute
    http(s) URL), else the placeholder
    :data:`~gpu_triage.model.runbook.DEFAULT_RUNBOOK_BASE` - the same base
    ``gpu-watchdog render-rules`` writes into the Prometheus rules."""
    try:
        return runbook.link(base.split("#", 1)[0] if base else None, anchor)
    except runbook.BadRunbookBase:  # config.py refuses it; an alert never fails for a link
        return runbook.link(None, anchor)


def gpu_hours(n_gpus: int, onset: float | None, now: float) -> float:
    """GPU-hours burned since ``onset``: ``n_gpus x (now - onset) / 3600`` (0 without an onset)."""
    if onset is None or n_gpus <= 0 or now <= onset:
        return 0.0
    return round(n_gpus * (now - onset) / 3600.0, 3)


def rfc3339(t: float) -> str:
    """Epoch seconds as RFC 3339 UTC with milliseconds (``2025-12-02T12:00:00.000Z``)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def duration_text(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def gpu_ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``0-3,5``."""
    out: list[str] = []
    ordered = sorted(set(values))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert message, sink-neutral. Times are epoch seconds."""

    dedup_key: str
    node: str
    job: str
    condition: str
    verdict: str
    severity: str
    status: str
    summary: str
    description: str
    onset: float | None
    """When the signature began (the detector's onset)."""
    starts_at: float
    """Onset, or when the watchdog first saw the condition: stable within an alert."""
    time: float
    """When this message was made."""
    ends_at: float | None = None
    """When it cleared (resolved messages only)."""
    ranks: tuple[dict[str, Any], ...] = ()
    gpus: tuple[int, ...] = ()
    gpu_details: tuple[dict[str, Any], ...] = ()
    signals: tuple[str, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)
    gpu_hours: float = 0.0
    runbook: str = ""
    bundle: str | None = None
    actions: dict[str, Any] = field(default_factory=dict)
    """What the watchdog did and will do (mode, capture, kill)."""
    cause: str | None = None

    @property
    def firing(self) -> bool:
        return self.status == Status.FIRING

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = [dict(r) for r in self.ranks]
        d["gpus"] = list(self.gpus)
        d["gpu_details"] = [dict(g) for g in self.gpu_details]
        d["signals"] = list(self.signals)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Alert:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in d.items() if k in known}
        for name in ("ranks", "gpus", "gpu_details", "signals"):
            values[name] = tuple(values.get(name) or ())
        values["evidence"] = dict(values.get("evidence") or {})
        values["actions"] = dict(values.get("actions") or {})
        return cls(**values)


# --------------------------------------------------------------------------------------------------
# Building alerts.


def job_gpus(job: JobStatus) -> tuple[int, ...]:
    """The GPUs of a job: the detector's evidence list, else the ranks' GPUs."""
    listed = job.evidence.gpus if job.evidence is not None else ()
    if listed:
        return tuple(sorted(set(listed)))
    return tuple(sorted({r.gpu for r in job.ranks if r.gpu is not None}))


def frozen_steps(job: JobStatus) -> tuple[int, ...]:
    """The distinct steps the ranks report (the evidence's ``step_by_rank``), sorted."""
    values = set(job.evidence.step_by_rank.values()) if job.evidence is not None else set()
    if not values:
        values = {r.step for r in job.ranks if r.step is not None}
    return tuple(sorted(values))


def blame_text(job: JobStatus) -> str | None:
    """``node (GPU 1 Xid 79)`` for a verdict that blames someone other than the job (None: the job)."""
    if job.blame is Blame.JOB:
        return None
    hardware = job.evidence.hardware if job.evidence is not None else ()
    faults = [h for h in hardware if h.is_fault]
    if not faults:
        return str(job.blame)
    f = faults[0]
    what = f"Xid {f.xid}" if f.xid is not None else str(f.kind)
    where = f"GPU {f.gpu}" if f.gpu is not None else "node"
    return f"{job.blame} ({where} {what})"


def hang_signature(job: JobStatus) -> str | None:
    """``job@steps`` - the job and the step(s) at which its steps froze; None without steps."""
    steps = frozen_steps(job)
    if not steps:
        return None
    return f"{job.job}@{','.join(map(str, steps))}"


def _summary(
    condition: Condition,
    job: JobStatus,
    node: str,
    gpus: Sequence[int],
    since: float,
    now: float,
    burned: float,
) -> str:
    steps = frozen_steps(job)
    at = f" at step {gpu_ranges(steps)}" if steps else ""
    gpu_text = f"GPUs {gpu_ranges(gpus)}" if gpus else "no GPU mapped"
    lasting = f"for {duration_text(now - since)}, {burned:g} GPU-h burned"
    if condition is Condition.DETERMINISTIC_HANG:
        return (
            f"DETERMINISTIC HANG - do not restart: job {job.job} on {node} hung again{at} "
            f"({len(job.ranks)} ranks, {gpu_text}) {lasting}"
        )
    what = {
        Condition.DEADLOCK: str(job.verdict).replace("_", " "),
        Condition.STALLED_CHECKPOINT: "stalled checkpoint",
        Condition.DATA_STARVATION: f"data starvation ({job.cause or 'cause unknown'})",
        Condition.TELEMETRY_LOST: "GPU telemetry lost",
        Condition.STALLED: f"no progress, no proof of a hang ({job.cause or 'cause unknown'})",
        Condition.SLOW: f"slow ({job.cause or 'past its budget while working'})",
        Condition.SUSPENDED: "suspended (a rank is stopped)",
        Condition.CANNOT_JUDGE: f"cannot judge ({job.cause or 'no signal'})",
    }[condition]
    return f"{what}: job {job.job} on {node}{at} ({len(job.ranks)} ranks, {gpu_text}) {lasting}"


def build_alert(
    job: JobStatus,
    *,
    node: str,
    condition: Condition,
    now: float,
    first_seen: float,
    gpus: Sequence[GpuStatus] = (),
    runbook_base: str | None = None,
    bundle: str | None = None,
    actions: Mapping[str, Any] | None = None,
) -> Alert:
    """A firing alert for ``job`` under ``condition`` at ``now``."""
    job_gpu_ids = job_gpus(job)
    onset = job.onset
    since = onset if onset is not None else first_seen
    burned = gpu_hours(len(job_gpu_ids), since, now)
    by_index = {g.gpu: g for g in gpus}
    gpu_details = tuple(
        jsonable(
            {
                "gpu": g.gpu,
                "uuid": g.uuid,
                "state": str(g.state),
                "state_since": g.state_since,
                "power_w": g.power_w,
                "power_limit_w": g.power_limit_w,
                "utilization_ratio": g.utilization_ratio,
            }
        )
        for g in (by_index[i] for i in job_gpu_ids if i in by_index)
    )
    ranks = tuple(
        {
            "rank": r.rank,
            "pid": r.pid,
            "gpu": r.gpu,
            "step": r.step,
            "phase": r.phase,
            "alive": r.alive,
            "process_status": r.process_status,
            **({"pod": r.pod.to_dict()} if getattr(r, "pod", None) is not None else {}),
        }
        for r in job.ranks
    )
    signals = job.evidence.signals if job.evidence is not None else ()
    stacks_where = job.evidence.stacks_where if job.evidence is not None else None
    anchor = str(condition) if condition is Condition.DETERMINISTIC_HANG else str(job.verdict)
    blamed = blame_text(job)
    if blamed is not None and condition is Condition.DEADLOCK:
        anchor = f"blame_{job.blame}"  # the runbook entry for whom it blames (operator guide)
    runbook = runbook_url(runbook_base, anchor)
    summary = _summary(condition, job, node, job_gpu_ids, since, now, burned)
    if blamed is not None:
        summary = f"{summary} - blame {blamed}"
    acts = dict(actions or {})
    lines = [
        summary,
        "",
        f"node: {node}",
        f"job: {job.job}",
        f"verdict: {job.verdict}" + (f" (cause {job.cause})" if job.cause else ""),
        f"since: {rfc3339(since)} ({duration_text(now - since)} ago)",
        f"ranks: {', '.join(_rank_text(r) for r in ranks) or 'none found'}",
        f"GPUs: {gpu_ranges(job_gpu_ids) or 'none mapped'}",
        f"GPU-hours burned since onset: {burned:g}",
        f"signals: {', '.join(signals) or 'none'}",
        f"blame: {blamed or job.blame}",
        *([f"stacks: {stacks_where}"] if stacks_where else []),
        f"runbook: {runbook}",
        f"evidence bundle: {bundle or 'not captured'}",
    ]
    if acts.get("next"):
        lines.append(f"next: {acts['next']}")
    return Alert(
        dedup_key=dedup_key(node, job.job, condition),
        node=node,
        job=job.job,
        condition=str(condition),
        verdict=str(job.verdict),
        severity=severity_for(condition, job.verdict),
        status=Status.FIRING.value,
        summary=summary,
        description="\n".join(lines),
        onset=onset,
        starts_at=since,
        time=now,
        ranks=ranks,
        gpus=job_gpu_ids,
        gpu_details=gpu_details,
        signals=signals,
        evidence=job.evidence_dict(),
        gpu_hours=burned,
        runbook=runbook,
        bundle=bundle,
        actions=acts,
        cause=job.cause,
    )


def _rank_text(r: Mapping[str, Any]) -> str:
    parts = [f"rank {r['rank']}"]
    if r.get("pid") is not None:
        parts.append(f"pid {r['pid']}")
    if r.get("gpu") is not None:
        parts.append(f"gpu {r['gpu']}")
    if r.get("step") is not None:
        parts.append(f"step {r['step']}")
    pod = pod_text(r)
    if pod:
        parts.append(f"pod {pod}")
    return " ".join(parts)


def pod_text(r: Mapping[str, Any]) -> str:
    """``namespace/pod[/container]`` of a rank in a Kubernetes pod, else its pod UID, else ""."""
    pod = r.get("pod")
    if not isinstance(pod, Mapping):
        return ""
    if pod.get("pod"):
        name = f"{pod.get('namespace') or '?'}/{pod['pod']}"
        return f"{name}/{pod['container']}" if pod.get("container") else name
    return str(pod.get("pod_uid") or "")


def resolve(alert: Alert, now: float, reason: str) -> Alert:
    """The resolved form of a firing alert: ``ends_at`` = ``now``."""
    summary = f"RESOLVED ({reason}): {alert.summary}"
    return dataclasses.replace(
        alert,
        status=Status.RESOLVED.value,
        ends_at=now,
        time=now,
        summary=summary,
        description=f"{summary}\n\n{alert.description}",
        actions={**alert.actions, "resolved_because": reason},
    )


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
