"""What one cycle's inputs say about one job (:class:`JobFacts`), and the rules' answer
(:class:`Decision`): the values passed between the detector's steps (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_triage.model.states import Verdict
from gpu_triage.signals.fleet.fusion import FleetEvidence
from gpu_triage.signals.stacks.evidence import StackFacts
from gpu_triage.verdicts.step_timing import FirstStep
from gpu_triage.verdicts.views import GpuView, RankView


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What one cycle's inputs say about one job, before any verdict."""

    job_gpus: list[GpuView]
    gpus_inferred: bool
    unmapped: bool
    """The node has GPUs but no rank of this job is tied to one."""
    lost: list[int]
    usable: bool
    spin_all: bool
    spin_strong: bool
    """Every job GPU spinning, utilisation readable, GPUs mapped (not inferred): hang evidence."""
    spin_since: float | None
    working: list[GpuView]
    working_since: float | None
    """Since when some job GPU has been working without a break."""
    waiting: list[GpuView]
    majority_since: float | None
    """Since when most (not all) job GPUs spin while the rest do something else, utilisation readable:
    the asymmetric hang's power signature (None: not that split)."""
    writes: float
    writing: bool
    reads: float
    reading: bool
    train: list[RankView]
    live: list[RankView]
    expired: list[RankView]
    stopped: list[RankView]
    dstate: list[RankView]
    frozen_since: float | None
    frozen_s: float
    first: FirstStep | None
    interval_s: float
    unseen: int
    nvlink_frozen: float | None
    stacks: StackFacts | None = None
    fleet: FleetEvidence | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict rules' answer for one job this cycle."""

    verdict: Verdict
    onset: float | None
    cause: str | None = None
    signals: tuple[str, ...] = ()
    kill_worthy: bool = False
    why_not: str | None = None
