"""The OpenAPI description of ``/status``'s GPUs, jobs and their ranks: the models forbid
extra fields, so the documents and their description cannot drift apart (tests validate real output
against them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpu_triage.model.health import Blame
from gpu_triage.model.states import GpuState, Verdict
from gpu_triage.serving.evidence_doc import EvidenceDoc


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


__all__ = ["GpuDoc", "JobDoc", "PodDoc", "RankDoc"]
