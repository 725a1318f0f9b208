"""The rules for a job without proof of a hang (docs/detector.md): alert-worthy at most, never a kill.
``stalled`` (no progress past the budget), ``slow`` (past the budget while the GPUs do work that
explains it), what the stacks say short of a proof (``checkpoint``, ``stalled``), ``cannot_judge``
(nothing here could show progress or a hang), and why a job is not (yet) called hung.

Pure functions of the job's view and facts, the settings and its memory; the memory's onsets that
need time (the asymmetric split) are kept on the way."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_triage.model.findings import Signal
from gpu_triage.model.states import GpuState, Verdict
from gpu_triage.signals.stacks.dumps import AVAILABLE
from gpu_triage.signals.stacks.stack_facts import where
from gpu_triage.verdicts.budgets import fast_budget_s, stall_budget_s
from gpu_triage.verdicts.facts import Decision, JobFacts
from gpu_triage.verdicts.hang_rules import vetoed
from gpu_triage.verdicts.memory import JobMemory, keep_onset
from gpu_triage.verdicts.settings import DetectorConfig
from gpu_triage.verdicts.views import JobView


@dataclass(frozen=True, slots=True)
class Stall:
    """No progress past the job's budget, without proof of a hang."""

    onset: float
    cause: str
    signals: tuple[str, ...]
    steps: bool
    """About steps: working GPUs then make it ``slow``."""


def stall(now: float, job: JobView, mem: JobMemory, f: JobFacts, cfg: DetectorConfig) -> Stall | None:
    """No progress past the job's budget, without proof of a hang (None: none)."""
    if job.has_progress:
        if f.train and f.frozen_since is not None:
            fast = fast_budget_s(cfg, f, mem.timing, remote=f.unseen > 0)
            waiting_on_lease = [r for r in f.live if r.phase != "checkpoint"]
            spun = f.spin_since is not None and now - f.spin_since >= cfg.spin_min_s
            if f.spin_all and spun and f.frozen_s >= fast:  # looks hung, cannot be proven from here
                onset = min(f.frozen_since, f.spin_since or f.frozen_since)
                signals = (str(Signal.STEPS_FROZEN), str(Signal.SPIN_BAND))
                return Stall(onset, stall_cause(f), signals, True)
            if waiting_on_lease and not f.spin_all:
                return None  # train ranks wait on a rank that holds a live lease (an eval on rank 0)
            if f.frozen_s >= stall_budget_s(cfg, f, mem.timing):
                return Stall(f.frozen_since, stall_cause(f), (str(Signal.STEPS_FROZEN),), True)
        broken = [r for r in f.expired if r.alive is not False]
        if broken and not f.live:
            phase = sorted({r.phase or "?" for r in broken})[0]
            lease_end = max(r.lease_until or now for r in broken) + cfg.lease_grace_s
            cause = "after_done" if phase == "done" else f"lease_expired:{phase}"
            return Stall(lease_end, cause, (str(Signal.LEASE_EXPIRED),), True)
        return None
    alive = all(r.alive is not False for r in job.ranks)
    if not (alive and not f.writing and f.usable):
        mem.asymmetric_since = None
        return None
    # a save seen in the stacks explains the spin until it ended
    spin_since = max(f.spin_since or 0.0, mem.save_seen_at or 0.0) if f.spin_since is not None else None
    if f.spin_all and spin_since is not None and now - spin_since >= cfg.power_only_after_s:
        return Stall(spin_since, "spin_band_without_progress_files", (str(Signal.SPIN_BAND),), False)
    # the spin on the communication band's edge: every job GPU waits or "communicates", none
    # computes, for power_only_after_s (training computes every step)
    if mem.no_compute_since is not None and now - mem.no_compute_since >= cfg.power_only_after_s:
        return Stall(
            mem.no_compute_since, "communication_band_without_compute", (str(Signal.SPIN_BAND),), False
        )
    # asymmetric: most job GPUs spin while the rest do something else (a busy loop, or idle)
    odd = [g for g in f.job_gpus if g.state is not GpuState.CHECKPOINT_OR_DEADLOCK]
    if len(f.job_gpus) >= 2 and f.waiting and 0 < len(odd) * 2 < len(f.job_gpus):
        mem.asymmetric_since = mem.asymmetric_since or max(
            (g.since if g.since is not None else now) for g in f.waiting
        )
        if now - mem.asymmetric_since >= cfg.power_only_after_s:
            gpus = ",".join(str(g.gpu) for g in odd)
            return Stall(mem.asymmetric_since, f"asymmetric:gpu {gpus}", (str(Signal.ASYMMETRIC),), False)
    else:
        mem.asymmetric_since = None
    return None


