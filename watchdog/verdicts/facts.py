"""What one cycle's inputs say about one job (:class:`JobFacts`, gathered by :func:`job_facts`), and
the rules' answer (:class:`Decision`): the values passed between the detector's steps (pure)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpu_triage.model.states import GpuState, Verdict
from gpu_triage.signals.fleet.fusion import FleetEvidence, fuse
from gpu_triage.signals.stacks.stack_facts import StackFacts, stack_facts
from gpu_triage.verdicts import memory
from gpu_triage.verdicts.memory import JobMemory
from gpu_triage.verdicts.settings import LEASED_PHASES, STOPPED_STATUSES, WORKING_STATES, DetectorConfig
from gpu_triage.verdicts.step_timing import FirstStep
from gpu_triage.verdicts.views import GpuView, JobView, RankView


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What one cycle's inputs say about one job, before any verdict."""

    job_gpus: list[GpuView]
    gpus_inferred: bool
    unmapped: bool
    """The node has GPUs but no rank of this job is tied to one."""
    lost: list[int]
    usable: bool
    spin_all: bool
    spin_strong: bool
    """Every job GPU spinning, utilisation readable, GPUs mapped (not inferred): hang evidence."""
    spin_since: float | None
    working: list[GpuView]
    working_since: float | None
    """Since when some job GPU has been working without a break."""
    waiting: list[GpuView]
    majority_since: float | None
    """Since when most (not all) job GPUs spin while the rest do something else, utilisation readable:
    the asymmetric hang's power signature (None: not that split)."""
    writes: float
    writing: bool
    reads: float
    reading: bool
    train: list[RankView]
    live: list[RankView]
    expired: list[RankView]
    stopped: list[RankView]
    dstate: list[RankView]
    frozen_since: float | None
    frozen_s: float
    first: FirstStep | None
    interval_s: float
    unseen: int
    nvlink_frozen: float | None
    stacks: StackFacts | None = None
    fleet: FleetEvidence | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict rules' answer for one job this cycle."""

    verdict: Verdict
    onset: float | None
    cause: str | None = None
    signals: tuple[str, ...] = ()
    kill_worthy: bool = False
    why_not: str | None = None


def job_facts(
    now: float,
    job: JobView,
    mem: JobMemory,
    by_gpu: dict[int, GpuView],
    telemetry_ok: bool,
    inferred: tuple[GpuView, ...],
    gpu_unknown_since: dict[int, float],
    cfg: DetectorConfig,
) -> JobFacts:
    """Gather one job's facts for this cycle; updates the memory's onsets that need time (idle, not
    computing, working, excused, NVLink, stacks asleep and save seen) on the way."""
    mapped = sorted({r.gpu for r in job.ranks if r.gpu is not None})
    job_gpus = [by_gpu[g] for g in mapped if g in by_gpu]
    gpus_inferred = False
    if not mapped and inferred:
        job_gpus, gpus_inferred = list(inferred), True
    memory.learn_nvlink(now, job_gpus, mem)
    known = [g for g in job_gpus if g.state is not GpuState.UNKNOWN]
    lost = [
        g.gpu
        for g in job_gpus
        if g.gpu in gpu_unknown_since and now - gpu_unknown_since[g.gpu] >= cfg.telemetry_lost_after_s
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
    writes = memory.recent(now, mem.writes, cfg.write_window_s)
    reads = memory.recent(now, mem.reads, cfg.write_window_s)
    train = [r for r in job.ranks if r.phase == "train" and r.step is not None]
    live: list[RankView] = []
    expired: list[RankView] = []
    for r in job.ranks:  # leased ranks, split by their lease (one pass: no rank compared to another)
        if r.phase in LEASED_PHASES and r.lease_until is not None:
            (live if now <= r.lease_until + cfg.lease_grace_s else expired).append(r)
    stopped = [r for r in job.ranks if r.status in STOPPED_STATUSES]
    dstate = [r for r in job.ranks if r.status == "disk-sleep"]
    actives = [  # RankView.active_since() of each, inlined (max of the two that are known)
        sc if ps is None else (ps if sc is None or ps > sc else sc)
        for sc, ps in [(r.step_changed_at, r.phase_since) for r in train]
    ]
    frozen_since = max(a for a in actives if a is not None) if train and None not in actives else None
    if stopped or dstate:
        mem.excused_at = now
    if frozen_since is not None and mem.excused_at is not None:
        frozen_since = max(frozen_since, mem.excused_at)
    frozen_s = max(0.0, now - frozen_since) if frozen_since is not None else 0.0
    firsts = [k for k in (r.first_step() for r in train) if k is not None]
    first = (FirstStep.AFTER_START if FirstStep.AFTER_START in firsts else firsts[0]) if firsts else None
    memory.learn_idle(now, job, mem, job_gpus, usable and not gpus_inferred)
    visible = len({r.rank for r in job.ranks if r.step is not None})
    unseen = max(0, (job.world_size or 0) - visible) if job.has_progress else 0
    stacks, fleet = _fleet(now, job, _stack_facts(now, job, mem, cfg), cfg)
    return JobFacts(
        job_gpus=job_gpus,
        gpus_inferred=gpus_inferred,
        unmapped=not mapped and bool(by_gpu),
        lost=lost,
        usable=usable,
        spin_all=spin_all,
        spin_strong=spin_strong,
        spin_since=spin_since,
        working=working,
        working_since=memory.working_since(now, mem, working),
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
        nvlink_frozen=memory.nvlink_frozen_since(job_gpus, mem),
        stacks=stacks,
        fleet=fleet,
    )


def _fleet(
    now: float, job: JobView, sf: StackFacts | None, cfg: DetectorConfig
) -> tuple[StackFacts | None, FleetEvidence | None]:
    """Other nodes' facts (gpu_triage.signals.fleet.fusion): a complete world completes this node's stack
    facts (the world's odd ranks named); never anything else here."""
    if job.remote is None:
        return sf, None
    world = job.world_size if job.world_size is not None else (sf.world_size if sf is not None else None)
    fleet = fuse(
        now,
        own_node=cfg.fleet_node,
        world_size=world,
        local_ranks=sorted({r.rank for r in job.ranks if r.alive is not False}),
        local_stacks=sf,
        remote=job.remote,
        cfg=cfg.fusion(),
    )
    if fleet.stacks_complete and sf is not None:
        if fleet.split:  # the world is split across nodes: this node's ranks are one side or both
            in_phase = set(sf.pattern.in_phase_collective)
            sf = dataclasses.replace(
                sf,
                complete=True,
                frozen=False,
                frozen_since=None,
                split=True,
                split_ranks=tuple(r for r in sf.pattern.sampled if r in in_phase),
                step_ranks=tuple(r for r in sf.pattern.sampled if r not in in_phase),
                split_since=fleet.frozen_since,
                odd=fleet.odd_ranks(),
            )
        else:
            since = sf.frozen_since if sf.frozen_since is not None else fleet.frozen_since
            sf = dataclasses.replace(
                sf, complete=True, frozen=True, frozen_since=since, odd=fleet.odd_ranks()
            )
    return sf, fleet


def _stack_facts(now: float, job: JobView, mem: JobMemory, cfg: DetectorConfig) -> StackFacts | None:
    alive = [(r.rank, r.cpu_ratio) for r in job.ranks if r.alive is not False and r.pid is not None]
    sf = stack_facts(now, job.stacks, alive, job.world_size, cfg.stacks, mem.asleep_since)
    mem.asleep_since = sf.asleep_since if sf is not None else None
    if sf is not None and sf.in_save and not sf.split:
        mem.save_seen_at = now
    return sf
