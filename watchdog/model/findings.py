"""Typed evidence: what each signal said about one job this cycle (pure values).

A :class:`Finding` is one signal's statement, with its *stance*:

- ``hang``: positive evidence of a hang (steps frozen past the job's budget, every job GPU in the
  spin band, ranks that disagree on the phase, a broken lease promise, NVLink traffic frozen);
- ``progress``: evidence *against* a hang (steps advancing, GPUs computing, writes, a rank stopped or
  in D-state - something else explains the silence);
- ``context``: what limits the judgment (no progress files, ranks on other nodes, GPUs not mapped,
  utilisation unreadable).

The detector decides from findings; the verdict's evidence lists all of them, so an operator reads
why a verdict was reached *and* what spoke against it. ``to_dict`` is the JSON form in ``/status``,
alerts and events.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Stance(StrEnum):
    HANG = "hang"
    PROGRESS = "progress"
    CONTEXT = "context"


class Signal(StrEnum):
    # hang
    STEPS_FROZEN = "steps_frozen"
    SPIN_BAND = "spin_band"
    PHASE_DISAGREEMENT = "phase_disagreement"
    LEASE_EXPIRED = "lease_expired"
    NVLINK_FROZEN = "nvlink_frozen"
    ASYMMETRIC = "asymmetric"
    STACKS_FROZEN = "stacks_frozen"
    """Every rank's Python stack unchanged for ``[stacks] frozen_s``, waiting in a collective."""
    STACKS_DIVERGED = "stacks_diverged"
    """Frozen ranks wait in different places (other collectives or call sites): the odd ranks named."""
    STACKS_PHASE_SPLIT = "stacks_phase_split"
    """Some ranks wait in a collective inside a save or an eval while the others are frozen inside a
    training step (the epoch-end deadlock of uneven shards, with the save or eval as the odd phase)."""
    RANKS_ASLEEP = "ranks_asleep"
    NCCL_COUNTS_FROZEN = "nccl_counts_frozen"
    """NCCL RAS: no collective launched between two polls on the job's communicators."""
    NCCL_MISSING_RANKS = "nccl_missing_ranks"
    """NCCL RAS: ranks that did not answer, or whose launched counts are behind (named)."""
    """Every rank's host CPU idle while its stack is frozen (a rank blocked in gloo sleeps)."""
    REMOTE_COMPLETE = "remote_complete"
    """Other nodes' fresh facts (Prometheus) complete this node's proof: every rank of the world."""
    NODE_LOST = "node_lost"
    """A node of the job silent (its daemon's target down or its facts stale) past ``[cluster]
    node_lost_after_s`` while every rank here is frozen in a collective: the node is named."""
    HARDWARE_FAULT = "hardware_fault"
    """An unhealthy hardware finding (Xid, uncorrectable ECC, row-remap failure...) on a job GPU: the
    hang is the node's, confirmed without the usual window (``model.health``, docs/detector.md "Blame")."""
    GPU_LOST = "gpu_lost"
    """A job GPU is lost (NVML ``GPU_IS_LOST``, fallen off the bus) while the job's steps are frozen."""
    # progress (against a hang)
    STEPS_ADVANCING = "steps_advancing"
    GPUS_WORKING = "gpus_working"
    WRITES = "writes"
    READS = "reads"
    RANKS_STOPPED = "ranks_stopped"
    RANKS_IN_D_STATE = "ranks_in_d_state"
    LIVE_LEASE = "live_lease"
    STACK_IN_SAVE = "stack_in_save"
    """A rank's stack is inside a checkpoint save (DeepSpeed, HF, torch.save, safetensors, DCP)."""
    STACK_IN_EVAL = "stack_in_eval"
    REMOTE_VETO = "remote_veto"
    """Another node's fresh fact explains the wait (a save or eval there, its ranks writing)."""
    GPU_THROTTLED = "gpu_throttled"
    """A job GPU is throttled (thermal, hardware slowdown, power brake): its low power is the throttle,
    not a wait, so the spin band proves nothing (a degraded signal never makes a kill)."""
    # context
    NO_WRITES = "no_writes"
    NO_PROGRESS_FILES = "no_progress_files"
    NO_GPU_TELEMETRY = "no_gpu_telemetry"
    UNSEEN_RANKS = "unseen_ranks"
    GPUS_UNMAPPED = "gpus_unmapped"
    UTILIZATION_UNREADABLE = "utilization_unreadable"
    FIRST_STEP = "first_step"
    UNTRUSTED_PROGRESS_FILE = "untrusted_progress_file"
    NO_STACKS = "no_stacks"
    REMOTE_UNKNOWN = "remote_unknown"
    """Other nodes' facts missing, stale or unanswered: this node's own judgment only."""
    """Stack sampling unavailable (py-spy missing, ptrace denied, disabled) or ranks not sampled."""
    HARDWARE_DEGRADED = "hardware_degraded"
    """A degraded hardware finding on a job GPU (correctable ECC, PCIe width drop...): context only."""


@dataclass(frozen=True, slots=True)
class Finding:
    signal: Signal
    stance: Stance
    detail: str
    since: float | None = None
    ranks: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"signal": str(self.signal), "stance": str(self.stance), "detail": self.detail}
        if self.since is not None:
            out["since"] = self.since
        if self.ranks:
            out["ranks"] = list(self.ranks)
        if self.gpus:
            out["gpus"] = list(self.gpus)
        return out


def hang(signal: Signal, detail: str, since: float | None = None, **kw: Any) -> Finding:
    return Finding(signal, Stance.HANG, detail, since, **kw)


def progress(signal: Signal, detail: str, since: float | None = None, **kw: Any) -> Finding:
    return Finding(signal, Stance.PROGRESS, detail, since, **kw)


def context(signal: Signal, detail: str, since: float | None = None, **kw: Any) -> Finding:
    return Finding(signal, Stance.CONTEXT, detail, since, **kw)


__all__ = ["Finding", "Signal", "Stance", "context", "hang", "progress"]
