"""The OpenAPI form of a job's evidence (``/status`` -> ``jobs[].evidence``).

These pydantic models mirror :class:`gpu_triage.model.evidence.JobEvidence` as
:func:`gpu_triage.model.evidence.evidence_dict` writes it (and the stack, NCCL RAS and fleet facts as
their ``to_dict()`` write them). They forbid extra fields, so the documentation cannot drift from the
document: tests validate real detector output against them. Times are epoch seconds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpu_triage.model.findings import Signal, Stance
from gpu_triage.model.health import Blame, FaultKind, FaultSource, HealthLevel, OperatorAction
from gpu_triage.model.states import GpuState


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FindingDoc(_Doc):
    """One signal's statement about the job this cycle (docs/detector.md, "Verdicts: two classes")."""

    signal: Signal
    stance: Stance = Field(description="hang (for a hang), progress (against one) or context")
    detail: str
    since: float | None = Field(default=None, description="since when it has held (epoch seconds)")
    ranks: list[int] | None = Field(default=None, description="the ranks it is about")
    gpus: list[int] | None = Field(default=None, description="the GPUs it is about")


class HardwareFindingDoc(_Doc):
    """One hardware finding on a job GPU or node-wide (docs/detector.md, "Blame")."""

    kind: FaultKind
    level: HealthLevel
    blame: Blame = Field(description="whom this finding blames")
    action: OperatorAction = Field(description="the operator's action for it (the Xid catalog's)")
    detail: str
    source: FaultSource
    gpu: int | None = Field(description="the GPU index (null: node-wide)")
    pci_bus_id: str | None = Field(description="the GPU's PCI bus id, when known")
    xid: int | None = Field(description="the Xid code, for kind xid")
    count: int = Field(description="how often it was seen")
    first_seen: float = Field(description="first sighting (the daemon's monotonic timeline, seconds)")
    last_seen: float = Field(description="last sighting (the daemon's monotonic timeline, seconds)")


class CannotJudgeDoc(_Doc):
    what: Literal["steps", "power", "stacks"]
    why: str


class CoverageDoc(_Doc):
    visible_ranks: int = Field(description="ranks of the job seen on this node")
    world_size: int | None = Field(description="the job's world size, when a rank said it")
    unseen_ranks: int = Field(description="ranks of the world not seen on this node")
    lease_scope: str = Field(description="rank (each rank writes its lease) or node (one writer per node)")


class StackGroupDoc(_Doc):
    where: str = Field(description="where the group's stacks wait (phase, op, call site)")
    ranks: list[int]


class RankStackDoc(_Doc):
    rank: int
    pid: int
    phase: str = Field(description="collective, checkpoint, eval, data, forward, backward, optimizer, other")
    op: str | None
    collective: str | None
    call_site: str | None
    thread: str
    fingerprint: str
    top: list[str] = Field(description="the innermost frames")
    sampled_at: float = Field(description="when the latest dump was taken (epoch seconds)")
    same_since: float = Field(description="when the first dump showing this same stack was taken")
    same_samples: int = Field(description="dumps in a row showing it")
    frozen_s: float = Field(description="how long the stack has not changed")


class StacksDoc(_Doc):
    """Stack evidence (py-spy; docs/evidence.md)."""

    sampler: str = Field(description="available, py_spy_missing, ptrace_denied, disabled...")
    world_size: int | None
    ranks: dict[str, RankStackDoc] = Field(description="each sampled rank's latest stack, by rank")
    errors: dict[str, str] = Field(description="ranks whose dump failed, with why")
    groups: list[StackGroupDoc]
    odd_ranks: list[int] = Field(description="ranks waiting somewhere the others are not")
    in_save: list[int]
    in_eval: list[int]
    frozen: bool = Field(description="every sampled rank frozen, most in a collective, none in save/eval")
    frozen_since: float | None
    complete: bool = Field(description="every rank of the world has a fresh stack here")
    unsampled_ranks: list[int]
    asleep_since: float | None = Field(description="since when every rank's host CPU has been idle")
    split: bool = Field(description="frozen, some ranks in a save/eval collective, the others in a step")
    split_ranks: list[int]
    step_ranks: list[int]


class NcclRasDoc(_Doc):
    """NCCL RAS facts (docs/evidence.md, "NCCL RAS as live evidence"), polled under suspicion."""

    status: str
    polled_at: float | None
    counts_frozen_since: float | None = Field(description="since when no collective was launched")
    missing_ranks: list[str]
    ranks_behind: list[str]
    statuses: list[str]
    error: str | None


class FleetOddDoc(_Doc):
    node: str
    rank: int


class FleetGroupDoc(_Doc):
    where: str
    ranks: list[str] = Field(description="node/rank names (at most the first few)")
    count: int


