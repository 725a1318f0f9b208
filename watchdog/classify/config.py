"""``[classifier]``: the power table and model the classifier uses, and per-state dwell overrides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gpu_triage.model.config_checks import optional_path, optional_text
from gpu_triage.model.config_schema import setting
from gpu_triage.model.states import GpuState

DWELL_STATES = tuple(s.value for s in GpuState if s is not GpuState.UNKNOWN)
"""The states ``dwell_s`` may name (``{state = seconds}``)."""


@dataclass(frozen=True, slots=True)
class ClassifierConfig:
    table: Path | None = setting(
        None, parse=optional_path, doc="power table file overriding the built-in lookup"
    )
    model: str | None = setting(None, parse=optional_text, doc="table model forced for every GPU")
    dwell_s: Mapping[str, float] = setting(
        default_factory=lambda: MappingProxyType({}),
        keys=DWELL_STATES,
        ge=0,
        le=3600,
        doc="per-state minimum dwell overrides",
    )


__all__ = ["DWELL_STATES", "ClassifierConfig"]
