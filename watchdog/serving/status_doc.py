"""The OpenAPI descriptions of the REST documents (``/status``, ``/gpus``, ``/healthz``, ``/events``,
the control bodies): pydantic models that document and validate the JSON that ``serving.api`` writes
from the snapshot; tests validate real daemon output against them. Beside ``evidence_doc`` (a job's
evidence) and ``health_doc`` (the node's health)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpu_triage.actions.silences import MAX_COMMENT_CHARS, MAX_SILENCE_S
from gpu_triage.model.health import Blame
from gpu_triage.model.states import GpuState, Mode, Verdict
from gpu_triage.serving.evidence_doc import EvidenceDoc
from gpu_triage.serving.health_doc import NodeHealthDoc


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PodDoc(_Doc):
    pod_uid: str = Field(description="UID of the Kubernetes pod the rank runs in (from its cgroup)")
    namespace: str | None = Field(description="the pod's namespace, where the node's log directories name it")
    pod: str | None = Field(description="the pod's name")
    container: str | None = Field(description="the container's name")
    container_id: str | None = Field(description="the container's id (64 hex digits)")


class RankDoc(_Doc):
    rank: int
    pid: int | None
    gpu: int | None
    step: int | None
    step_since: float | None = Field(
        default=None,
        description="When the rank took its step (epoch seconds, the clock of the job's onset)",
    )
    phase: str | None
    lease_until: float | None = Field(description="End of the rank's phase lease (epoch seconds)")
    alive: bool | None
    process_status: str | None = Field(description="psutil status ('disk-sleep' is D-state)")
    pod: PodDoc | None = Field(default=None, description="Kubernetes pod of the rank; null outside one")


class GpuDoc(_Doc):
    gpu: int = Field(description="GPU index")
    uuid: str | None
    name: str | None = Field(description="NVML device name")
    model: str = Field(description="Power table the GPU was matched to")
    power_w: float | None
    power_limit_w: float | None
    utilization_ratio: float | None = Field(description="0..1")
    memory_used_bytes: float | None
    state: GpuState
    state_since: float | None = Field(description="epoch seconds")
    energy_j: float | None
    temperature_c: float | None
    sm_clock_mhz: float | None
    read_errors_total: int
    pci_bus_id: str | None = Field(
        default=None, description="NVML bus id (00000000:1B:00.0); the kernel log names GPUs by it"
    )


class JobDoc(_Doc):
    job: str
    ranks: list[RankDoc]
    verdict: Verdict
    kill_worthy: bool = Field(
        description="True only for a hung verdict resting on positive evidence of a hang (may be killed)"
    )
    onset: float | None = Field(description="When the signature began (epoch seconds)")
    raised: float | None = Field(description="When the verdict was raised (epoch seconds)")
    evidence: EvidenceDoc = Field(description="What the detector recorded (docs/detector.md, Evidence)")
    cause: str | None = Field(
        description="What explains the verdict (data_starvation: storage_wait, cpu_contention, loader; "
        "stalled/slow: e.g. waiting_on_other_nodes, lease_expired:eval, asymmetric:gpu 3)"
    )
    blame: Blame = Field(
        description="Whom the verdict blames: job, node (a hardware fault on a job GPU, a node of the job "
        "lost), network (a fabric fault) or unknown (docs/detector.md, Blame)"
    )


class StatusDoc(_Doc):
    node: str
    source: str
    mode: Mode
    armed: bool
    cycle: int
    time: float = Field(description="When the cycle ran (epoch seconds)")
    period_s: float
    sample_duration_s: float
    last_sample_time: float | None
    started_at: float
    version: str
    gpus: list[GpuDoc]
    jobs: list[JobDoc]
    untrusted_progress_files: list[dict[str, Any]] = Field(
        description="Progress files not believed (another owner, or a pid that is not the rank it claims)"
    )
    input_errors: list[dict[str, Any]] = Field(
        default_factory=list,
        description="What failed this cycle without stopping it: kind (progress_file, job, persist, store, "
        "actions, signal), where, error",
    )
    failed_cycles: int = Field(0, description="Consecutive cycles that failed (this is the last good one)")
    clock_offset_s: float = Field(
        0.0,
        description="Wall clock minus the daemon's monotonic timeline, on which every time here lies "
        "(0 until the wall clock steps)",
    )
    stacks: dict[str, Any] = Field(
        default_factory=dict,
        description="Stack sampler (py-spy): state (available, py_spy_missing, ptrace_denied, disabled), "
        "cpu_s_last_min against budget_cpu_s_per_min, dump counters, nccl_ras (the RAS poller); per-job "
        "stacks and RAS facts are in the job evidence",
    )
    cluster: dict[str, Any] = Field(
        default_factory=dict,
        description="Other nodes' facts from Prometheus ([cluster]): prometheus_url (null: per-node only), "
        "queries_total, errors_total, last_error, job_rules and last_source (rules: the recording rules' "
        "aggregates, facts: every node's raw facts); per job, evidence.fleet says what they completed or "
        "vetoed, or why they are unknown (fallback: per-node judgment)",
    )
    signals: dict[str, Any] = Field(
        default_factory=dict,
        description="The status of each further registered signal, by name (gpu_triage.signals.registry); "
        "absent when there is none beyond stacks, nccl_ras and cluster",
    )
    node_health: NodeHealthDoc | None = Field(
        default=None,
        description="The node verdict (docs/health.md): healthy, degraded or unhealthy, per GPU with the "
        "findings behind it (Xid, ECC, row remap, NVLink, throttle, PCIe, GPU lost)",
    )


class HealthDoc(_Doc):
    status: Literal["ok", "degraded", "stale", "starting", "failing"]
    last_cycle_age_s: float | None
    failed_cycles: int | None = None
    failed_cycles_total: int | None = None
    errors: list[str] = Field(default_factory=list, description="What degraded the last cycle")
    max_age_s: float
    cycle: int | None


class EventsDoc(_Doc):
    events: list[dict[str, Any]]
    since: int
    limit: int
    next_since: int = Field(description="Pass as ?since= to get the following page")
    more: bool = Field(description="True when more events follow this page")


class ArmRequest(_Doc):
    mode: Literal["alert", "kill"]


class SilenceRequest(_Doc):
    matchers: dict[str, str] = Field(description="Exact matches on job, verdict and/or node", min_length=1)
    duration_s: float = Field(gt=0, le=MAX_SILENCE_S)
    comment: str = Field(default="", max_length=MAX_COMMENT_CHARS)


class SilenceDoc(_Doc):
    id: str
    matchers: dict[str, str]
    comment: str
    starts_at: float
    ends_at: float


class CommandDoc(_Doc):
    accepted: bool
    mode: Mode = Field(description="The mode requested")
    armed: bool
    current_mode: Mode | None = Field(description="The mode of the latest published cycle")
    applies: Literal["next_cycle"]


__all__ = [
    "ArmRequest",
    "CommandDoc",
    "EventsDoc",
    "GpuDoc",
    "HealthDoc",
    "JobDoc",
    "PodDoc",
    "RankDoc",
    "SilenceDoc",
    "SilenceRequest",
    "StatusDoc",
]
