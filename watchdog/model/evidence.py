"""What the detector recorded about one job this cycle, typed (pure values).

The detector fills one :class:`JobEvidence` per job (:attr:`gpu_triage.model.snapshot.JobStatus.evidence`);
readers in the daemon, metrics and alerts read its fields. It becomes JSON only at the edge - REST
``/status``, alerts, log lines, the event store, evidence bundles - through
:meth:`gpu_triage.model.snapshot.JobStatus.evidence_dict`, which writes the keys documented in
docs/detector.md ("Evidence"). Times are epoch seconds on the daemon's timeline; ``_s`` durations.

The stack, NCCL RAS and cross-node facts are typed in the signal layer (above this one): here they are
anything with a ``to_dict()`` (:class:`Reported`), rendered at the edge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gpu_triage.model.findings import Finding, Stance
from gpu_triage.model.health import Blame, HardwareFinding, finding_dict
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.states import GpuState

Telemetry = Literal["ok", "lost", "none", "partial"]
"""How the job's GPUs read this cycle: ``ok``; ``lost`` (reads failing); ``none`` (the job has no
GPU); ``partial`` (some GPUs unreadable or their utilisation missing)."""


class Reported(Protocol):
    """A signal's typed facts that render themselves as JSON (stacks, NCCL RAS, the fleet)."""

    def to_dict(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of the job's world this node sees."""

    visible_ranks: int
    """Ranks of the job seen on this node."""
    world_size: int | None
    """The job's world size, when a rank said it (None: unknown)."""
    unseen_ranks: int
    """Ranks of the world not seen on this node (on other nodes, or missing)."""
    lease_scope: str = "rank"
    """``rank`` (each rank writes its lease) or ``node`` (one writer speaks for the node's ranks)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "visible_ranks": self.visible_ranks,
            "world_size": self.world_size,
            "unseen_ranks": self.unseen_ranks,
            "lease_scope": self.lease_scope,
        }


@dataclass(frozen=True, slots=True)
class CannotJudge:
    """One thing this node cannot judge about the job, and why."""

    what: Literal["steps", "power", "stacks"]
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"what": self.what, "why": self.why}


@dataclass(frozen=True, slots=True)
class JobEvidence:
    """The detector's record of one job this cycle (JSON keys in docs/detector.md, "Evidence")."""

    gpus: tuple[int, ...] = ()
    """The job's GPU indices (those its ranks are tied to, or the node's when inferred)."""
    gpus_inferred: bool = False
    """No rank is tied to a GPU and this is the node's only job: the node's GPUs stand in (context)."""
    gpu_states: Mapping[int, GpuState] = field(default_factory=dict)
    """Each job GPU's power-band state."""
    spin_band_since: float | None = None
    """Since when every job GPU has been in the spin band (None: not all spinning)."""
    step_by_rank: Mapping[int, int] = field(default_factory=dict)
    """The step each rank last reported (JSON ``steps``)."""
    phase_by_rank: Mapping[int, str] = field(default_factory=dict)
    """The phase each rank last reported (JSON ``phases``)."""
    steps_frozen_since: float | None = None
    """Since when no rank's step has advanced (None: the job has no progress files)."""
    step_interval_s: float = 0.0
    """The job's learned (or default) step interval."""
    first_step: str | None = None
    """``after_start`` / ``after_lease`` while the job waits for its first step, else None."""
    bytes_written_recently: float = 0.0
    """Bytes the job's processes wrote over the recent window."""
    bytes_read_recently: float = 0.0
    """Bytes the job's processes read over the recent window."""
    live_lease_until_by_rank: Mapping[int, float | None] = field(default_factory=dict)
    """Ranks holding a live lease (eval, save...), each with its expiry (JSON ``live_leases``)."""
    expired_lease_until_by_rank: Mapping[int, float | None] = field(default_factory=dict)
    """Ranks whose lease has expired, each with its expiry (JSON ``expired_leases``)."""
    nvlink_frozen_since: float | None = None
    """Since when the job GPUs' NVLink counters have not moved (None: moving or unread)."""
    telemetry: Telemetry = "ok"
    coverage: Coverage = Coverage(visible_ranks=0, world_size=None, unseen_ranks=0)
    signals: tuple[str, ...] = ()
    """The signals behind the verdict (``verdict_signal`` names, some with ``:detail``)."""
    cannot_judge: tuple[CannotJudge, ...] = ()
    """What this node cannot judge about the job (empty: every signal is there)."""
    gpus_unknown: bool = False
    """No rank is tied to a GPU and none could be inferred (JSON key only when true)."""
    not_kill_worthy_because: str | None = None
    """Why a hang-shaped verdict is not kill-worthy (JSON key only when set)."""
    untrusted_progress_files: tuple[Mapping[str, Any], ...] = ()
    """The job's progress files not believed this cycle (JSON key only when any)."""
    nccl_ras: Reported | None = None
    """NCCL RAS facts (:class:`gpu_triage.signals.nccl_ras.ras_facts.RasFacts`) when polled."""
    stacks: Reported | None = None
    """Stack facts (:class:`gpu_triage.signals.stacks.stack_facts.StackFacts`) when sampled."""
    stacks_where: str | None = None
    """One line per group of ranks: where their stacks wait (the detector sets it with ``stacks``)."""
    stack_phase_by_rank: Mapping[int, str] = field(default_factory=dict)
    """Where each sampled rank's latest stack is (one of the stack phases; metrics; in ``stacks``)."""
    fleet: Reported | None = None
    """What the other nodes' facts said (:class:`gpu_triage.signals.fleet.fusion.FleetEvidence`)."""
    hardware: tuple[HardwareFinding, ...] = ()
    """The node's hardware findings on the job's GPUs (and node-wide ones) this cycle: the facts behind
    the status's ``blame`` (JSON ``hardware``; unhealthy ones first)."""


def evidence_dict(
    evidence: JobEvidence | None,
    *,
    findings: Sequence[Finding] = (),
    kill_worthy: bool = False,
    cause: str | None = None,
    detector_error: str | None = None,
    blame: Blame = Blame.JOB,
) -> dict[str, Any]:
    """The JSON form of a job's evidence (the one place its keys are written; JSON-safe values).

    ``findings`` (stored once, on the job status) are written here with ``against``, the signals
    that spoke against a hang. A job the detector could not judge has only ``detector_error``.
    """
    if detector_error is not None:
        return {"detector_error": detector_error}
    if evidence is None:
        return {}
    e = evidence
    out: dict[str, Any] = {
        "gpus": list(e.gpus),
        "gpus_inferred": e.gpus_inferred,
        "gpu_states": {str(g): str(s) for g, s in e.gpu_states.items()},
        "spin_band_since": e.spin_band_since,
        "steps": {str(r): s for r, s in e.step_by_rank.items()},
        "phases": {str(r): p for r, p in e.phase_by_rank.items()},
        "steps_frozen_since": e.steps_frozen_since,
        "step_interval_s": round(e.step_interval_s, 3),
        "first_step": e.first_step,
        "bytes_written_recently": e.bytes_written_recently,
        "bytes_read_recently": e.bytes_read_recently,
        "live_leases": {str(r): t for r, t in e.live_lease_until_by_rank.items()},
        "expired_leases": {str(r): t for r, t in e.expired_lease_until_by_rank.items()},
        "nvlink_frozen_since": e.nvlink_frozen_since,
        "telemetry": e.telemetry,
        "coverage": e.coverage.to_dict(),
        "signals": list(e.signals),
        "kill_worthy": kill_worthy,
        "findings": [x.to_dict() for x in findings],
        "against": sorted({str(x.signal) for x in findings if x.stance is Stance.PROGRESS}),
        "cannot_judge": [c.to_dict() for c in e.cannot_judge],
        "blame": str(blame),
        "hardware": [finding_dict(h) for h in e.hardware],
    }
    if e.gpus_unknown:
        out["gpus_unknown"] = True
    if e.not_kill_worthy_because and not kill_worthy:
        out["not_kill_worthy_because"] = e.not_kill_worthy_because
    if cause:
        out["cause"] = cause
    if e.untrusted_progress_files:
        out["untrusted_progress_files"] = [dict(u) for u in e.untrusted_progress_files]
    if e.nccl_ras is not None:
        out["nccl_ras"] = dict(e.nccl_ras.to_dict())
    if e.stacks is not None:
        out["stacks"] = dict(e.stacks.to_dict())
    if e.stacks_where is not None:
        out["stacks_where"] = e.stacks_where
    if e.fleet is not None:
        out["fleet"] = dict(e.fleet.to_dict())
    result: dict[str, Any] = jsonable(out)
    return result