class FleetSplitDoc(_Doc):
    phase_ranks: list[FleetOddDoc] = Field(description="ranks waiting in a save's or an eval's collective")
    step_ranks: list[FleetOddDoc] = Field(description="ranks frozen inside a training step")


class FleetLostDoc(_Doc):
    node: str
    last_facts: float = Field(description="when the node's last facts were taken (epoch seconds)")


class FleetDoc(_Doc):
    """What the other nodes' facts said about the job's world ([cluster]; docs/cluster.md)."""

    state: Literal["unknown", "incomplete", "complete", "veto", "node_lost"]
    reason: str
    nodes: list[str]
    stale_nodes: list[str]
    stacks_complete: bool
    odd: list[FleetOddDoc]
    groups: list[FleetGroupDoc]
    frozen_since: float | None
    age_s: float | None = Field(description="age of the oldest remote fact used")
    veto: str | None = Field(default=None, description="why another node's facts veto a hang")
    fallback: str | None = Field(default=None, description="set when the node judges alone")
    split: FleetSplitDoc | None = Field(
        default=None, description="the world split between a save's/eval's collective and a training step"
    )
    lost: list[FleetLostDoc] | None = Field(default=None, description="the nodes lost (state node_lost)")
    source: Literal["rules"] | None = Field(
        default=None, description="rules: judged from the recording rules' aggregates ([cluster] job_rules)"
    )


class EvidenceDoc(_Doc):
    """What the detector recorded about the job this cycle (docs/detector.md, "Evidence").

    Every key is present for a judged job except the optional ones marked below; a job the detector
    could not judge this cycle has only ``detector_error``; a job not judged yet has none.
    """

    gpus: list[int] | None = Field(default=None, description="the job's GPU indices")
    gpus_inferred: bool | None = Field(
        default=None, description="no rank tied to a GPU, the node's only job: its GPUs stand in (context)"
    )
    gpu_states: dict[str, GpuState] | None = Field(default=None, description="each job GPU's state")
    spin_band_since: float | None = Field(default=None, description="since when every job GPU spins")
    steps: dict[str, int] | None = Field(default=None, description="each rank's last step, by rank")
    phases: dict[str, str] | None = Field(default=None, description="each rank's last phase, by rank")
    steps_frozen_since: float | None = Field(
        default=None, description="since when no rank's step advanced (null without progress files)"
    )
    step_interval_s: float | None = Field(default=None, description="the learned (or default) step interval")
    first_step: Literal["after_start", "after_lease"] | None = Field(
        default=None, description="set while the job waits for its first step"
    )
    bytes_written_recently: float | None = Field(default=None, description="bytes written, recent window")
    bytes_read_recently: float | None = Field(default=None, description="bytes read, recent window")
    live_leases: dict[str, float | None] | None = Field(
        default=None, description="ranks holding a live lease, each with its expiry"
    )
    expired_leases: dict[str, float | None] | None = Field(
        default=None, description="ranks whose lease expired, each with its expiry"
    )
    nvlink_frozen_since: float | None = Field(
        default=None, description="since when NVLink counters are still"
    )
    telemetry: Literal["ok", "lost", "none", "partial"] | None = Field(
        default=None, description="how the job's GPUs read this cycle"
    )
    coverage: CoverageDoc | None = None
    signals: list[str] | None = Field(default=None, description="the signals behind the verdict")
    kill_worthy: bool | None = Field(default=None, description="the job status's kill_worthy")
    findings: list[FindingDoc] | None = Field(default=None, description="every signal's statement")
    against: list[Signal] | None = Field(default=None, description="signals that spoke against a hang")
    cannot_judge: list[CannotJudgeDoc] | None = Field(
        default=None, description="what this node cannot judge about the job (empty: every signal is there)"
    )
    gpus_unknown: bool | None = Field(default=None, description="optional: true when no GPU could be tied")
    not_kill_worthy_because: str | None = Field(
        default=None, description="optional: why a hang-shaped verdict is not kill-worthy"
    )
    cause: str | None = Field(default=None, description="optional: the job status's cause")
    blame: Blame | None = Field(
        default=None,
        description="whom the verdict blames: job, node, network or unknown (the status's blame)",
    )
    hardware: list[HardwareFindingDoc] | None = Field(
        default=None,
        description="the hardware findings on the job's GPUs and node-wide: the facts behind blame",
    )
    untrusted_progress_files: list[dict[str, object]] | None = Field(
        default=None, description="optional: the job's progress files not believed this cycle"
    )
    nccl_ras: NcclRasDoc | None = Field(default=None, description="optional: NCCL RAS facts when polled")
    stacks: StacksDoc | None = Field(default=None, description="optional: stack facts when sampled")
    stacks_where: str | None = Field(default=None, description="optional: where each group of ranks waits")
    fleet: FleetDoc | None = Field(default=None, description="optional: what the other nodes' facts said")
    detector_error: str | None = Field(
        default=None, description="only key when the detector could not judge the job this cycle"
    )
