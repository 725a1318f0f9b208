"""The detector: per-job verdicts from fused evidence (pure: inputs in, decisions out, time passed in).

Each cycle the loop hands the detector what it saw - per-GPU states from the classifier, per-rank
process facts from the inspector and progress from the trainer's files - as plain values
(:class:`GpuView`, :class:`RankView`, :class:`JobView`). The detector keeps a little memory per job
(its step timing, recent writes and reads, NVLink counter changes, the verdict in force) and returns a
:class:`~gpu_triage.model.snapshot.JobStatus` per job whose evidence lists every
:class:`~gpu_triage.model.findings.Finding` - for a hang, against one, and what limits the judgment.

**Two classes of verdict** (docs/detector.md). *Hung* - ``deadlock_suspected`` then
``deadlock_confirmed`` - is the only class that can lead to a kill, and it needs positive evidence of
a hang from two independent signals with nothing speaking against it:

- **K1 phase disagreement**: some ranks announced ``epoch_end`` (with a job-wide lease scope also
  ``checkpoint`` or ``eval``) and hold a live lease, while the ranks in ``train`` have not advanced
  for their budget: the epoch-end deadlock itself (progress files; works without GPU telemetry);
- **K2 frozen steps + spin band**: every train rank frozen past its budget *and* every GPU of the job
  in the spin band (``checkpoint_or_deadlock``, utilisation readable) for ``spin_min_s``, no writes.
  Where ranks of the job live on other nodes, a rank there could be saving or compiling unseen: K2
  then needs the trainer to announce its phases on every rank (``lease_scope = "job"``), a longer
  budget (``k_remote`` intervals), and never applies to a first step;
- **K3 broken promise + spin band**: a lease (``eval``, ``epoch_end``, ``init``, ``done``, or a
  ``checkpoint`` with every rank visible) outlived by ``lease_grace_s`` while every job GPU spins and
  nothing is written;
- **K5 frozen steps + the asymmetric split**: most job GPUs spin while a few compute (a busy loop)
  or idle (a rank stuck on the host), every rank visible and ``lease_scope = "job"`` (so no
  unannounced save or eval explains the wait), nobody writing or reading, for ``k_remote`` intervals;
  the odd GPUs are named;
- **K4 power only** (no progress files): every job GPU in the spin band for ``power_only_after_s``,
  no writes - kill-worthy only with ``power_only_can_kill = true``; by default it is ``stalled``:
  a save whose writer is on another node looks exactly the same (the multi-node blind spot);
- **K6 stacks** (py-spy): every rank of the world frozen in a collective, or *split* - some ranks
  waiting in a collective inside a save or an eval while all others are frozen inside a training step
  (the reference failure: rank 0 in ``save_checkpoint``'s barrier, rank 1 in its step's
  reduce-scatter) - plus a second signal (frozen steps, the spin band, RAS counts, ranks asleep).

Evidence against a hang vetoes the hung class: writes, ranks in D-state (storage), a stopped rank
(``suspended``), GPUs in the compute or communication band (for K6 only a computing GPU).
Everything else that lacks progress is alert-worthy at most: ``stalled`` (no progress past the
budget, no proof), ``slow`` (past the budget but every busy GPU computes, or a lease overran while
they compute - for at most ``slow_max_budgets`` stall budgets, and never while most GPUs spin or none
computes: then ``stalled``), ``stalled_checkpoint``, ``data_starvation``, ``suspended``,
``telemetry_lost``, and ``cannot_judge`` (no progress files and nothing else here that could show
progress or a hang, or GPUs held idle).

**Time from the right moment**: a rank's frozen time starts at its last step change *or* its return to
``train``, whichever is later, so time spent under a lease never counts. The first step after a start
or a lease has its own budget, learned from this job's first steps (:mod:`gpu_triage.verdicts.step_timing`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_triage.model.config_checks import boolean, number
from gpu_triage.model.config_schema import derived, setting
from gpu_triage.model.findings import Signal
from gpu_triage.model.snapshot import JobStatus, RankStatus
from gpu_triage.model.states import GpuState, Verdict
from gpu_triage.signals.fleet.fusion import FleetEvidence, FleetState, FusionConfig, fuse
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.signals.stacks.dumps import AVAILABLE
from gpu_triage.signals.stacks.evidence import (
    StackFacts,
    asleep_long_enough,
    stack_facts,
    where,
)
from gpu_triage.verdicts.evidence import job_evidence, job_findings
from gpu_triage.verdicts.facts import Decision as _Decision
from gpu_triage.verdicts.facts import JobFacts as _Facts
from gpu_triage.verdicts.step_timing import FirstStep, StepTiming, TimingConfig
from gpu_triage.verdicts.views import GpuView as GpuView
from gpu_triage.verdicts.views import JobView as JobView
from gpu_triage.verdicts.views import RankView as RankView

LEASED_PHASES = frozenset({"checkpoint", "eval", "epoch_end", "init", "done"})
WORKING_STATES = frozenset({GpuState.COMPUTE, GpuState.COMMUNICATION})
STOPPED_STATUSES = frozenset({"stopped", "tracing-stop"})


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """``[detector]``: when each verdict is called. Defined once, here; the daemon reads the section into
    it (:mod:`gpu_triage.daemon.config`) and fills the derived fields from ``[stacks]``, ``[daemon] node``
    and ``[cluster] stale_after_s``."""

    fast_min_s: float = setting(
        15.0, parse=number(1, 600), doc="hung (K1/K2): shortest freeze of the train ranks that counts"
    )
    k_fast: float = setting(
        1.5, parse=number(1, 100), doc="... and at least this many learned step intervals"
    )
    k_remote: float = setting(
        2.5,
        parse=number(1, 100),
        doc="K2 with ranks on other nodes, K5 (asymmetric): this many step intervals",
    )
    spin_min_s: float = setting(
        10.0, parse=number(0, 600), doc="every job GPU in the spin band at least this long"
    )
    stall_min_s: float = setting(
        60.0, parse=number(1, 3600), doc="stalled/slow: shortest freeze without proof of a hang"
    )
    k_stall: float = setting(
        3.0, parse=number(1, 100), doc="... and at least this many learned step intervals"
    )
    disagree_min_s: float = setting(
        15.0, parse=number(1, 600), doc="phase disagreement with frozen train ranks"
    )
    power_only_after_s: float = setting(
        120.0, parse=number(10, 180), doc="no progress files: spin band (or asymmetric) this long -> stalled"
    )
    power_only_can_kill: bool = setting(
        False,
        parse=boolean,
        doc="let power alone (no progress files) be kill-worthy: a remote save looks the same",
    )
    confirm_after_s: float = setting(
        120.0, parse=number(1, 3600), doc="suspected this long -> deadlock_confirmed"
    )
    write_active_bytes: float = setting(
        4 * 2**20, parse=number(0), doc="bytes written within write_window_s = 'writing'"
    )
    read_active_bytes: float = setting(
        4 * 2**20, parse=number(0), doc="bytes read within write_window_s = 'reading'"
    )
    write_window_s: float = setting(
        10.0, parse=number(1, 600), doc="window for write_active_bytes and read_active_bytes"
    )
    lease_grace_s: float = setting(5.0, parse=number(0, 3600), doc="tolerance past an announced lease_until")
    starvation_after_s: float = setting(
        30.0, parse=number(1, 3600), doc="sustained starvation -> data_starvation"
    )
    telemetry_lost_after_s: float = setting(10.0, parse=number(1, 600), doc="failed reads -> telemetry_lost")
    default_step_interval_s: float = setting(
        60.0, parse=number(0.01, 3600), doc="step interval assumed until the job's is learned"
    )
    first_step_default_s: float = setting(
        600.0, parse=number(1, 86400), doc="first step after a start, before any first step was seen"
    )
    k_first: float = setting(2.0, parse=number(1, 100), doc="a first step may take this x the longest seen")
    interval_decay: float = setting(
        0.1, parse=number(0, 1), doc="how fast the learned step interval comes down"
    )
    cpu_contention_ratio: float = setting(
        0.9, parse=number(0, 64), doc="a starving rank using this share of a core is CPU-bound"
    )
    slow_max_budgets: float = setting(
        10.0,
        parse=number(1, 1000),
        doc="slow (GPUs computing, steps frozen) this many stall budgets -> stalled",
    )
    idle_held_after_s: float = setting(
        300.0,
        parse=number(10, 86400),
        doc="no progress files: job GPUs idle with memory held this long -> cannot_judge",
    )
    stacks: StacksConfig = derived(
        StacksConfig(), doc="stack evidence settings ([stacks] in the config file: frozen_s, fresh_s, ...)"
    )
    fleet_node: str = derived(
        "this node", doc="this node's name ([daemon] node): how its ranks are named among the world's"
    )
    fleet_stale_after_s: float = derived(
        15.0, doc="other nodes' facts older than this are unknown ([cluster] stale_after_s)"
    )

    def fusion(self) -> FusionConfig:
        return FusionConfig(
            stale_after_s=self.fleet_stale_after_s, frozen_s=self.stacks.frozen_s, fresh_s=self.stacks.fresh_s
        )

    def timing(self) -> TimingConfig:
        return TimingConfig(
            default_interval_s=self.default_step_interval_s,
            first_step_default_s=self.first_step_default_s,
            k_first=self.k_first,
            decay=self.interval_decay,
        )


@dataclass
class _RankMemory:
    step: int | None = None
    step_at: float | None = None


@dataclass
class _JobMemory:
    timing: StepTiming
    ranks: dict[int, _RankMemory] = field(default_factory=dict)
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
    """The last time a rank was stopped or in D-state: frozen time restarts from there (a suspended
    or storage-stalled job that resumes owes no step for the time it could not run)."""


class Detector:
    def __init__(self, config: DetectorConfig = DetectorConfig()) -> None:
        self.config = config
        self._jobs: dict[str, _JobMemory] = {}
        self.job_errors: dict[str, str] = {}
        """Job -> the error that kept the detector from judging it in the last :meth:`update`."""
        self._gpu_unknown_since: dict[int, float] = {}

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)

    def export(self) -> dict[str, dict[str, Any]]:
        """What a restarted daemon needs to continue each job's episode (:meth:`restore`): the verdict
        in force, its onset and raise time, since when the hang evidence has held, the learned step
        interval. JSON values; times on the caller's timeline."""
        out: dict[str, dict[str, Any]] = {}
        for name, mem in self._jobs.items():
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

    def restore(self, saved: Any) -> int:
        """Seed job memories from :meth:`export` of an earlier detector (a restarted daemon). A restored
        job continues where it was: a suspicion keeps its clock toward confirmation, a confirmed hang
        stays confirmed while the evidence holds, the onset does not move. Malformed entries are
        skipped. Returns how many jobs were restored."""
        count = 0
        for name, e in saved.items() if isinstance(saved, dict) else ():
            try:
                mem = _JobMemory(StepTiming(self.config.timing()))
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
            self._jobs[str(name)] = mem
            count += 1
        return count

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
        # A job whose ranks are tied to no GPU may stand on the node's GPUs only when it is the one
        # job there and no job claims any GPU (NVML lists no pids: a container without host PIDs);
        # such inferred GPUs are context, never hang evidence. Otherwise it is reported unmapped.
        claimed = any(r.gpu is not None for j in jobs for r in j.ranks)
        inferred = tuple(gpus) if len(jobs) == 1 and not claimed else ()
        out = []
        self.job_errors = {}
        for job in jobs:
            try:
                out.append(self._job(now, job, by_gpu, telemetry_ok, inferred))
            except Exception as e:  # one job's failure stays in that job (reported, never a kill)
                out.append(self._failed_job(now, job, e))
        for gone in set(self._jobs) - {j.job for j in jobs}:
            del self._jobs[gone]
        return out

    def _failed_job(self, now: float, job: JobView, error: Exception) -> JobStatus:
        """The status of a job the detector could not judge this cycle: its last verdict kept (or
        telemetry_lost: the watchdog cannot see), never kill-worthy, the error in the evidence."""
        text = f"{type(error).__name__}: {error}"[:300]
        self.job_errors[job.job] = text
        mem = self._jobs.get(job.job)
        if mem is not None and mem.raised is None:
            mem = None  # first seen this cycle: no verdict of its own to keep
        verdict = mem.verdict if mem is not None else Verdict.TELEMETRY_LOST
        ranks = _rank_statuses(job)
        return JobStatus(
            job=job.job,
            ranks=ranks,
            verdict=verdict,
            onset=mem.onset if mem is not None else None,
            raised=mem.raised if mem is not None else now,
            cause="detector_error",
            detector_error=text,
            kill_worthy=False,
        )

    # -- one job ------------------------------------------------------------------------------
    def _job(
        self,
        now: float,
        job: JobView,
        by_gpu: dict[int, GpuView],
        telemetry_ok: bool,
        inferred: tuple[GpuView, ...],
    ) -> JobStatus:
        cfg = self.config
        mem = self._jobs.get(job.job)
        if mem is None:
            mem = self._jobs[job.job] = _JobMemory(StepTiming(cfg.timing()))
        mem.timing.config = cfg.timing()
        self._learn(now, job, mem)
        facts = self._facts(now, job, mem, by_gpu, telemetry_ok, inferred)
        frozen_after_s = min(self._fast_budget_s(facts, mem.timing, remote=facts.unseen > 0), 60.0)
        findings = job_findings(now, job, facts, frozen_after_s=frozen_after_s, stacks=cfg.stacks.evidence())
        if not self._blind_reasons(job, facts):
            mem.blind_since = None
        elif mem.blind_since is None:
            mem.blind_since = now
        decision = self._decide(now, job, mem, facts)
        if decision.verdict is not mem.verdict:
            mem.verdict, mem.onset, mem.raised = decision.verdict, decision.onset, now
        evidence = job_evidence(job, facts, decision)
        ranks = _rank_statuses(job)
        return JobStatus(
            job=job.job,
            ranks=ranks,
            verdict=mem.verdict,
            onset=mem.onset,
            raised=mem.raised,
            evidence=evidence,
            cause=decision.cause,
            kill_worthy=decision.kill_worthy,
            findings=tuple(findings),
        )

    def _facts(
        self,
        now: float,
        job: JobView,
        mem: _JobMemory,
        by_gpu: dict[int, GpuView],
        telemetry_ok: bool,
        inferred: tuple[GpuView, ...],
    ) -> _Facts:
        cfg = self.config
        mapped = sorted({r.gpu for r in job.ranks if r.gpu is not None})
        job_gpus = [by_gpu[g] for g in mapped if g in by_gpu]
        gpus_inferred = False
        if not mapped and inferred:
            job_gpus, gpus_inferred = list(inferred), True
        self._learn_nvlink(now, job_gpus, mem)
        known = [g for g in job_gpus if g.state is not GpuState.UNKNOWN]
        lost = [
            g.gpu
            for g in job_gpus
            if g.gpu in self._gpu_unknown_since
            and now - self._gpu_unknown_since[g.gpu] >= cfg.telemetry_lost_after_s
        ]
        usable = telemetry_ok and bool(known) and len(known) == len(job_gpus)
        spin_all = usable and all(g.state is GpuState.CHECKPOINT_OR_DEADLOCK for g in known)
        spin_since = max((now if g.since is None else g.since) for g in known) if spin_all else None
        spin_strong = spin_all and not gpus_inferred and all(g.util_known for g in known)
        working = [g for g in known if g.state in WORKING_STATES]
        waiting = [g for g in known if g.state is GpuState.CHECKPOINT_OR_DEADLOCK]
        majority = (
            usable
            and not spin_all
            and not gpus_inferred
            and len(waiting) * 2 > len(job_gpus)
            and all(g.util_known for g in known)
        )
        majority_since = max((now if g.since is None else g.since) for g in waiting) if majority else None
        writes = self._recent(now, mem.writes)
        reads = self._recent(now, mem.reads)
        train = [r for r in job.ranks if r.phase == "train" and r.step is not None]
        leased = [r for r in job.ranks if r.phase in LEASED_PHASES and r.lease_until is not None]
        live = [r for r in leased if now <= (r.lease_until or 0.0) + cfg.lease_grace_s]
        expired = [r for r in leased if r not in live]
        stopped = [r for r in job.ranks if r.status in STOPPED_STATUSES]
        dstate = [r for r in job.ranks if r.status == "disk-sleep"]
        actives = [r.active_since() for r in train]
        frozen_since = max(a for a in actives if a is not None) if train and None not in actives else None
        if stopped or dstate:
            mem.excused_at = now
        if frozen_since is not None and mem.excused_at is not None:
            frozen_since = max(frozen_since, mem.excused_at)
        frozen_s = max(0.0, now - frozen_since) if frozen_since is not None else 0.0
        firsts = [k for k in (r.first_step() for r in train) if k is not None]
        first = (FirstStep.AFTER_START if FirstStep.AFTER_START in firsts else firsts[0]) if firsts else None
        self._learn_idle(now, job, mem, job_gpus, usable and not gpus_inferred)
        visible = len({r.rank for r in job.ranks if r.step is not None})
        unseen = max(0, (job.world_size or 0) - visible) if job.has_progress else 0
        stacks, fleet = self._fleet(now, job, self._stack_facts(now, job, mem))
        return _Facts(
            job_gpus=job_gpus,
            gpus_inferred=gpus_inferred,
            unmapped=not mapped and bool(by_gpu),
            lost=lost,
            usable=usable,
            spin_all=spin_all,
            spin_strong=spin_strong,
            spin_since=spin_since,
            working=working,
            working_since=self._working_since(now, mem, working),
            waiting=waiting,
            majority_since=majority_since,
            writes=writes,
            writing=writes >= cfg.write_active_bytes,
            reads=reads,
            reading=reads >= cfg.read_active_bytes,
            train=train,
            live=live,
            expired=expired,
            stopped=stopped,
            dstate=dstate,
            frozen_since=frozen_since,
            frozen_s=frozen_s,
            first=first,
            interval_s=mem.timing.interval_s(),
            unseen=unseen,
            nvlink_frozen=self._nvlink_frozen_since(job_gpus, mem),
            stacks=stacks,
            fleet=fleet,
        )

    def _fleet(
        self, now: float, job: JobView, sf: StackFacts | None
    ) -> tuple[StackFacts | None, FleetEvidence | None]:
        """Other nodes' facts (gpu_triage.signals.fleet.fusion): a complete world completes this node's stack
        facts (the world's odd ranks named); never anything else here."""
        if job.remote is None:
            return sf, None
        world = job.world_size if job.world_size is not None else (sf.world_size if sf is not None else None)
        fleet = fuse(
            now,
            own_node=self.config.fleet_node,
            world_size=world,
            local_ranks=sorted({r.rank for r in job.ranks if r.alive is not False}),
            local_stacks=sf,
            remote=job.remote,
            cfg=self.config.fusion(),
        )
        if fleet.stacks_complete and sf is not None:
            sf = dataclasses.replace(sf, complete=True, odd=fleet.odd_ranks())
        return sf, fleet

    def _stack_facts(self, now: float, job: JobView, mem: _JobMemory) -> StackFacts | None:
        alive = [(r.rank, r.cpu_ratio) for r in job.ranks if r.alive is not False and r.pid is not None]
        sf = stack_facts(
            now, job.stacks, alive, job.world_size, self.config.stacks.evidence(), mem.asleep_since
        )
        mem.asleep_since = sf.asleep_since if sf is not None else None
        if sf is not None and sf.in_save and not sf.split:
            mem.save_seen_at = now
        return sf

    # -- budgets ---------------------------------------------------------------------------------
    def _fast_budget_s(self, f: _Facts, timing: StepTiming, *, remote: bool) -> float:
        """How long train ranks must be frozen before K1/K2 count it."""
        cfg = self.config
        if f.first is not None and (remote or f.first is FirstStep.AFTER_LEASE):
            return max(cfg.fast_min_s, timing.first_step_budget_s(f.first))
        if not timing.learned():
            return timing.first_step_budget_s(FirstStep.AFTER_START) if remote else 2 * cfg.fast_min_s
        k = cfg.k_remote if remote else cfg.k_fast
        return max(cfg.fast_min_s, k * timing.interval_s())

    def _stall_budget_s(self, f: _Facts, timing: StepTiming) -> float:
        cfg = self.config
        steady = max(cfg.stall_min_s, cfg.k_stall * timing.interval_s())
        if f.first is not None:
            return max(steady, timing.first_step_budget_s(f.first))
        return steady

    # -- decision ---------------------------------------------------------------------------------
    def _decide(self, now: float, job: JobView, mem: _JobMemory, f: _Facts) -> _Decision:
        cfg = self.config
        ended = self._ended(now, job)
        if ended is not None:
            mem.hang_since = mem.stopped_since = None
            verdict, cause = ended
            return _Decision(
                verdict,
                self._keep_onset(mem, verdict, now),
                cause,
                why_not="the job has ended on this node",
            )
        if f.stopped:
            mem.stopped_since = mem.stopped_since or now
            mem.hang_since = None
            return _Decision(
                Verdict.SUSPENDED,
                self._keep_onset(mem, Verdict.SUSPENDED, mem.stopped_since),
                "stopped",
                (str(Signal.RANKS_STOPPED),),
                why_not="a stopped rank cannot advance until it resumes",
            )
        mem.stopped_since = None
        hung = self._hung(now, job, mem, f)
        if hung is not None:
            onset, signals = hung
            mem.hang_since = mem.hang_since if mem.hang_since is not None else now
            held = now - mem.hang_since
            verdict = (
                Verdict.DEADLOCK_CONFIRMED
                if mem.verdict is Verdict.DEADLOCK_CONFIRMED or held >= cfg.confirm_after_s
                else Verdict.DEADLOCK_SUSPECTED
            )
            if mem.verdict in (Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED) and mem.onset:
                onset = mem.onset
            return _Decision(verdict, onset, None, tuple(signals), kill_worthy=True)
        mem.hang_since = None
        return self._not_hung(now, job, mem, f)

    def _ended(self, now: float, job: JobView) -> tuple[Verdict, str] | None:
        """``killed``, ``done`` or ``gone`` when the job has ended on this node, else None.

        Only the ranks whose processes the inspector knows count (``alive`` not None; another node's
        ranks are not judged here). ``killed``: the kill ladder signalled some of them and every one still
        running is among those - from the SIGTERM on, so the ranks' dying (steps frozen, leases
        dropped) is never read as a new stall; a relaunch under the same name has new pids.
        ``done``: every rank announced ``done`` and each one still running holds its live lease (past
        it, the usual ``after_done`` stall).
        ``gone``: every process has exited without that announcement.
        """
        local = [r for r in job.ranks if r.alive is not None and r.pid is not None]
        if not local:
            return None
        hit = [r for r in local if r.pid in job.signalled_pids]
        if hit and all(r.pid in job.signalled_pids for r in local if r.alive):
            alive = sum(1 for r in hit if r.alive)
            cause = f"signalled_by_watchdog:{alive}_alive" if alive else "signalled_by_watchdog"
            return Verdict.KILLED, cause
        phases = [r.phase for r in job.ranks if r.phase is not None]
        if phases and all(p == "done" for p in phases):
            grace = self.config.lease_grace_s
            running = [r for r in local if r.alive]
            if all(r.lease_until is not None and now <= r.lease_until + grace for r in running):
                return Verdict.DONE, "announced_done"
            return None
        if any(r.alive for r in local):
            return None
        return Verdict.GONE, "exited"

    def _vetoed(self, f: _Facts, *, asymmetric: bool = False, stacks: bool = False) -> str | None:
        """Evidence against a hang. For the asymmetric signature the odd GPUs may compute (a busy loop)
        but a rank reading (loading data) explains them instead. For stack evidence (K6) only a GPU
        that computes speaks against a hang: a GPU in the communication band while every rank's stack
        sits frozen in a collective is a spin whose power is on the band's edge."""
        if f.writing:
            return "the job's ranks are writing"
        if f.fleet is not None and f.fleet.veto:
            return f"another node: {f.fleet.veto}"
        if f.stacks is not None and f.stacks.in_save and not f.stacks.split:
            return "a rank's stack is inside a checkpoint save"
        if f.dstate:
            return "ranks in D-state (storage)"
        if asymmetric:
            return "ranks are reading (loading)" if f.reading else None
        if stacks and not any(g.state is GpuState.COMPUTE for g in f.working):
            return None
        if f.working:
            return "GPUs in the compute or communication band"
        return None

    def _hung(self, now: float, job: JobView, mem: _JobMemory, f: _Facts) -> tuple[float, list[str]] | None:
        """Positive proof of a hang (K1-K5), or None."""
        cfg = self.config
        full_veto = self._vetoed(f)
        spun = (
            full_veto is None
            and f.spin_strong
            and f.spin_since is not None
            and now - f.spin_since >= cfg.spin_min_s
        )
        # The asymmetric split (most GPUs spin, a few compute or idle) proves a hang only when every
        # rank is visible here and the trainer announces every collective phase on every rank: then
        # no unannounced save or eval on the odd rank can explain the others' wait.
        asym = (
            job.lease_scope == "job"
            and f.unseen == 0
            and f.majority_since is not None
            and now - f.majority_since >= cfg.spin_min_s
            and self._vetoed(f, asymmetric=True) is None
        )
        frozen = f.train and f.frozen_since is not None
        # K1: phase disagreement with frozen train ranks
        disagreeing = {"epoch_end"} | ({"checkpoint", "eval"} if job.lease_scope == "job" else set())
        disagree = [r for r in (*f.live, *f.expired) if r.phase in disagreeing]
        if full_veto is None and disagree and frozen:
            assert f.frozen_since is not None
            budget = max(cfg.disagree_min_s, self._fast_budget_s(f, mem.timing, remote=False))
            if f.frozen_s >= budget:
                return f.frozen_since, [str(Signal.PHASE_DISAGREEMENT), str(Signal.STEPS_FROZEN)]
        # K2: frozen steps + every job GPU in the spin band
        if job.has_progress and frozen and spun:
            assert f.frozen_since is not None and f.spin_since is not None
            remote = f.unseen > 0
            provable = not remote or (job.lease_scope == "job" and f.first is None)
            frozen_s = f.frozen_s
            completed = remote and not provable and self._remote_steps_frozen(now, f)
            if completed:  # every other node's rank frozen and spinning too (gpu_triage.signals.fleet)
                assert f.fleet is not None and f.fleet.remote_frozen_since is not None
                frozen_s = min(frozen_s, now - f.fleet.remote_frozen_since)
            if (provable or completed) and frozen_s >= self._fast_budget_s(f, mem.timing, remote=remote):
                onset = min(f.frozen_since, f.spin_since)
                signals = [str(Signal.STEPS_FROZEN), str(Signal.SPIN_BAND), str(Signal.NO_WRITES)]
                return onset, signals + ([str(Signal.REMOTE_COMPLETE)] if completed else [])
        # K5: frozen steps + the asymmetric split, naming the odd GPUs
        if frozen and asym:
            assert f.frozen_since is not None and f.majority_since is not None
            if f.frozen_s >= self._fast_budget_s(f, mem.timing, remote=True):
                return min(f.frozen_since, f.majority_since), [
                    str(Signal.STEPS_FROZEN),
                    str(Signal.ASYMMETRIC),
                    str(Signal.NO_WRITES),
                ]
        # K3: a broken lease promise while the job's GPUs spin (all, or the asymmetric split) and
        # nothing is written
        if (spun or asym) and f.expired and not [r for r in f.live if r.phase == "checkpoint"]:
            broken = [r for r in f.expired if r.phase != "checkpoint" or f.unseen == 0]
            train_ok = not f.train or (
                f.frozen_since is not None
                and f.frozen_s >= self._fast_budget_s(f, mem.timing, remote=f.unseen > 0)
            )
            if broken and train_ok:
                lease_end = max(r.lease_until or now for r in broken) + cfg.lease_grace_s
                band = Signal.SPIN_BAND if spun else Signal.ASYMMETRIC
                return lease_end, [str(Signal.LEASE_EXPIRED), str(band), str(Signal.NO_WRITES)]
        # K6: every rank's stack frozen in a collective (the odd ones named) + a second signal:
        # frozen steps, the spin band, or every rank asleep on the host
        k6 = self._stacks_hung(now, job, mem, f, self._vetoed(f, stacks=True), spun)
        if k6 is not None:
            return k6
        # K4: power alone, no progress files (kill-worthy only when configured)
        if (
            cfg.power_only_can_kill
            and not job.has_progress
            and spun
            and f.spin_since is not None
            and now - max(f.spin_since, mem.save_seen_at or 0.0) >= cfg.power_only_after_s
            and all(r.alive is not False for r in job.ranks)
        ):
            return f.spin_since, [str(Signal.SPIN_BAND), str(Signal.NO_WRITES), str(Signal.NO_PROGRESS_FILES)]
        return None

    def _remote_steps_frozen(self, now: float, f: _Facts) -> bool:
        fl = f.fleet
        return (
            fl is not None
            and fl.state is FleetState.COMPLETE
            and f.first is None
            and fl.remote_frozen_since is not None
            and fl.remote_spin_since is not None
            and now - fl.remote_spin_since >= self.config.spin_min_s
        )

    def _stacks_hung(
        self, now: float, job: JobView, mem: _JobMemory, f: _Facts, veto: str | None, spun: bool
    ) -> tuple[float, list[str]] | None:
        sf = f.stacks
        since = sf.hung_since() if sf is not None else None
        if sf is None or not sf.provable() or veto is not None or since is None:
            return None
        if any(r.alive is False for r in job.ranks):
            return None
        if sf.frozen:
            signals = [str(Signal.STACKS_FROZEN)]
            if sf.pattern.different or sf.odd:
                signals.append(str(Signal.STACKS_DIVERGED))
        else:  # K6 split: some ranks in a save's or an eval's collective, the others frozen in a step
            signals = [str(Signal.STACKS_PHASE_SPLIT)]
        if f.fleet is not None and f.fleet.stacks_complete:
            signals.append(str(Signal.REMOTE_COMPLETE))
        onset = since
        if job.has_progress:
            if not (f.train and f.frozen_since is not None):
                return None
            if f.frozen_s < self._fast_budget_s(f, mem.timing, remote=False):
                return None
            signals.append(str(Signal.STEPS_FROZEN))
            onset = min(onset, f.frozen_since)
        elif spun:
            signals.append(str(Signal.SPIN_BAND))
        elif self._ras_frozen(now, job):
            signals.append(str(Signal.NCCL_COUNTS_FROZEN))
        elif asleep_long_enough(sf, now, self.config.stacks.evidence()):
            signals.append(str(Signal.RANKS_ASLEEP))
        else:
            return None
        return onset, [*signals, str(Signal.NO_WRITES)]

    def _ras_frozen(self, now: float, job: JobView) -> bool:
        since = job.ras.counts_frozen_since if job.ras is not None else None
        return since is not None and now - since >= self.config.stacks.frozen_s

    def _stacks_not_hung(self, now: float, job: JobView, mem: _JobMemory, f: _Facts) -> _Decision | None:
        """A rank's stack inside a save: ``checkpoint`` (``stalled_checkpoint`` past the cap); every
        rank frozen without proof: ``stalled``. Never a kill."""
        sf = f.stacks
        if sf is None:
            return None
        if sf.split and sf.split_since is not None and self._vetoed(f) is None:
            split_why = (
                "stacks of only some ranks of the world: the rest may be elsewhere in the phase"
                if not sf.complete
                else "stacks split between a phase and a training step, but no second signal yet "
                "(steps, spin band, ranks asleep)"
            )
            return _Decision(
                Verdict.STALLED,
                self._keep_onset(mem, Verdict.STALLED, sf.split_since),
                ("stacks_split:" + where(sf))[:300],
                (str(Signal.STACKS_PHASE_SPLIT),),
                why_not=split_why,
            )
        if sf.in_save and sf.save_since is not None:
            held = now - sf.save_since
            if held >= self.config.stacks.checkpoint_max_s:
                verdict = Verdict.STALLED_CHECKPOINT
                signals: tuple[str, ...] = (str(Signal.STACK_IN_SAVE), "save_over_cap")
            else:
                verdict, signals = Verdict.CHECKPOINT, (str(Signal.STACK_IN_SAVE),)
            return _Decision(verdict, self._keep_onset(mem, verdict, sf.save_since), None, signals)
        if (
            sf.frozen
            and sf.frozen_since is not None
            and not (job.has_progress and f.train)
            and self._vetoed(f) is None  # GPUs working, writes: the same line sampled, not a freeze
        ):
            why = self._why_not(job, f)
            if not sf.complete:
                why = "stacks of only some ranks of the world: another node's rank may be saving"
            elif why is None or not job.has_progress:
                why = "stacks frozen, but no second signal (steps, spin band, ranks asleep)"
            cause = "stacks_frozen:" + where(sf)
            return _Decision(
                Verdict.STALLED,
                self._keep_onset(mem, Verdict.STALLED, sf.frozen_since),
                cause[:300],
                (str(Signal.STACKS_FROZEN),),
                why_not=why,
            )
        return None

    def _not_hung(self, now: float, job: JobView, mem: _JobMemory, f: _Facts) -> _Decision:
        cfg = self.config
        why_not = self._why_not(job, f)
        by_stack = self._stacks_not_hung(now, job, mem, f)
        if by_stack is not None and by_stack.verdict in (Verdict.CHECKPOINT, Verdict.STALLED_CHECKPOINT):
            return by_stack
        live_ckpt = [r for r in f.live if r.phase == "checkpoint"]
        if live_ckpt or (f.writing and f.waiting and len(f.waiting) * 2 >= len(f.job_gpus)):
            signals = ("checkpoint_lease",) if live_ckpt else (str(Signal.WRITES), str(Signal.SPIN_BAND))
            onset = min((r.phase_since for r in live_ckpt if r.phase_since is not None), default=None)
            if onset is None:
                onset = f.spin_since if f.spin_since is not None else now
            return _Decision(
                Verdict.CHECKPOINT, self._keep_onset(mem, Verdict.CHECKPOINT, onset), None, signals
            )
        expired_ckpt = [r for r in f.expired if r.phase == "checkpoint"]
        if expired_ckpt:
            onset = min(r.lease_until or now for r in expired_ckpt)
            signals = ("checkpoint_lease_expired", "still_writing" if f.writing else str(Signal.NO_WRITES))
            return _Decision(
                Verdict.STALLED_CHECKPOINT,
                self._keep_onset(mem, Verdict.STALLED_CHECKPOINT, onset),
                None,
                signals,
                why_not=why_not,
            )
        starving = [g for g in f.job_gpus if g.state is GpuState.DATA_STARVATION]
        if f.usable and starving and len(starving) * 2 > len(f.job_gpus):
            since = max((now if g.since is None else g.since) for g in starving)
            if now - since >= cfg.starvation_after_s:
                cause = self._starvation_cause(job)
                return _Decision(
                    Verdict.DATA_STARVATION,
                    self._keep_onset(mem, Verdict.DATA_STARVATION, since),
                    cause,
                    ("data_starvation_band", cause),
                )
        stall = self._stall(now, job, mem, f)
        if stall is not None:
            onset, cause, stall_signals, steps = stall
            if steps and f.working and f.working_since is not None and now - f.working_since < cfg.fast_min_s:
                return _Decision(Verdict.HEALTHY, None, None, (str(Signal.GPUS_WORKING),))
            if steps and (f.working or (f.reading and not f.dstate)):
                verdict, cause = self._slow_or_stalled(now, f, mem, cause)
            else:
                verdict = Verdict.STALLED
                if f.dstate:
                    cause = "storage_wait"
            return _Decision(
                verdict, self._keep_onset(mem, verdict, onset), cause, tuple(stall_signals), why_not=why_not
            )
        if by_stack is not None:
            return by_stack
        if f.lost:
            since = min(self._gpu_unknown_since[g] for g in f.lost)
            return _Decision(
                Verdict.TELEMETRY_LOST,
                self._keep_onset(mem, Verdict.TELEMETRY_LOST, since),
                None,
                (f"gpu_reads_failing:{','.join(map(str, f.lost))}",),
            )
        blind = self._cannot_judge(now, job, mem, f)
        if blind is not None:
            return blind
        advancing = f.train and f.frozen_s < 2 * f.interval_s
        return _Decision(Verdict.HEALTHY, None, None, (str(Signal.STEPS_ADVANCING),) if advancing else ())

    @staticmethod
    def _blind_reasons(job: JobView, f: _Facts) -> list[str]:
        """Why nothing here could show this job's progress or hang (empty: something could)."""
        if job.has_progress or any(r.alive is False for r in job.ranks):
            return []
        # a working sampler will dump the ranks (stale stacks are pending ones, not blindness)
        if f.stacks is not None and f.stacks.summary.sampler == AVAILABLE:
            return []
        if f.usable:
            return []
        if f.unmapped and not f.gpus_inferred:
            return ["no rank is tied to a GPU (a container without host PIDs?)"]
        return ["no GPU telemetry" if not f.job_gpus else "its GPUs cannot be read"]

    def _cannot_judge(self, now: float, job: JobView, mem: _JobMemory, f: _Facts) -> _Decision | None:
        """A job that shows no progress and no hang, where the watchdog has nothing that could show
        either: ``cannot_judge``, with what it cannot judge and why (never ``healthy``). Only for jobs
        without progress files: steps are a judge of their own."""
        if job.has_progress:
            return None
        reasons = self._blind_reasons(job, f)
        # a grace of one stack freshness window: the sampler's first dumps of a new job may be pending
        if reasons and mem.blind_since is not None and now - mem.blind_since >= self.config.stacks.fresh_s:
            why = f.stacks.summary.sampler if f.stacks is not None else "none taken"
            reasons.append(f"no stacks ({why})")
            reasons.insert(0, "no progress files")
            return _Decision(
                Verdict.CANNOT_JUDGE,
                self._keep_onset(mem, Verdict.CANNOT_JUDGE, mem.blind_since),
                "no_signals: " + "; ".join(reasons),
                ("cannot_judge:progress_and_hang",),
                why_not="nothing here can show progress or a hang",
            )
        if mem.idle_since is not None and now - mem.idle_since >= self.config.idle_held_after_s:
            held = self.config.idle_held_after_s
            return _Decision(
                Verdict.CANNOT_JUDGE,
                self._keep_onset(mem, Verdict.CANNOT_JUDGE, mem.idle_since),
                f"gpus_held_idle: no progress files; every job GPU idle with memory held for over "
                f"{held:.0f} s while its ranks live: a hung data loader and a process idling on purpose "
                "look the same",
                ("cannot_judge:progress", "gpus_held_idle"),
                why_not="idle GPUs are no evidence of a hang",
            )
        return None

    def _slow_or_stalled(self, now: float, f: _Facts, mem: _JobMemory, cause: str) -> tuple[Verdict, str]:
        """Frozen steps past the budget while some job GPU is busy: ``slow`` only while the GPUs do
        work that explains it. Not slowness (``stalled``, alert only): the busy GPUs are a minority
        while the rest spin (a busy loop on one rank), none computes (every "working" GPU in the
        communication band: a spin on the band's edge), or the freeze outlasted ``slow_max_budgets``
        stall budgets."""
        if not f.working:
            return Verdict.SLOW, f"reading:{cause}"
        computing = [g for g in f.working if g.state is GpuState.COMPUTE]
        if not computing:
            return Verdict.STALLED, f"communication_band_only:{cause}"
        if f.majority_since is not None and not f.dstate and not f.reading:
            gpus = ",".join(str(g.gpu) for g in f.job_gpus if g.state is not GpuState.CHECKPOINT_OR_DEADLOCK)
            return Verdict.STALLED, f"asymmetric:gpu {gpus}"
        if f.frozen_s >= self.config.slow_max_budgets * self._stall_budget_s(f, mem.timing):
            return Verdict.STALLED, f"slow_too_long:{cause}"
        return Verdict.SLOW, f"gpus_working:{cause}"

    def _stall(
        self, now: float, job: JobView, mem: _JobMemory, f: _Facts
    ) -> tuple[float, str, list[str], bool] | None:
        """No progress past the job's budget, without proof of a hang: (onset, cause, signals, and
        whether it is about steps - working GPUs then make it ``slow``)."""
        cfg = self.config
        if job.has_progress:
            if f.train and f.frozen_since is not None:
                fast = self._fast_budget_s(f, mem.timing, remote=f.unseen > 0)
                waiting_on_lease = [r for r in f.live if r.phase != "checkpoint"]
                spun = f.spin_since is not None and now - f.spin_since >= cfg.spin_min_s
                if f.spin_all and spun and f.frozen_s >= fast:  # looks hung, cannot be proven from here
                    onset = min(f.frozen_since, f.spin_since or f.frozen_since)
                    signals = [str(Signal.STEPS_FROZEN), str(Signal.SPIN_BAND)]
                    return onset, self._stall_cause(job, f), signals, True
                if waiting_on_lease and not f.spin_all:
                    return None  # train ranks wait on a rank that holds a live lease (an eval on rank 0)
                if f.frozen_s >= self._stall_budget_s(f, mem.timing):
                    return f.frozen_since, self._stall_cause(job, f), [str(Signal.STEPS_FROZEN)], True
            broken = [r for r in f.expired if r.alive is not False]
            if broken and not f.live:
                phase = sorted({r.phase or "?" for r in broken})[0]
                lease_end = max(r.lease_until or now for r in broken) + cfg.lease_grace_s
                cause = "after_done" if phase == "done" else f"lease_expired:{phase}"
                return lease_end, cause, [str(Signal.LEASE_EXPIRED)], True
            return None
        alive = all(r.alive is not False for r in job.ranks)
        if not (alive and not f.writing and f.usable):
            mem.asymmetric_since = None
            return None
        # a save seen in the stacks explains the spin until it ended
        spin_since = max(f.spin_since or 0.0, mem.save_seen_at or 0.0) if f.spin_since is not None else None
        if f.spin_all and spin_since is not None and now - spin_since >= cfg.power_only_after_s:
            return spin_since, "spin_band_without_progress_files", [str(Signal.SPIN_BAND)], False
        # the spin on the communication band's edge: every job GPU waits or "communicates", none
        # computes, for power_only_after_s (training computes every step)
        if mem.no_compute_since is not None and now - mem.no_compute_since >= cfg.power_only_after_s:
            return mem.no_compute_since, "communication_band_without_compute", [str(Signal.SPIN_BAND)], False
        # asymmetric: most job GPUs spin while the rest do something else (a busy loop, or idle)
        odd = [g for g in f.job_gpus if g.state is not GpuState.CHECKPOINT_OR_DEADLOCK]
        if len(f.job_gpus) >= 2 and f.waiting and 0 < len(odd) * 2 < len(f.job_gpus):
            mem.asymmetric_since = mem.asymmetric_since or max(
                (g.since if g.since is not None else now) for g in f.waiting
            )
            if now - mem.asymmetric_since >= cfg.power_only_after_s:
                gpus = ",".join(str(g.gpu) for g in odd)
                return mem.asymmetric_since, f"asymmetric:gpu {gpus}", [str(Signal.ASYMMETRIC)], False
        else:
            mem.asymmetric_since = None
        return None

    def _stall_cause(self, job: JobView, f: _Facts) -> str:
        if f.unseen and f.spin_all:
            return "waiting_on_other_nodes"
        if f.unmapped and not f.gpus_inferred:
            return "gpus_unmapped"
        if not f.usable:
            return "no_gpu_telemetry" if not f.job_gpus else "gpus_unreadable"
        if f.spin_all and not f.spin_strong:
            return "gpus_unmapped" if f.gpus_inferred else "utilization_unreadable"
        if f.first is not None:
            return f"first_step:{f.first}"
        return "steps_frozen"

    def _why_not(self, job: JobView, f: _Facts) -> str | None:
        """Why a job without progress is not (yet) called hung: the limit that stops the proof."""
        veto = self._vetoed(f)
        if veto:
            return veto
        if not job.has_progress:
            return "no progress files: power alone cannot tell a hang from a save elsewhere"
        if f.unseen and job.lease_scope != "job":
            return f"{f.unseen} rank(s) on other nodes and the trainer does not announce phases job-wide"
        if not f.usable:
            return "no usable GPU telemetry for this job's GPUs"
        if f.spin_all and not f.spin_strong:
            return "the spin band rests on power alone (GPUs unmapped or utilisation unreadable)"
        return None

    # -- evidence ---------------------------------------------------------------------------------
    @staticmethod
    def _keep_onset(mem: _JobMemory, verdict: Verdict, onset: float | None) -> float | None:
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
        """Step timing from the ranks' step changes (timed by the records), writes and reads."""
        stepped = [r for r in job.ranks if r.step is not None]
        leader = min((r.rank for r in stepped if r.phase == "train"), default=None)
        for r in stepped:
            rm = mem.ranks.setdefault(r.rank, _RankMemory())
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
        for r in job.ranks:
            if r.rank not in {s.rank for s in stepped}:
                mem.ranks.pop(r.rank, None)
        window = self.config.write_window_s
        written = sum(r.write_bytes_delta or 0.0 for r in job.ranks)
        read = sum(r.read_bytes_delta or 0.0 for r in job.ranks)
        for q, value in ((mem.writes, written), (mem.reads, read)):
            if value > 0:
                q.append((now, value))
            while q and now - q[0][0] > window:
                q.popleft()

    @staticmethod
    def _learn_idle(now: float, job: JobView, mem: _JobMemory, gpus: list[GpuView], mapped_ok: bool) -> None:
        """Since when the job's GPUs have been idle (memory held) / busy without computing."""
        alive = bool(job.ranks) and all(r.alive is not False for r in job.ranks)
        ok = mapped_ok and alive and bool(gpus) and all(g.util_known for g in gpus)
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

    @staticmethod
    def _working_since(now: float, mem: _JobMemory, working: list[GpuView]) -> float | None:
        if not working:
            mem.working_since = None
        elif mem.working_since is None:
            mem.working_since = min((now if g.since is None else g.since) for g in working)
        return mem.working_since

    def _recent(self, now: float, q: deque[tuple[float, float]]) -> float:
        return sum(b for t, b in q if now - t <= self.config.write_window_s)

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


__all__ = ["Detector", "DetectorConfig", "GpuView", "JobView", "RankView"]


def _opt_time(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"not a time: {value!r}")
    return float(value)


def _rank_statuses(job: JobView) -> tuple[RankStatus, ...]:
    return tuple(
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
