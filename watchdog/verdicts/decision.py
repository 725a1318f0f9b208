"""From one job's facts to its verdict this cycle (:func:`decide`): an ended job (``killed``, ``done``,
``gone``), a stopped one (``suspended``), a proven hang (:mod:`~gpu_triage.verdicts.hang_rules`:
``deadlock_suspected``, then ``deadlock_confirmed`` - the only kill-worthy verdicts), else the verdicts
without proof (:mod:`~gpu_triage.verdicts.stall_rules`) down to ``healthy``. Keeps the job memory's
episode clocks (since when the hang evidence held, since when a rank is stopped)."""

from __future__ import annotations

from gpu_triage.model.findings import Signal
from gpu_triage.model.states import GpuState, Verdict
from gpu_triage.verdicts import hang_rules, stall_rules
from gpu_triage.verdicts.facts import Decision, JobFacts
from gpu_triage.verdicts.memory import JobMemory, keep_onset
from gpu_triage.verdicts.settings import DetectorConfig
from gpu_triage.verdicts.views import JobView


def decide(
    now: float,
    job: JobView,
    mem: JobMemory,
    f: JobFacts,
    cfg: DetectorConfig,
    gpu_unknown_since: dict[int, float],
) -> Decision:
    ended_ = ended(now, job, cfg)
    if ended_ is not None:
        mem.hang_since = mem.stopped_since = None
        verdict, cause = ended_
        return Decision(
            verdict, keep_onset(mem, verdict, now), cause, why_not="the job has ended on this node"
        )
    if f.stopped:
        mem.stopped_since = mem.stopped_since or now
        mem.hang_since = None
        return Decision(
            Verdict.SUSPENDED,
            keep_onset(mem, Verdict.SUSPENDED, mem.stopped_since),
            "stopped",
            (str(Signal.RANKS_STOPPED),),
            why_not="a stopped rank cannot advance until it resumes",
        )
    mem.stopped_since = None
    hang = hang_rules.hung(now, job, f, cfg, mem.timing, mem.save_seen_at)
    if hang is not None:
        onset = hang.onset
        mem.hang_since = mem.hang_since if mem.hang_since is not None else now
        held = now - mem.hang_since
        verdict = (
            Verdict.DEADLOCK_CONFIRMED
            if mem.verdict is Verdict.DEADLOCK_CONFIRMED or held >= cfg.confirm_after_s
            else Verdict.DEADLOCK_SUSPECTED
        )
        if mem.verdict in (Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED) and mem.onset:
            onset = mem.onset
        return Decision(verdict, onset, hang.cause, hang.signals, kill_worthy=True)
    mem.hang_since = None
    return not_hung(now, job, mem, f, cfg, gpu_unknown_since)


def ended(now: float, job: JobView, cfg: DetectorConfig) -> tuple[Verdict, str] | None:
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
        grace = cfg.lease_grace_s
        running = [r for r in local if r.alive]
        if all(r.lease_until is not None and now <= r.lease_until + grace for r in running):
            return Verdict.DONE, "announced_done"
        return None
    if any(r.alive for r in local):
        return None
    return Verdict.GONE, "exited"


def not_hung(
    now: float,
    job: JobView,
    mem: JobMemory,
    f: JobFacts,
    cfg: DetectorConfig,
    gpu_unknown_since: dict[int, float],
) -> Decision:
    """No proof of a hang: a save, a stall, starvation, slowness, lost telemetry, blindness or health."""
    why_not = stall_rules.why_not(job, f)
    by_stack = stall_rules.stacks_not_hung(now, job, mem, f, cfg)
    if by_stack is not None and by_stack.verdict in (Verdict.CHECKPOINT, Verdict.STALLED_CHECKPOINT):
        return by_stack
    live_ckpt = [r for r in f.live if r.phase == "checkpoint"]
    if live_ckpt or (f.writing and f.waiting and len(f.waiting) * 2 >= len(f.job_gpus)):
        signals = ("checkpoint_lease",) if live_ckpt else (str(Signal.WRITES), str(Signal.SPIN_BAND))
        onset = min((r.phase_since for r in live_ckpt if r.phase_since is not None), default=None)
        if onset is None:
            onset = f.spin_since if f.spin_since is not None else now
        return Decision(Verdict.CHECKPOINT, keep_onset(mem, Verdict.CHECKPOINT, onset), None, signals)
    expired_ckpt = [r for r in f.expired if r.phase == "checkpoint"]
    if expired_ckpt:
        onset = min(r.lease_until or now for r in expired_ckpt)
        signals = ("checkpoint_lease_expired", "still_writing" if f.writing else str(Signal.NO_WRITES))
        return Decision(
            Verdict.STALLED_CHECKPOINT,
            keep_onset(mem, Verdict.STALLED_CHECKPOINT, onset),
            None,
            signals,
            why_not=why_not,
        )
    starving = [g for g in f.job_gpus if g.state is GpuState.DATA_STARVATION]
    if f.usable and starving and len(starving) * 2 > len(f.job_gpus):
        since = max((now if g.since is None else g.since) for g in starving)
        if now - since >= cfg.starvation_after_s:
            cause = stall_rules.starvation_cause(job, cfg)
            return Decision(
                Verdict.DATA_STARVATION,
                keep_onset(mem, Verdict.DATA_STARVATION, since),
                cause,
                ("data_starvation_band", cause),
            )
    stall = stall_rules.stall(now, job, mem, f, cfg)
    if stall is not None:
        cause = stall.cause
        if (
            stall.steps
            and f.working
            and f.working_since is not None
            and now - f.working_since < cfg.fast_min_s
        ):
            return Decision(Verdict.HEALTHY, None, None, (str(Signal.GPUS_WORKING),))
        if stall.steps and (f.working or (f.reading and not f.dstate)):
            verdict, cause = stall_rules.slow_or_stalled(f, mem, cause, cfg)
        else:
            verdict = Verdict.STALLED
            if f.dstate:
                cause = "storage_wait"
        return Decision(verdict, keep_onset(mem, verdict, stall.onset), cause, stall.signals, why_not=why_not)
    if by_stack is not None:
        return by_stack
    if f.lost:
        since = min(gpu_unknown_since[g] for g in f.lost)
        return Decision(
            Verdict.TELEMETRY_LOST,
            keep_onset(mem, Verdict.TELEMETRY_LOST, since),
            None,
            (f"gpu_reads_failing:{','.join(map(str, f.lost))}",),
        )
    blind = stall_rules.cannot_judge(now, job, mem, f, cfg)
    if blind is not None:
        return blind
    advancing = f.train and f.frozen_s < 2 * f.interval_s
    return Decision(Verdict.HEALTHY, None, None, (str(Signal.STEPS_ADVANCING),) if advancing else ())
