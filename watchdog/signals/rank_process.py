"""What the process inspector (:mod:`gpu_triage.signals.processes`) reports, as pure values: the rank
processes of each job (:class:`RankProcess`, :class:`ProcessView`), and the progress files' claims
about their processes (:class:`ProgressClaim`) with the ones not believed (:class:`UntrustedClaim`).

Kept apart from the inspector so that the pure layers (the detector's fusion, the action engine's
decisions) read them without loading psutil.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProgressClaim:
    """What a progress file says about its process: rank ``rank`` of ``job`` is ``pid``."""

    job: str
    rank: int
    pid: int
    local_rank: int | None = None
    host_is_local: bool = True
    """The file's ``host`` is this node's name (else its pid may live in a container's namespace)."""
    owner_uid: int | None = None
    """The file's owner (None: unknown)."""


@dataclass(frozen=True, slots=True)
class UntrustedClaim:
    """A progress file whose pid names a process that is not proven to be the rank it claims."""

    job: str
    rank: int
    pid: int
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"job": self.job, "rank": self.rank, "pid": self.pid, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class RankProcess:
    job: str
    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    gpu: int | None
    """The GPU this rank drives (NVML, else LOCAL_RANK + CUDA_VISIBLE_DEVICES)."""
    gpus: tuple[int, ...]
    """Every GPU NVML lists the pid on."""
    found_by: str
    alive: bool
    status: str | None
    """psutil status: 'running', 'sleeping', 'disk-sleep' (D-state), 'stopped', 'zombie'...; None if gone."""
    pgid: int | None
    cpu_time_s: float | None
    """User + system CPU seconds since the process started."""
    cpu_time_delta_s: float | None
    read_bytes_delta: int | None
    write_bytes_delta: int | None
    read_chars_delta: int | None
    write_chars_delta: int | None
    interval_s: float | None
    """Seconds the deltas cover (None on the first measurement of this process)."""
    gone_since_s: float | None = None
    proof: tuple[str, ...] = ()
    """What ties it to the job (see :class:`Candidate`); a process without proof is never signalled."""
    uid: int | None = None
    create_time: float | None = None
    """With ``pid`` and ``uid``, the identity a signal is checked against (a recycled pid never matches)."""
    scope: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessView:
    time_s: float
    jobs: Mapping[str, tuple[RankProcess, ...]]
    """Ranks per job, sorted by rank (unknown ranks last)."""
    discovered: bool = False
    """Whether this call ran a discovery."""
    environ_denied: int = 0
    """Processes whose environment could not be read in this call's discovery."""
    untrusted: tuple[UntrustedClaim, ...] = ()
    """Progress-file claims refused by the last discovery (never adopted, never signalled)."""

    def by_pid(self) -> dict[int, RankProcess]:
        return {r.pid: r for ranks in self.jobs.values() for r in ranks}


__all__ = ["ProcessView", "ProgressClaim", "RankProcess", "UntrustedClaim"]