def slow_or_stalled(f: JobFacts, mem: JobMemory, cause: str, cfg: DetectorConfig) -> tuple[Verdict, str]:
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
    if f.frozen_s >= cfg.slow_max_budgets * stall_budget_s(cfg, f, mem.timing):
        return Verdict.STALLED, f"slow_too_long:{cause}"
    return Verdict.SLOW, f"gpus_working:{cause}"


def stall_cause(f: JobFacts) -> str:
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


def why_not(job: JobView, f: JobFacts) -> str | None:
    """Why a job without progress is not (yet) called hung: the limit that stops the proof."""
    veto = vetoed(f)
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


def starvation_cause(job: JobView, cfg: DetectorConfig) -> str:
    if any(r.status == "disk-sleep" for r in job.ranks):
        return "storage_wait"
    ratios = [r.cpu_ratio for r in job.ranks if r.cpu_ratio is not None]
    if ratios and max(ratios) >= cfg.cpu_contention_ratio:
        return "cpu_contention"
    return "loader"


def stacks_not_hung(
    now: float, job: JobView, mem: JobMemory, f: JobFacts, cfg: DetectorConfig
) -> Decision | None:
    """A rank's stack inside a save: ``checkpoint`` (``stalled_checkpoint`` past the cap); every
    rank frozen without proof: ``stalled``. Never a kill."""
    sf = f.stacks
    if sf is None:
        return None
    if sf.split and sf.split_since is not None and vetoed(f) is None:
        split_why = (
            "stacks of only some ranks of the world: the rest may be elsewhere in the phase"
            if not sf.complete
            else "stacks split between a phase and a training step, but no second signal yet "
            "(steps, spin band, ranks asleep)"
        )
        return Decision(
            Verdict.STALLED,
            keep_onset(mem, Verdict.STALLED, sf.split_since),
            ("stacks_split:" + where(sf))[:300],
            (str(Signal.STACKS_PHASE_SPLIT),),
            why_not=split_why,
        )
    if sf.in_save and sf.save_since is not None:
        held = now - sf.save_since
        if held >= cfg.stacks.checkpoint_max_s:
            verdict = Verdict.STALLED_CHECKPOINT
            signals: tuple[str, ...] = (str(Signal.STACK_IN_SAVE), "save_over_cap")
        else:
            verdict, signals = Verdict.CHECKPOINT, (str(Signal.STACK_IN_SAVE),)
        return Decision(verdict, keep_onset(mem, verdict, sf.save_since), None, signals)
    if (
        sf.frozen
        and sf.frozen_since is not None
        and not (job.has_progress and f.train)
        and vetoed(f) is None  # GPUs working, writes: the same line sampled, not a freeze
    ):
        why = why_not(job, f)
        if not sf.complete:
            why = "stacks of only some ranks of the world: another node's rank may be saving"
        elif why is None or not job.has_progress:
            why = "stacks frozen, but no second signal (steps, spin band, ranks asleep)"
        cause = "stacks_frozen:" + where(sf)
        return Decision(
            Verdict.STALLED,
            keep_onset(mem, Verdict.STALLED, sf.frozen_since),
            cause[:300],
            (str(Signal.STACKS_FROZEN),),
            why_not=why,
        )
    return None


def blind_reasons(job: JobView, f: JobFacts) -> list[str]:
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


def cannot_judge(
    now: float, job: JobView, mem: JobMemory, f: JobFacts, cfg: DetectorConfig
) -> Decision | None:
    """A job that shows no progress and no hang, where the watchdog has nothing that could show
    either: ``cannot_judge``, with what it cannot judge and why (never ``healthy``). Only for jobs
    without progress files: steps are a judge of their own."""
    if job.has_progress:
        return None
    reasons = blind_reasons(job, f)
    # a grace of one stack freshness window: the sampler's first dumps of a new job may be pending
    if reasons and mem.blind_since is not None and now - mem.blind_since >= cfg.stacks.fresh_s:
        why = f.stacks.summary.sampler if f.stacks is not None else "none taken"
        reasons.append(f"no stacks ({why})")
        reasons.insert(0, "no progress files")
        return Decision(
            Verdict.CANNOT_JUDGE,
            keep_onset(mem, Verdict.CANNOT_JUDGE, mem.blind_since),
            "no_signals: " + "; ".join(reasons),
            ("cannot_judge:progress_and_hang",),
            why_not="nothing here can show progress or a hang",
        )
    if mem.idle_since is not None and now - mem.idle_since >= cfg.idle_held_after_s:
        held = cfg.idle_held_after_s
        return Decision(
            Verdict.CANNOT_JUDGE,
            keep_onset(mem, Verdict.CANNOT_JUDGE, mem.idle_since),
            f"gpus_held_idle: no progress files; every job GPU idle with memory held for over "
            f"{held:.0f} s while its ranks live: a hung data loader and a process idling on purpose "
            "look the same",
            ("cannot_judge:progress", "gpus_held_idle"),
            why_not="idle GPUs are no evidence of a hang",
        )
    return None
