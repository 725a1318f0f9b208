"""What the progress reader (:mod:`gpu_triage.signals.progress`) makes of the trainers' files, as pure
values: one validated file (:class:`ProgressRecord`), a rank's progress with its lease and staleness
(:class:`RankProgress`), a job's ranks (:class:`JobProgress`).

Kept apart from the reader so that the detector's fusion of progress and processes reads them without
loading the reader's I/O (psutil, sockets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class LeaseState(StrEnum):
    NONE = "none"
    """No lease (the train phase)."""
    LIVE = "live"
    EXPIRED = "expired"


class StaleReason(StrEnum):
    PID_GONE = "pid_gone"
    SILENT = "silent"
    """Not written for ``stale_after_s`` and no live lease."""


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    """One rank's progress file, validated. Times are epoch seconds."""

    job: str
    rank: int
    local_rank: int
    world_size: int
    pid: int
    host: str
    step: int
    epoch: int
    tokens: int
    phase: str
    lease_until: float | None
    time: float
    lease_scope: str | None = None
    """Optional ``lease_scope``: ``"job"`` when the trainer announces every collective phase on every
    rank (waiting ranks included), ``"rank"`` or absent when only the ranks doing the work do."""
    step_time: float | None = None
    """Optional: when ``step`` last changed (never later than ``time``); None: not written."""
    phase_time: float | None = None
    """Optional: when ``phase`` was entered (never later than ``time``); None: not written."""

    def step_since(self) -> float:
        """When this record's step began: ``step_time``, else (an older writer) the write ``time``."""
        return self.time if self.step_time is None else self.step_time

    def phase_since(self) -> float:
        return self.time if self.phase_time is None else self.phase_time


@dataclass(frozen=True, slots=True)
class RankProgress:
    record: ProgressRecord
    path: Path
    step_since_s: float
    """When ``record.step`` was first reported: steps frozen since then if they no longer advance."""
    lease: LeaseState
    stale: StaleReason | None
    phase_since_s: float | None = None
    """When the rank entered its current phase (record time)."""
    previous_phase: str | None = None
    owner_uid: int | None = None
    """The file's owner: a process named by the file must belong to the same user (or the file to root)."""

    @property
    def rank(self) -> int:
        return self.record.rank

    @property
    def step(self) -> int:
        return self.record.step

    @property
    def phase(self) -> str:
        return self.record.phase

    @property
    def lease_until(self) -> float | None:
        return self.record.lease_until

    def step_frozen_s(self, now_s: float) -> float:
        """Seconds since the step last advanced."""
        return max(0.0, now_s - self.step_since_s)


@dataclass(frozen=True, slots=True)
class JobProgress:
    job: str
    ranks: Mapping[int, RankProgress]
    """Live ranks (stale ones excluded), by rank."""
    stale: Mapping[int, RankProgress] = field(default_factory=dict)
    """Stale ranks, with :attr:`RankProgress.stale` saying why; ignored by default."""

    @property
    def world_size(self) -> int | None:
        sizes = {r.record.world_size for r in self.ranks.values()}
        return sizes.pop() if len(sizes) == 1 else None

    @property
    def lease_scope(self) -> str | None:
        """``job`` only when every live rank's file says so."""
        scopes = {r.record.lease_scope for r in self.ranks.values()}
        return "job" if scopes == {"job"} else ("rank" if scopes else None)

    @property
    def phases(self) -> dict[str, list[int]]:
        """Phase -> ranks in it (live ranks). More than one key is phase disagreement."""
        out: dict[str, list[int]] = {}
        for rank, r in sorted(self.ranks.items()):
            out.setdefault(r.phase, []).append(rank)
        return out

    def steps_frozen_since_s(self) -> float | None:
        """The latest step change over the live ranks: every rank's step has been frozen since then."""
        return max((r.step_since_s for r in self.ranks.values()), default=None)

    def pids(self) -> dict[int, int]:
        """Rank -> pid of the live ranks (for the process inspector)."""
        return {rank: r.record.pid for rank, r in self.ranks.items()}


__all__ = ["JobProgress", "LeaseState", "ProgressRecord", "RankProgress", "StaleReason"]
