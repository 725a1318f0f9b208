"""The detector's record of one job: its findings (every signal's statement) and its evidence
(:class:`gpu_triage.model.evidence.JobEvidence`), from the cycle's facts and decision (pure)."""

from __future__ import annotations

from gpu_triage.model.evidence import CannotJudge, Coverage, JobEvidence
from gpu_triage.model.findings import Finding, Signal, context, hang, progress
from gpu_triage.model.health import HardwareFinding
from gpu_triage.signals.fleet.fusion import FleetEvidence, FleetState
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.signals.stacks.stack_facts import stack_findings, where
from gpu_triage.verdicts.facts import Decision, JobFacts
from gpu_triage.verdicts.views import JobView


def job_findings(
    now: float, job: JobView, f: JobFacts, *, frozen_after_s: float, stacks: StacksConfig
) -> list[Finding]:
    """Every signal's statement about the job this cycle. ``frozen_after_s``: how long no train rank
    may advance before ``steps_frozen`` is said (the fast budget, at most 60 s)."""
    out: list[Finding] = []
    rk = lambda rs: tuple(r.rank for r in rs)  # noqa: E731
    if f.train and f.frozen_since is not None:
        if f.frozen_s >= frozen_after_s:
            out.append(
                hang(
                    Signal.STEPS_FROZEN,
                    f"no train rank advanced for {f.frozen_s:.0f} s (step interval {f.interval_s:.1f} s)",
                    f.frozen_since,
                    ranks=rk(f.train),
                )
            )
        elif f.frozen_s < 2 * f.interval_s:
            out.append(progress(Signal.STEPS_ADVANCING, "steps advance", f.frozen_since))
    if f.spin_all:
        gpus = tuple(g.gpu for g in f.job_gpus)
        if f.spin_strong:
            out.append(hang(Signal.SPIN_BAND, "every job GPU in the spin band", f.spin_since, gpus=gpus))
        else:
            out.append(context(Signal.SPIN_BAND, "spin band from power alone", f.spin_since, gpus=gpus))
    if f.working:
        out.append(
            progress(
                Signal.GPUS_WORKING,
                "GPUs in the compute or communication band",
                gpus=tuple(g.gpu for g in f.working),
            )
        )
    disagree = [r for r in f.live if r.phase in ("epoch_end", "checkpoint", "eval")]
    if disagree and f.train:
        phases = ", ".join(sorted({r.phase or "" for r in disagree}))
        out.append(
            hang(
                Signal.PHASE_DISAGREEMENT,
                f"ranks in {phases} while others are in train",
                ranks=rk(disagree),
            )
        )
    # A lease speaks for progress - except the leases of ranks that disagree with frozen train
    # ranks: they are the epoch-end deadlock itself (K1), never evidence against it.
    split = disagree if disagree and f.train else []
    excusing = [r for r in f.live if r not in split]
    if excusing:
        out.append(progress(Signal.LIVE_LEASE, "live leases", ranks=rk(excusing)))
    if split:
        detail = "live leases of the ranks that left train: the disagreement, not progress"
        out.append(context(Signal.LIVE_LEASE, detail, ranks=rk(split)))
    if f.expired:
        phases = ", ".join(sorted({r.phase or "" for r in f.expired}))
        out.append(hang(Signal.LEASE_EXPIRED, f"{phases} lease outlived", ranks=rk(f.expired)))
    if f.nvlink_frozen is not None and f.spin_all:
        out.append(hang(Signal.NVLINK_FROZEN, "NVLink counters frozen on every job GPU", f.nvlink_frozen))
    if f.writing:
        out.append(progress(Signal.WRITES, f"{f.writes:.0f} bytes written recently"))
    elif f.train or f.spin_all:
        out.append(context(Signal.NO_WRITES, "nothing written recently"))
    if f.reading:
        out.append(progress(Signal.READS, f"{f.reads:.0f} bytes read recently"))
    if f.stopped:
        out.append(progress(Signal.RANKS_STOPPED, "ranks stopped (suspended)", ranks=rk(f.stopped)))
    if f.dstate:
        out.append(progress(Signal.RANKS_IN_D_STATE, "ranks waiting on storage", ranks=rk(f.dstate)))
    if not job.has_progress:
        out.append(context(Signal.NO_PROGRESS_FILES, "no progress files: power and processes only"))
    if not f.usable and not f.lost:
        out.append(context(Signal.NO_GPU_TELEMETRY, "no usable GPU telemetry for this job"))
    if f.unseen:
        detail = f"{f.unseen} of {job.world_size} ranks run on other nodes"
        out.append(context(Signal.UNSEEN_RANKS, detail))
    if f.gpus_inferred or f.unmapped:
        out.append(context(Signal.GPUS_UNMAPPED, "no rank is tied to a GPU"))
    if any(not g.util_known for g in f.job_gpus):
        out.append(context(Signal.UTILIZATION_UNREADABLE, "utilisation unreadable: power-only states"))
    if f.first is not None:
        out.append(context(Signal.FIRST_STEP, f"first step {f.first}"))
    for u in job.untrusted:
        out.append(context(Signal.UNTRUSTED_PROGRESS_FILE, str(u.get("reason", "")), since=None))
    out.extend(stack_findings(now, f.stacks, stacks))
    out.extend(fleet_findings(f.fleet))
    ras = job.ras
    if ras is not None and ras.counts_frozen_since is not None:
        detail = "NCCL RAS: no collective launched on the job's communicators between polls"
        out.append(hang(Signal.NCCL_COUNTS_FROZEN, detail, ras.counts_frozen_since))
    if ras is not None and (ras.missing or ras.behind):
        named = [f"missing {r.name()}" for r in ras.missing] + [f"behind {r.name()}" for r in ras.behind]
        ranks = tuple(r.rank for r in (*ras.missing, *ras.behind) if r.rank is not None)
        out.append(hang(Signal.NCCL_MISSING_RANKS, "NCCL RAS: " + "; ".join(named[:16]), ranks=ranks))
    return out


