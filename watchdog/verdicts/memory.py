"""What the detector remembers about one job across cycles (:class:`JobMemory`): its step marks and
learned step timing, recent writes and reads, NVLink counter changes, the onsets of the signals that
need time, and the verdict in force - plus its one saved form for a restarted daemon
(:func:`export_jobs`, :func:`restore_jobs`). The only mutable state of the detector; the rules read it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpu_triage.model.states import GpuState, Verdict
from gpu_triage.verdicts.step_timing import FirstStep, StepTiming, TimingConfig
from gpu_triage.verdicts.views import GpuView, JobView


@dataclass
class RankMemory:
    step: int | None = None
    step_at: float | None = None


@dataclass
class JobMemory:
    timing: StepTiming
    ranks: dict[int, RankMemory] = field(default_factory=dict)
    writes: deque[tuple[float, float]] = field(default_factory=deque)
    reads: deque[tuple[float, float]] = field(default_factory=deque)
    nvlink: dict[int, tuple[float, float]] = field(default_factory=dict)
    """gpu -> (last value, when it last changed)."""
    verdict: Verdict = Verdict.HEALTHY
    onset: float | None = None
    raised: float | None = None
    hang_since: float | None = None
    """Since when kill-worthy evidence has held without a break."""
    stopped_since: float | None = None
    asymmetric_since: float | None = None
    working_since: float | None = None
    excused_at: float | None = None
    """The last time a rank was stopped or in D-state: frozen time restarts from there (a suspended
    or storage-stalled job that resumes owes no step for the time it could not run)."""
    no_compute_since: float | None = None
    """No progress files: since when every job GPU has been working or waiting without one of them
    computing (the spin sitting on the communication band's edge)."""
    idle_since: float | None = None
    """Since when every job GPU has been idle (memory held) while the ranks live."""
    blind_since: float | None = None
    """Since when nothing here could show the job's progress or hang (``cannot_judge``)."""
    asleep_since: float | None = None
    """Since when every rank's host CPU has been idle (stack evidence)."""
    save_seen_at: float | None = None
    """The last time a rank's stack was inside a save: power-only time counts from there."""


def keep_onset(mem: JobMemory, verdict: Verdict, onset: float | None) -> float | None:
    """The onset of ``verdict``: the one in force when it is already the verdict, else ``onset``."""
    return mem.onset if mem.verdict is verdict and mem.onset is not None else onset


# -- learning, each cycle -----------------------------------------------------------------------
def learn(now: float, job: JobView, mem: JobMemory, write_window_s: float) -> None:
    """Step timing from the ranks' step changes (timed by the records), writes and reads."""
    stepped = [r for r in job.ranks if r.step is not None]
    leader = min((r.rank for r in stepped if r.phase == "train"), default=None)
    for r in stepped:
        rm = mem.ranks.setdefault(r.rank, RankMemory())
        at = r.step_changed_at if r.step_changed_at is not None else now
        resumed = rm.step == 0 and (r.step or 0) > 1  # a resume jumps from 0: no interval in that
        if (
            rm.step is not None
            and r.step is not None
            and r.step > rm.step
            and r.rank == leader
            and not resumed
        ):
            since_train = r.phase_since
            if rm.step_at is not None and (since_train is None or rm.step_at >= since_train):
                mem.timing.observe_interval((at - rm.step_at) / (r.step - rm.step))
            elif since_train is not None and r.previous_phase not in (None, "train"):
                kind = FirstStep.AFTER_START if r.previous_phase == "init" else FirstStep.AFTER_LEASE
                mem.timing.observe_first_step(kind, at - since_train)
        rm.step, rm.step_at = r.step, at
    stepped_ranks = {s.rank for s in stepped}
    for r in job.ranks:
        if r.rank not in stepped_ranks:
            mem.ranks.pop(r.rank, None)
    written = sum([r.write_bytes_delta or 0.0 for r in job.ranks])
    read = sum([r.read_bytes_delta or 0.0 for r in job.ranks])
    for q, value in ((mem.writes, written), (mem.reads, read)):
        if value > 0:
            q.append((now, value))
        while q and now - q[0][0] > write_window_s:
            q.popleft()


def learn_idle(now: float, job: JobView, mem: JobMemory, gpus: list[GpuView], mapped_ok: bool) -> None:
    """Since when the job's GPUs have been idle (memory held) / busy without computing."""
    alive = bool(job.ranks) and all([r.alive is not False for r in job.ranks])
    ok = mapped_ok and alive and bool(gpus) and all([g.util_known for g in gpus])
    states = {g.state for g in gpus}
    waiting_only = ok and states <= {GpuState.COMMUNICATION, GpuState.CHECKPOINT_OR_DEADLOCK}
    waiting_only = waiting_only and GpuState.COMMUNICATION in states
    if not waiting_only:
        mem.no_compute_since = None
    elif mem.no_compute_since is None:
        mem.no_compute_since = max((now if g.since is None else g.since) for g in gpus)
    idle = mapped_ok and alive and bool(gpus) and states == {GpuState.IDLE}
    if not idle:
        mem.idle_since = None
    elif mem.idle_since is None:
        mem.idle_since = max((now if g.since is None else g.since) for g in gpus)


def working_since(now: float, mem: JobMemory, working: list[GpuView]) -> float | None:
    if not working:
        mem.working_since = None
    elif mem.working_since is None:
        mem.working_since = min((now if g.since is None else g.since) for g in working)
    return mem.working_since


def recent(now: float, q: deque[tuple[float, float]], window_s: float) -> float:
    return sum(b for t, b in q if now - t <= window_s)


def learn_nvlink(now: float, gpus: list[GpuView], mem: JobMemory) -> None:
    for g in gpus:
        if g.nvlink_bytes is None:
            continue
        prev = mem.nvlink.get(g.gpu)
        if prev is None or g.nvlink_bytes != prev[0]:
            mem.nvlink[g.gpu] = (g.nvlink_bytes, now)


def nvlink_frozen_since(gpus: list[GpuView], mem: JobMemory) -> float | None:
    seen = [mem.nvlink[g.gpu][1] for g in gpus if g.gpu in mem.nvlink]
    if not seen or len(seen) != len(gpus):
        return None
    return max(seen)


# -- the saved form (a restarted daemon) ----------------------------------------------------------
def export_jobs(jobs: dict[str, JobMemory]) -> dict[str, dict[str, Any]]:
    """What a restarted daemon needs to continue each job's episode (:func:`restore_jobs`): the verdict
    in force, its onset and raise time, since when the hang evidence has held, the learned step
    interval. JSON values; times on the caller's timeline."""
    out: dict[str, dict[str, Any]] = {}
    for name, mem in jobs.items():
        if mem.raised is None:
            continue
        out[name] = {
            "verdict": str(mem.verdict),
            "onset": mem.onset,
            "raised": mem.raised,
            "hang_since": mem.hang_since,
            "stopped_since": mem.stopped_since,
            "interval_s": mem.timing.estimate_s,
            "intervals_seen": mem.timing.intervals_seen,
            "first_steps": {str(k): list(v) for k, v in mem.timing.first_steps.items()},
        }
    return out


def export_core(jobs: dict[str, JobMemory]) -> dict[str, tuple[str, float | None, float | None]]:
    """Of :func:`export_jobs`, what is saved at once when it changes - each job's verdict, onset and
    hang clock - without building the rest (asked every process period)."""
    return {
        name: (str(mem.verdict), mem.onset, mem.hang_since)
        for name, mem in jobs.items()
        if mem.raised is not None
    }


def restore_jobs(saved: Any, timing: TimingConfig, into: dict[str, JobMemory]) -> int:
    """Seed job memories from :func:`export_jobs` of an earlier detector into ``into``. A restored job
    continues where it was: a suspicion keeps its clock toward confirmation, a confirmed hang stays
    confirmed while the evidence holds, the onset does not move. Malformed entries are skipped.
    Returns how many jobs were restored."""
    count = 0
    for name, e in saved.items() if isinstance(saved, dict) else ():
        try:
            mem = JobMemory(StepTiming(timing))
            mem.verdict = Verdict(e["verdict"])
            mem.onset = _opt_time(e.get("onset"))
            mem.raised = _opt_time(e.get("raised"))
            mem.hang_since = _opt_time(e.get("hang_since"))
            mem.stopped_since = _opt_time(e.get("stopped_since"))
            estimate = _opt_time(e.get("interval_s"))
            mem.timing.estimate_s = estimate if estimate is None or estimate > 0 else None
            mem.timing.intervals_seen = int(e.get("intervals_seen") or 0)
            for kind, values in dict(e.get("first_steps") or {}).items():
                for v in list(values)[-8:]:
                    mem.timing.observe_first_step(FirstStep(kind), float(v))
        except (KeyError, TypeError, ValueError):
            continue
        into[str(name)] = mem
        count += 1
    return count


def _opt_time(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"not a time: {value!r}")
    return float(value)
