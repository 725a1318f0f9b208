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

**Where each part lives**: this module is the facade (:class:`Detector`); the settings are
:mod:`~gpu_triage.verdicts.settings` (:class:`DetectorConfig`), the per-job memory
across cycles and its saved form :mod:`~gpu_triage.verdicts.memory`, one cycle's facts about a job
:mod:`~gpu_triage.verdicts.facts`, the freeze budgets :mod:`~gpu_triage.verdicts.budgets`, the hang
rules K1-K6 :mod:`~gpu_triage.verdicts.hang_rules`, the verdicts without proof (``stalled``, ``slow``,
``cannot_judge``) :mod:`~gpu_triage.verdicts.stall_rules`, and the verdict decision
:mod:`~gpu_triage.verdicts.decision`; findings and evidence :mod:`~gpu_triage.verdicts.job_evidence`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gpu_triage.model.findings import Signal
from gpu_triage.model.health import UNKNOWN_HEALTH, NodeHealth
from gpu_triage.model.snapshot import JobStatus, RankStatus
from gpu_triage.model.states import DEADLOCK_VERDICTS, GpuState, Verdict
from gpu_triage.verdicts import blame
from gpu_triage.verdicts.budgets import fast_budget_s
from gpu_triage.verdicts.decision import decide
from gpu_triage.verdicts.facts import job_facts
from gpu_triage.verdicts.job_evidence import job_evidence, job_findings
from gpu_triage.verdicts.memory import JobMemory, export_core, export_jobs, learn, restore_jobs
from gpu_triage.verdicts.settings import DetectorConfig
from gpu_triage.verdicts.stall_rules import blind_reasons
from gpu_triage.verdicts.step_timing import StepTiming
from gpu_triage.verdicts.views import GpuView, JobView

_DEFAULT_CONFIG = DetectorConfig()


class Detector:
    def __init__(self, config: DetectorConfig = _DEFAULT_CONFIG) -> None:
        self.config = config
        self._jobs: dict[str, JobMemory] = {}
        self.job_errors: dict[str, str] = {}
        """Job -> the error that kept the detector from judging it in the last :meth:`update`."""
        self._gpu_unknown_since: dict[int, float] = {}

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)

    def export(self) -> dict[str, dict[str, Any]]:
        """What a restarted daemon needs to continue each job's episode (:meth:`restore`): the verdict
        in force, its onset and raise time, since when the hang evidence has held, the learned step
        interval. JSON values; times on the caller's timeline."""
        return export_jobs(self._jobs)

    def export_core(self) -> dict[str, tuple[str, float | None, float | None]]:
        """Each job's (verdict, onset, hang_since) as :meth:`export` has them: what the daemon saves
        at once when it changes, asked every process period without building the whole export."""
        return export_core(self._jobs)

    def restore(self, saved: Any) -> int:
        """Seed job memories from :meth:`export` of an earlier detector (a restarted daemon). A restored
        job continues where it was: a suspicion keeps its clock toward confirmation, a confirmed hang
        stays confirmed while the evidence holds, the onset does not move. Malformed entries are
        skipped. Returns how many jobs were restored."""
        return restore_jobs(saved, self.config.timing(), self._jobs)

    def update(
        self,
        now: float,
        gpus: Sequence[GpuView],
        jobs: Sequence[JobView],
        telemetry_ok: bool = True,
        node_health: NodeHealth = UNKNOWN_HEALTH,
    ) -> list[JobStatus]:
        """One cycle. ``telemetry_ok`` is False when the source reports no GPUs at all (``none``);
        ``node_health``: the node's hardware health this cycle (:mod:`gpu_triage.verdicts.blame`)."""
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
                out.append(self._job(now, job, by_gpu, telemetry_ok, inferred, node_health))
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
        node_health: NodeHealth = UNKNOWN_HEALTH,
    ) -> JobStatus:
        cfg = self.config
        mem = self._jobs.get(job.job)
        if mem is None:
            mem = self._jobs[job.job] = JobMemory(StepTiming(cfg.timing()))
        mem.timing.config = cfg.timing()
        learn(now, job, mem, cfg.write_window_s)
        facts = job_facts(now, job, mem, by_gpu, telemetry_ok, inferred, self._gpu_unknown_since, cfg)
        hw = blame.judge(
            {r.gpu for r in job.ranks if r.gpu is not None} | {g.gpu for g in facts.job_gpus}, node_health
        )
        facts = blame.without_spin(facts, hw)
        frozen_after_s = min(fast_budget_s(cfg, facts, mem.timing, remote=facts.unseen > 0), 60.0)
        findings = job_findings(now, job, facts, frozen_after_s=frozen_after_s, stacks=cfg.stacks)
        if not blind_reasons(job, facts):
            mem.blind_since = None
        elif mem.blind_since is None:
            mem.blind_since = now
        decision = decide(now, job, mem, facts, cfg, self._gpu_unknown_since)
        escalated = blame.escalate(decision, hw, facts, frozen_after_s=frozen_after_s)
        if escalated is not decision:
            if mem.verdict in DEADLOCK_VERDICTS and mem.onset is not None:
                escalated = dataclasses.replace(escalated, onset=mem.onset)
            mem.hang_since = mem.hang_since if mem.hang_since is not None else now
            decision = escalated
        findings.extend(
            blame.findings(hw, lost_proves=any(s.startswith(Signal.GPU_LOST) for s in decision.signals))
        )
        if decision.verdict is not mem.verdict:
            mem.verdict, mem.onset, mem.raised = decision.verdict, decision.onset, now
        evidence = job_evidence(job, facts, decision, hardware=hw.findings)
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
            blame=blame.blame_for(mem.verdict, hw, decision.cause),
        )


__all__ = ["Detector"]


def _rank_statuses(job: JobView) -> tuple[RankStatus, ...]:
    return tuple(
        [
            RankStatus(
                rank=r.rank,
                pid=r.pid,
                gpu=r.gpu,
                step=r.step,
                phase=r.phase,
                lease_until=r.lease_until,
                alive=r.alive,
                process_status=r.status,
                step_since=r.step_changed_at,
            )
            for r in job.ranks
        ]
    )
