"""The OpenAPI description of ``/status`` ``node_health`` (the node verdict, docs/health.md): the models
forbid extra fields, so the document and its description cannot drift apart (tests validate real
output against them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpu_triage.model.health import Blame, HealthLevel, OperatorAction


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HealthFindingDoc(_Doc):
    kind: str = Field(description="xid, gpu_lost, fallen_off_bus, ecc_uncorrectable, row_remap_failure, ...")
    level: HealthLevel
    blame: Blame = Field(description="Whom the finding blames: job (application), node, network, unknown")
    action: OperatorAction = Field(description="What the operator should do (the Xid catalog's action)")
    detail: str = Field(description="Human words: 'Xid 79: GPU has fallen off the bus'")
    source: str = Field(description="nvml_event, nvml_poll or kernel_log")
    gpu: int | None
    pci_bus_id: str | None
    xid: int | None
    count: int = Field(description="Sightings while held")
    first_seen: float
    last_seen: float


class GpuHealthDoc(_Doc):
    gpu: int
    pci_bus_id: str | None
    level: HealthLevel
    reasons: list[str] = Field(description="The findings' details, worst first")
    findings: list[HealthFindingDoc]


class NodeHealthDoc(_Doc):
    level: HealthLevel = Field(description="The node verdict: the worst GPU or node-wide finding")
    gpus: list[GpuHealthDoc]
    findings: list[HealthFindingDoc] = Field(description="Node-wide findings (a bus id of no known GPU)")
    read_errors: list[str] = Field(description="Health reads that failed this cycle")
    xid_totals: list[dict[str, Any]] = Field(description="Xids seen since start: gpu, pci_bus_id, xid, count")


__all__ = ["GpuHealthDoc", "HealthFindingDoc", "NodeHealthDoc"]
