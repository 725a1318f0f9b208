"""What the detector reads each cycle: per-GPU states, per-rank process facts and progress, per job
(pure values; :mod:`gpu_triage.verdicts.fusion` builds them from the signals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_triage.model.samples import quick_init
from gpu_triage.model.states import GpuState
from gpu_triage.signals.fleet.remote import RemoteFacts
from gpu_triage.signals.nccl_ras.ras_facts import RasFacts
from gpu_triage.signals.stacks.dumps import StackSummary
from gpu_triage.verdicts.step_timing import FirstStep


@quick_init  # built once a rank (or a GPU) every process period
@dataclass(frozen=True, slots=True)
class GpuView:
    gpu: int
    state: GpuState
    since: float | None
    nvlink_bytes: float | None = None
    """Cumulative NVLink tx+rx bytes (None where unsupported)."""
    util_known: bool = True
    """False when utilisation is unreadable (MIG, vGPU): the state came from power alone."""


@quick_init  # built once a rank (or a GPU) every process period
@dataclass(frozen=True, slots=True)
class RankView:
    rank: int
    pid: int | None = None
    gpu: int | None = None
    alive: bool | None = None
    status: str | None = None
    cpu_ratio: float | None = None
    """CPU seconds per wall second since the last inspection."""
    write_bytes_delta: float | None = None
    read_bytes_delta: float | None = None
    step: int | None = None
    phase: str | None = None
    lease_until: float | None = None
    step_changed_at: float | None = None
    """When this rank's step last changed (the record time of the first record showing it)."""
    phase_since: float | None = None
    """When this rank entered its current phase (record time)."""
    previous_phase: str | None = None
    """The phase before, when the change was seen (None: the rank was first seen in this phase)."""
    proven: bool = False
    """The process is tied to the job by positive proof (a kill target)."""

    def active_since(self) -> float | None:
        """Since when a train rank has shown no activity: its last step change or its return to train."""
        times = [t for t in (self.step_changed_at, self.phase_since) if t is not None]
        return max(times) if times else None

    def first_step(self) -> FirstStep | None:
        """Which first step a train rank is in, or None when it is past one (or cannot be told)."""
        if self.phase != "train" or self.step is None:
            return None
        returned = self.previous_phase is not None and self.previous_phase != "train"
        if returned and self.phase_since is not None:
            if self.step_changed_at is None or self.step_changed_at <= self.phase_since:
                return FirstStep.AFTER_START if self.previous_phase == "init" else FirstStep.AFTER_LEASE
            return None
        return FirstStep.AFTER_START if self.step == 0 else None


@dataclass(frozen=True, slots=True)
class JobView:
    job: str
    ranks: tuple[RankView, ...]
    has_progress: bool
    world_size: int | None = None
    """From the progress files (or the ranks' environment); None when unknown."""
    lease_scope: str | None = None
    """``job``: the trainer announces collective phases on every rank, waiting ones included."""
    untrusted: tuple[dict[str, Any], ...] = ()
    """Progress files naming this job that were not believed (path, pid, reason)."""
    stacks: StackSummary | None = None
    """The ranks' latest Python stacks (the stack sampler), None when none was taken."""
    ras: RasFacts | None = None
    """What NCCL's RAS service said about the job's communicators (None: not polled, not found)."""
    remote: RemoteFacts | None = None
    """Other nodes' facts about the job from Prometheus (``[cluster]``; None: not configured, or
    every rank of the world is on this node). Only completes or vetoes this node's evidence."""
    signalled_pids: frozenset[int] = frozenset()
    """Pids of this job the daemon's kill ladder has signalled (SIGTERM, the kill hook, scancel)."""
