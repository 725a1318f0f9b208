"""The detector: per-job verdicts from fused evidence (pure: inputs in, decisions out, time passed in).

Each cycle the loop hands the detector what it saw - per-GPU states from the classifier, per-rank
process facts from the inspector and progress from the trainer's files - as plain values
(:class:`GpuView`, :class:`RankView`, :class:`JobView`). The detector keeps a little memory per job
(typical step interval, when writes were last seen, when NVLink traffic last moved, the verdict in
force) and returns a :class:`~gpu_triage.snapshot.JobStatus` per job.

Signals and what they can say (DESIGN "Evidence to fuse"):

- **Steps** (progress files): the optimizer step advancing is the one direct proof of progress. "Frozen"
  is measured against the job's own typical step interval, learned from the files, so a 32B model's
  slow steps are not a hang.
- **Power band**: every GPU of the job in ``checkpoint_or_deadlock`` says "waiting in a collective" -
  a save or a hang; it cannot say which.
- **Writes**: a rank whose process writes is saving (or logging heavily): never a deadlock.
- **Leases**: a rank in ``checkpoint``/``eval``/``epoch_end`` promises to be back by ``lease_until``.
  A live lease excuses *that rank's* frozen step only. Ranks that disagree on the phase - some in
  ``checkpoint``/``epoch_end``, others in ``train`` with frozen steps - is the epoch-end deadlock
  itself. An expired lease is evidence (a stalled checkpoint), never an excuse.
- **NVLink counters** frozen on every GPU of the job support a hung collective (evidence only).
- **CPU time is not progress** (a hung rank can spin its host thread or sleep); it is used only to
  name the cause of data starvation.

Paths to ``deadlock_suspected`` (first that holds; onset = when the signature began):

1. phase disagreement with frozen train ranks for ``max(disagree_min_s, k_fast x step interval)``;
2. progress + GPU telemetry: steps frozen ``max(fast_min_s, k_fast x interval)``, every job GPU in the
   spin band for ``spin_min_s``, no live lease, no writes (target: within 30 s of onset);
3. progress without usable GPU telemetry: steps frozen ``max(slow_min_s, k_slow x interval)``, no live
   lease, no writes;
4. no progress files: every job GPU in the spin band for ``power_only_after_s``, no writes, processes
   alive (target: within 3 min).

``deadlock_confirmed`` follows once the suspicion has held for ``confirm_after_s`` without any sign of
progress. Any step advance or write clears it at once.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_triage.snapshot import JobStatus, RankStatus
from gpu_triage.states import GpuState, Verdict

LEASED_PHASES = frozenset({"checkpoint", "eval", "epoch_end", "init"})
ANNOUNCE_DEADLOCK_PHASES = frozenset({"checkpoint", "epoch_end"})


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    fast_min_s: float = 15.0
    """Path 2: frozen steps at least this long (and k_fast x the step interval)."""
    k_fast: float = 1.5
    spin_min_s: float = 10.0
    slow_min_s: float = 60.0
    """Path 3 (no GPU telemetry): frozen steps at least this long (and k_slow x the step interval)."""
    k_slow: float = 3.0
    disagree_min_s: float = 15.0
    power_only_after_s: float = 120.0
    """Path 4 (no progress files): spin band this long with no writes."""
    confirm_after_s: float = 120.0
    write_active_bytes: float = 4 * 2**20
    """Bytes written by the job's ranks within ``write_window_s`` that count as 'writing'."""
    write_window_s: float = 10.0
    lease_grace_s: float = 5.0
    starvation_after_s: float = 30.0
    telemetry_lost_after_s: float = 10.0
    default_step_interval_s: float = 10.0
    """Step interval assumed before the job's own is learned (a few advances)."""
    cpu_contention_ratio: float = 0.9
    """A starving rank using this share of a core is CPU-bound (cause cpu_contention)."""


@dataclass(frozen=True, slots=True)
class GpuView:
    gpu: int
    state: GpuState
    since: float | None
    nvlink_bytes: float | None = None
    """Cumulative NVLink tx+rx bytes (None where unsupported)."""


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
    """When this rank's step last advanced (or first seen)."""


@dataclass(frozen=True, slots=True)
class JobView:
    job: str
    ranks: tuple[RankView, ...]
    has_progress: bool


@dataclass
class _JobMemory:
    last_steps: dict[int, int] = field(default_factory=dict)
    advances: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    last_advance_at: float | None = None
    writes: deque[tuple[float, float]] = field(default_factory=deque)
    nvlink: dict[int, tuple[float, float]] = field(default_factory=dict)
    """gpu -> (last value, when it last changed)."""
    verdict: Verdict = Verdict.HEALTHY
    onset: float | None = None
    raised: float | None = None
    suspected_since: float | None = None


