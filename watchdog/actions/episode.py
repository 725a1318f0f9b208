"""The engine's per-job state: one job's episode (:class:`Episode`: from the first actionable verdict
until it clears or the job is gone), its kill (:class:`KillState`) and the hang signatures seen across
episodes (:class:`HangSignatures`, the memory of the deterministic-hang breaker)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_triage.actions.kill_targets import KillPlan
from gpu_triage.actions.records import KV_SIGNATURES, KvState
from gpu_triage.alerts.model import Condition
from gpu_triage.model.actions import CaptureState, KillStage
from gpu_triage.model.snapshot import GpuStatus, JobStatus
from gpu_triage.model.states import Verdict
from gpu_triage.signals.slurm import SlurmTarget

SAME_HANG_ONSET_TOLERANCE_S = 5.0
MAX_SIGNATURES = 200

#: The fields persisted in ``actions.episodes`` besides condition, verdict and once (never rename one).
EPISODE_FIELDS = (
    "first_seen",
    "confirmed_seen",
    "signature",
    "sightings",
    "repeat",
    "capture_state",
    "capture_path",
    "capture_started",
    "capture_budget_s",
    "alert_key",
    "alerted_verdict",
    "kill_started",
    "hardware",
)


@dataclass(slots=True)
class Episode:
    job: str
    condition: Condition
    first_seen: float
    verdict: Verdict
    last: JobStatus
    confirmed_seen: float | None = None
    signature: str | None = None
    sightings: int = 1
    repeat: bool = False
    """The signature was seen in an earlier episode: a deterministic hang, never killed."""
    capture_state: CaptureState | None = None
    capture_path: str | None = None
    capture_started: float | None = None
    capture_budget_s: float = 0.0
    alert_key: str | None = None
    alerted_verdict: str | None = None
    kill_started: bool = False
    hardware: bool = False
    """The hang was blamed on the hardware (node or network): its sighting was withdrawn, so the
    deterministic-hang breaker never counts it against the job."""
    gpus: Sequence[GpuStatus] = ()
    once: set[str] = field(default_factory=set)
    """Tags of the records written once per episode (refusals, silences)."""

    @property
    def alert_condition(self) -> Condition:
        return Condition.DETERMINISTIC_HANG if self.repeat else self.condition

    def once_only(self, tag: str) -> bool:
        """True the first time ``tag`` is seen in this episode."""
        if tag in self.once:
            return False
        self.once.add(tag)
        return True

    def to_dict(self) -> dict[str, Any]:
        """What a restarted daemon needs to continue this episode (``actions.episodes``)."""
        out: dict[str, Any] = {"condition": str(self.condition), "verdict": str(self.verdict)}
        out |= {name: getattr(self, name) for name in EPISODE_FIELDS}
        if self.capture_state is not None:
            out["capture_state"] = str(self.capture_state)
        out["once"] = sorted(self.once)
        return out

    @classmethod
    def from_dict(cls, job: str, value: Mapping[str, Any], last: JobStatus) -> Episode:
        ep = cls(
            job, Condition(value["condition"]), float(value["first_seen"]), Verdict(value["verdict"]), last
        )
        for name in EPISODE_FIELDS[1:]:
            if name in value:
                setattr(ep, name, value[name])
        ep.sightings = int(ep.sightings)
        ep.once = {str(x) for x in value.get("once") or ()}
        if ep.capture_state is not None:
            ep.capture_state = CaptureState(ep.capture_state)
        if ep.capture_state is CaptureState.RUNNING:  # it died with the previous daemon: no waiting
            ep.capture_state = CaptureState.INTERRUPTED
        return ep


@dataclass(slots=True)
class KillState:
    """A job's kill, from the SIGTERM rung to done. Once its SIGTERM went out by signal, the plan is
    persisted (``actions.kills_in_progress``): a daemon restarted before the SIGKILL rung sends it
    (:mod:`gpu_triage.actions.kill_policy`)."""

    job: str
    hook: bool
    dry_run: bool
    stage: KillStage
    plan: KillPlan | None = None
    term_time: float | None = None
    alert_key: str | None = None
    counted_at: float | None = None
    """Its entry in the kills-per-hour budget (returned when nothing was sent after all)."""
    slurm_refused: str | None = None
    """Why the ranks' claimed Slurm job was not cancelled through Slurm (kill_via "auto" signals)."""
    slurm: SlurmTarget | None = None
    """The Slurm job the SIGTERM rung cancelled (the SIGKILL rung then goes through Slurm too)."""
    resumed: bool = False
    """Restored from the store by a restarted daemon (its SIGTERM was sent by the previous one)."""
    requeue: bool = False
    """A hang blamed on the node with ``actions.requeue``: the SIGTERM rung requeues a requeueable Slurm
    job instead of cancelling it (:mod:`gpu_triage.actions.requeue`)."""
    requeue_refused: str | None = None
    """Why it was not requeued (the rung cancelled instead)."""


class HangSignatures:
    """How often each hang signature (job + the step its ranks froze at) began an episode, persisted
    in ``actions.hang_signatures``."""

    def __init__(self, kv: KvState) -> None:
        self._kv = kv
        saved = kv.get(KV_SIGNATURES, {})
        self._entries: dict[str, dict[str, Any]] = saved if isinstance(saved, dict) else {}

    def sighting(self, signature: str, onset: float | None, now: float) -> int:
        """Count an episode of ``signature``; the same hang seen again by a restarted daemon (same
        onset) does not count twice. Returns the count."""
        entry = self._entries.get(signature)
        if (
            entry is not None
            and onset is not None
            and entry.get("onset") is not None
            and abs(float(entry["onset"]) - onset) <= SAME_HANG_ONSET_TOLERANCE_S
        ):
            entry["last_seen"] = now
        else:
            entry = {
                "count": int(entry["count"]) + 1 if entry else 1,
                "onset": onset,
                "first_seen": entry.get("first_seen", now) if entry else now,
                "last_seen": now,
            }
        self._entries[signature] = entry
        if len(self._entries) > MAX_SIGNATURES:
            oldest = sorted(self._entries, key=lambda k: self._entries[k].get("last_seen") or 0.0)
            for key in oldest[: len(self._entries) - MAX_SIGNATURES]:
                del self._entries[key]
        self._kv.set(KV_SIGNATURES, self._entries, now)
        return int(entry["count"])

    def withdraw(self, signature: str, now: float) -> None:
        """Take back one sighting of ``signature``: that hang was the hardware's, not the job's."""
        entry = self._entries.get(signature)
        if entry is None:
            return
        count = int(entry.get("count", 1)) - 1
        if count <= 0:
            del self._entries[signature]
        else:
            entry["count"] = count
            entry["onset"] = None  # the withdrawn hang's onset no longer names a counted sighting
        self._kv.set(KV_SIGNATURES, self._entries, now)


__all__ = ["EPISODE_FIELDS", "Episode", "HangSignatures", "KillState"]
