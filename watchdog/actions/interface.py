"""What the daemon sees of its action engine: the :class:`Cycle` it hands over each cycle, one frozen
value, and the :class:`Actions` Protocol it calls (:class:`~gpu_triage.actions.engine.ActionEngine`
implements it; a test may hand the daemon another)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpu_triage.actions.silences import SilenceBook
from gpu_triage.model.health import UNKNOWN_HEALTH, NodeHealth
from gpu_triage.model.snapshot import GpuStatus, JobStatus
from gpu_triage.model.states import Mode
from gpu_triage.signals.ranks import RankProcess


@dataclass(frozen=True, slots=True)
class Cycle:
    """What the engine needs to know about one cycle: the time, the mode, each job's status, each job's
    proven rank processes (by job name), the GPUs, the silences in force, the progress directory
    (copied into evidence bundles) and the node's hardware health this cycle (drains,
    :mod:`gpu_triage.actions.drain`)."""

    now: float
    mode: Mode
    jobs: Sequence[JobStatus] = ()
    processes: Mapping[str, Sequence[RankProcess]] = field(default_factory=dict)
    gpus: Sequence[GpuStatus] = ()
    silences: SilenceBook = field(default_factory=SilenceBook)
    progress_dir: Path | None = None
    node_health: NodeHealth = UNKNOWN_HEALTH


class Actions(Protocol):
    """The action engine as the daemon calls it."""

    @property
    def counters(self) -> dict[tuple[str, str], int]:
        """(action, result) -> count since start."""
        ...

    def on_cycle(self, cycle: Cycle) -> list[dict[str, Any]]:
        """Decide and queue this cycle's actions; the records made (never raises)."""
        ...

    def signalled_pids(self, job: str, now: float | None = None) -> frozenset[int]:
        """The pids of ``job`` signalled in the last hour (the detector calls them ``killed``)."""
        ...

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the workers; what is undelivered stays in the outbox."""
        ...


__all__ = ["Actions", "Cycle"]