@dataclass(frozen=True, slots=True)
class _Signals:
    """What one cycle's inputs say about one job, before any verdict."""

    job_gpus: list[GpuView]
    lost: list[int]
    gpu_usable: bool
    spinning: bool
    spin_since: float | None
    most_waiting: bool
    writes: float
    writing: bool
    interval: float
    live: list[RankView]
    expired: list[RankView]
    train: list[RankView]
    frozen_since: float | None
    frozen_s: float
    nvlink_frozen: float | None


def _interval(mem: _JobMemory, default: float) -> float:
    if len(mem.advances) < 3:
        return default
    return statistics.median(mem.advances)


class Detector:
    def __init__(self, config: DetectorConfig = DetectorConfig()) -> None:
        self.config = config
        self._jobs: dict[str, _JobMemory] = {}
        self._gpu_unknown_since: dict[int, float] = {}

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)

    def update(
        self, now: float, gpus: Sequence[GpuView], jobs: Sequence[JobView], telemetry_ok: bool = True
    ) -> list[JobStatus]:
        """One cycle. ``telemetry_ok`` is False when the source reports no GPUs at all (``none``)."""
        by_gpu = {g.gpu: g for g in gpus}
        for g in gpus:
            if g.state is GpuState.UNKNOWN:
                self._gpu_unknown_since.setdefault(g.gpu, g.since if g.since is not None else now)
            else:
                self._gpu_unknown_since.pop(g.gpu, None)
        out = [self._job(now, job, by_gpu, telemetry_ok) for job in jobs]
        for gone in set(self._jobs) - {j.job for j in jobs}:
            del self._jobs[gone]
        return out

    # -- one job ------------------------------------------------------------------------------
    def _job(self, now: float, job: JobView, by_gpu: dict[int, GpuView], telemetry_ok: bool) -> JobStatus:
        cfg = self.config
        mem = self._jobs.setdefault(job.job, _JobMemory())
        self._learn(now, job, mem)
        job_gpus = [by_gpu[r.gpu] for r in job.ranks if r.gpu is not None and r.gpu in by_gpu]
        if not job_gpus and not any(r.gpu is not None for r in job.ranks):
            job_gpus = list(by_gpu.values())  # ranks not mapped to GPUs: the node's GPUs stand in
        self._learn_nvlink(now, job_gpus, mem)
        known = [g for g in job_gpus if g.state is not GpuState.UNKNOWN]
        lost = [
            g.gpu
            for g in job_gpus
            if g.gpu in self._gpu_unknown_since
            and now - self._gpu_unknown_since[g.gpu] >= cfg.telemetry_lost_after_s
        ]
        gpu_usable = telemetry_ok and bool(known) and len(known) == len(job_gpus)
        spinning = gpu_usable and all(g.state is GpuState.CHECKPOINT_OR_DEADLOCK for g in known)
        spin_since = max((now if g.since is None else g.since) for g in known) if spinning else None
        waiting = [g for g in known if g.state is GpuState.CHECKPOINT_OR_DEADLOCK]
        most_waiting = gpu_usable and len(waiting) * 2 >= len(job_gpus) and bool(waiting)
        writes = self._recent_writes(now, mem)
        writing = writes >= cfg.write_active_bytes
        interval = _interval(mem, cfg.default_step_interval_s)
        live = [
            r
            for r in job.ranks
            if r.phase in LEASED_PHASES
            and r.lease_until is not None
            and now <= r.lease_until + cfg.lease_grace_s
        ]
        expired = [
            r
            for r in job.ranks
            if r.phase in LEASED_PHASES
            and r.phase != "init"
            and r.lease_until is not None
            and now > r.lease_until + cfg.lease_grace_s
        ]
        train = [r for r in job.ranks if r.phase == "train" and r.step is not None]
        frozen_since = self._frozen_since(train)
        frozen_s = now - frozen_since if frozen_since is not None else 0.0
        nvlink_frozen = self._nvlink_frozen_since(job_gpus, mem)

        evidence: dict[str, Any] = {
            "gpus": [g.gpu for g in job_gpus],
            "gpu_states": {str(g.gpu): str(g.state) for g in job_gpus},
            "spin_band_since": spin_since,
            "steps": {str(r.rank): r.step for r in job.ranks if r.step is not None},
            "phases": {str(r.rank): r.phase for r in job.ranks if r.phase is not None},
            "steps_frozen_since": frozen_since if job.has_progress else None,
            "step_interval_s": round(interval, 3),
            "bytes_written_recently": writes,
            "live_leases": {str(r.rank): r.lease_until for r in live},
            "expired_leases": {str(r.rank): r.lease_until for r in expired},
            "nvlink_frozen_since": nvlink_frozen,
            "telemetry": "ok"
            if gpu_usable
            else ("lost" if lost else ("none" if not telemetry_ok else "partial")),
        }
        sig = _Signals(
            job_gpus,
            lost,
            gpu_usable,
            spinning,
            spin_since,
            most_waiting,
            writes,
            writing,
            interval,
            live,
            expired,
            train,
            frozen_since,
            frozen_s,
            nvlink_frozen,
        )
        verdict, onset, cause, signals = self._decide(now, job, mem, sig)
        evidence["signals"] = signals
        if cause:
            evidence["cause"] = cause
        if verdict is not mem.verdict:
            prev = mem.verdict
            mem.verdict, mem.onset, mem.raised = verdict, onset, now
            if verdict is Verdict.DEADLOCK_SUSPECTED and prev is not Verdict.DEADLOCK_CONFIRMED:
                mem.suspected_since = now
            if verdict not in (Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED):
                mem.suspected_since = None
        ranks = tuple(
            RankStatus(
                rank=r.rank,
                pid=r.pid,
                gpu=r.gpu,
                step=r.step,
                phase=r.phase,
                lease_until=r.lease_until,
                alive=r.alive,
                process_status=r.status,
            )
            for r in job.ranks
        )
        return JobStatus(
            job=job.job,
            ranks=ranks,
            verdict=mem.verdict,
            onset=mem.onset,
            raised=mem.raised,
            evidence=evidence,
            cause=cause,
        )

    def _decide(
        self, now: float, job: JobView, mem: _JobMemory, sig: _Signals
    ) -> tuple[Verdict, float | None, str | None, list[str]]:
        spinning, spin_since, writing, interval = sig.spinning, sig.spin_since, sig.writing, sig.interval
        live, expired, train, gpu_usable, lost = sig.live, sig.expired, sig.train, sig.gpu_usable, sig.lost
        frozen_since, frozen_s, job_gpus, most_waiting = (
            sig.frozen_since,
            sig.frozen_s,
            sig.job_gpus,
            sig.most_waiting,
        )
        cfg = self.config
        suspicion: tuple[float, list[str]] | None = None
        if not writing:
            disagree = [r for r in live if r.phase in ANNOUNCE_DEADLOCK_PHASES]
            if (
                disagree
                and train
                and frozen_since is not None
                and frozen_s >= max(cfg.disagree_min_s, cfg.k_fast * interval)
            ):
                suspicion = (frozen_since, ["phase_disagreement", "steps_frozen"])
            elif job.has_progress and train and not live and frozen_since is not None:
                if (
                    spinning
                    and frozen_s >= max(cfg.fast_min_s, cfg.k_fast * interval)
                    and now - spin_since >= cfg.spin_min_s
                ):
                    suspicion = (min(frozen_since, spin_since), ["steps_frozen", "spin_band", "no_writes"])
                elif frozen_s >= max(cfg.slow_min_s, cfg.k_slow * interval):
                    sig = ["steps_frozen", "no_writes"] + (["spin_band"] if spinning else [])
                    suspicion = (frozen_since, sig)
            elif (
                not job.has_progress
                and spinning
                and now - spin_since >= cfg.power_only_after_s
                and all(r.alive is not False for r in job.ranks)
            ):
                suspicion = (spin_since, ["spin_band", "no_writes", "no_progress_files"])
            elif expired and not live and all(r.phase != "checkpoint" for r in expired):
                # every rank announced eval/epoch_end and outlived its lease: the promise is broken
                changed = [r.step_changed_at for r in job.ranks if r.step_changed_at is not None]
                lease_end = (
                    max(r.lease_until for r in expired if r.lease_until is not None) + cfg.lease_grace_s
                )
                if changed and now - lease_end >= cfg.fast_min_s:
                    suspicion = (max(changed), ["expired_lease", "steps_frozen"])
        if suspicion is not None:
            onset, signals = suspicion
            since = (
                mem.suspected_since
                if mem.verdict in (Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED)
                else now
            )
            if mem.verdict is Verdict.DEADLOCK_CONFIRMED or (
                since is not None and now - since >= cfg.confirm_after_s
            ):
                return Verdict.DEADLOCK_CONFIRMED, (onset if mem.onset is None else mem.onset), None, signals
            if mem.verdict is Verdict.DEADLOCK_SUSPECTED:
                return Verdict.DEADLOCK_SUSPECTED, (onset if mem.onset is None else mem.onset), None, signals
            return Verdict.DEADLOCK_SUSPECTED, onset, None, signals
        ckpt_expired = [r for r in expired if r.phase == "checkpoint"]
        if ckpt_expired and not [r for r in live if r.phase == "checkpoint"]:
            onset = min(r.lease_until for r in ckpt_expired)
            sig = ["checkpoint_lease_expired"] + (["still_writing"] if writing else ["no_writes"])
            return (
                Verdict.STALLED_CHECKPOINT,
                self._keep_onset(mem, Verdict.STALLED_CHECKPOINT, onset),
                None,
                sig,
            )
        if [r for r in live if r.phase == "checkpoint"] or (writing and most_waiting):
            sig = ["checkpoint_lease"] if live else ["writes", "spin_band"]
            onset = now if spin_since is None else spin_since
            return Verdict.CHECKPOINT, self._keep_onset(mem, Verdict.CHECKPOINT, onset), None, sig
        starving = [g for g in job_gpus if g.state is GpuState.DATA_STARVATION]
        if gpu_usable and starving and len(starving) * 2 > len(job_gpus):
            since = max((now if g.since is None else g.since) for g in starving)
            if now - since >= cfg.starvation_after_s:
                cause = self._starvation_cause(job)
                return (
                    Verdict.DATA_STARVATION,
                    self._keep_onset(mem, Verdict.DATA_STARVATION, since),
                    cause,
                    ["data_starvation_band", cause],
                )
        if lost:
            since = min(self._gpu_unknown_since[g] for g in lost)
            return (
                Verdict.TELEMETRY_LOST,
                self._keep_onset(mem, Verdict.TELEMETRY_LOST, since),
                None,
                [f"gpu_reads_failing:{','.join(map(str, lost))}"],
            )
        return Verdict.HEALTHY, None, None, (["steps_advancing"] if train and frozen_s < interval * 2 else [])

    @staticmethod
    def _keep_onset(mem: _JobMemory, verdict: Verdict, onset: float) -> float:
        return mem.onset if mem.verdict is verdict and mem.onset is not None else onset

    def _starvation_cause(self, job: JobView) -> str:
        if any(r.status == "disk-sleep" for r in job.ranks):
            return "storage_wait"
        ratios = [r.cpu_ratio for r in job.ranks if r.cpu_ratio is not None]
        if ratios and max(ratios) >= self.config.cpu_contention_ratio:
            return "cpu_contention"
        return "loader"

    # -- memory ---------------------------------------------------------------------------------
    def _learn(self, now: float, job: JobView, mem: _JobMemory) -> None:
        advanced = False
        for r in job.ranks:
            if r.step is None:
                continue
            prev = mem.last_steps.get(r.rank)
            if prev is not None and r.step > prev:
                advanced = True
            mem.last_steps[r.rank] = r.step
        if advanced:
            if mem.last_advance_at is not None and now > mem.last_advance_at:
                mem.advances.append(now - mem.last_advance_at)
            mem.last_advance_at = now
        written = sum(r.write_bytes_delta or 0.0 for r in job.ranks)
        if written > 0:
            mem.writes.append((now, written))
        while mem.writes and now - mem.writes[0][0] > self.config.write_window_s:
            mem.writes.popleft()

    def _recent_writes(self, now: float, mem: _JobMemory) -> float:
        return sum(b for t, b in mem.writes if now - t <= self.config.write_window_s)

    @staticmethod
    def _frozen_since(train: list[RankView]) -> float | None:
        """Since when no train-phase rank's step has advanced (the latest advance among them)."""
        times = [r.step_changed_at for r in train if r.step_changed_at is not None]
        if not times:
            return None
        return max(times)

    @staticmethod
    def _learn_nvlink(now: float, gpus: list[GpuView], mem: _JobMemory) -> None:
        for g in gpus:
            if g.nvlink_bytes is None:
                continue
            prev = mem.nvlink.get(g.gpu)
            if prev is None or g.nvlink_bytes != prev[0]:
                mem.nvlink[g.gpu] = (g.nvlink_bytes, now)

    @staticmethod
    def _nvlink_frozen_since(gpus: list[GpuView], mem: _JobMemory) -> float | None:
        seen = [mem.nvlink[g.gpu][1] for g in gpus if g.gpu in mem.nvlink]
        if not seen or len(seen) != len(gpus):
            return None
        return max(seen)