def job_evidence(
    job: JobView, f: JobFacts, d: Decision, *, hardware: tuple[HardwareFinding, ...] = ()
) -> JobEvidence:
    """What the detector records about the job (JSON only at the edge: ``JobStatus.evidence_dict``);
    ``hardware``: the node's hardware findings on the job's GPUs (:mod:`gpu_triage.verdicts.blame`),
    built in (not a copy of the whole evidence every process period to add them)."""
    return JobEvidence(
        gpus=tuple([g.gpu for g in f.job_gpus]),
        gpus_inferred=f.gpus_inferred,
        gpu_states={g.gpu: g.state for g in f.job_gpus},
        spin_band_since=f.spin_since,
        step_by_rank={r.rank: r.step for r in job.ranks if r.step is not None},
        phase_by_rank={r.rank: r.phase for r in job.ranks if r.phase is not None},
        steps_frozen_since=f.frozen_since if job.has_progress else None,
        step_interval_s=f.interval_s,
        first_step=str(f.first) if f.first is not None else None,
        bytes_written_recently=f.writes,
        bytes_read_recently=f.reads,
        live_lease_until_by_rank={r.rank: r.lease_until for r in f.live},
        expired_lease_until_by_rank={r.rank: r.lease_until for r in f.expired},
        nvlink_frozen_since=f.nvlink_frozen,
        telemetry="ok" if f.usable else ("lost" if f.lost else ("none" if not f.job_gpus else "partial")),
        coverage=Coverage(
            visible_ranks=len(job.ranks),
            world_size=job.world_size,
            unseen_ranks=f.unseen,
            lease_scope=job.lease_scope or "rank",
        ),
        signals=tuple(d.signals),
        cannot_judge=cannot_judge(job, f),
        gpus_unknown=f.unmapped and not f.gpus_inferred,
        not_kill_worthy_because=None if d.kill_worthy else d.why_not,
        untrusted_progress_files=tuple(job.untrusted),
        nccl_ras=job.ras,
        stacks=f.stacks,
        stacks_where=where(f.stacks) if f.stacks is not None else None,
        stack_phase_by_rank=(
            {r: str(s.info.phase) for r, s in f.stacks.summary.ranks.items()} if f.stacks is not None else {}
        ),
        fleet=f.fleet,
        hardware=hardware,
    )


def cannot_judge(job: JobView, f: JobFacts) -> tuple[CannotJudge, ...]:
    """What this node cannot judge about the job, and why (empty: every signal is there)."""
    out: list[CannotJudge] = []
    if not job.has_progress:
        out.append(CannotJudge("steps", "no progress files (no integration)"))
    if f.unmapped and not f.gpus_inferred:
        out.append(
            CannotJudge(
                "power",
                "no rank is tied to a GPU: the job's GPUs are unknown (a container without host PIDs?)",
            )
        )
    elif f.gpus_inferred:
        out.append(CannotJudge("power", "no rank is tied to a GPU: the node's GPUs stand in (context)"))
    elif not f.job_gpus:
        out.append(CannotJudge("power", "no GPU telemetry"))
    elif not f.usable:
        out.append(CannotJudge("power", "the job's GPUs cannot be read"))
    sf = f.stacks
    if sf is None or not sf.pattern.sampled:
        why = sf.summary.sampler if sf is not None and sf.summary.sampler != "available" else "none taken"
        out.append(CannotJudge("stacks", f"no fresh stack ({why})"))
    return tuple(out)


def fleet_findings(fl: FleetEvidence | None) -> list[Finding]:
    """What the other nodes' facts said, as findings (none without ``[cluster]``)."""
    if fl is None:
        return []
    if fl.state is FleetState.VETO:
        return [progress(Signal.REMOTE_VETO, fl.reason)]
    if fl.state is FleetState.UNKNOWN:
        return [context(Signal.REMOTE_UNKNOWN, f"{fl.reason}: this node's own judgment only")]
    if fl.state is FleetState.NODE_LOST:
        return [hang(Signal.NODE_LOST, fl.reason, fl.lost_since())]
    if fl.stacks_complete:
        odd = f"; odd: {fl.named_odd()}" if fl.odd else ""
        how = "split between a save's or an eval's collective and a training step" if fl.split else "frozen"
        nodes = fl.node_count if fl.node_count is not None else len(fl.nodes) + 1
        detail = f"every rank of the world {how}, on {nodes} nodes{odd}"
        return [hang(Signal.REMOTE_COMPLETE, detail, fl.frozen_since, ranks=fl.odd_ranks())]
    if fl.state is FleetState.COMPLETE:
        return [hang(Signal.REMOTE_COMPLETE, fl.reason, fl.remote_frozen_since)]
    return [context(Signal.REMOTE_UNKNOWN, fl.reason)]
