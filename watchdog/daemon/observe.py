"""One cycle's observation of the jobs on this node, as the detector reads it: the progress files,
the rank processes (checked against what the files claim), their fusion into JobViews, then each
job's stacks and NCCL RAS facts, the other nodes' facts ([cluster]) and the ranks the kill ladder
signalled; and this node's facts about each judged job, exported for the other nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from gpu_triage.model.names import printable
from gpu_triage.model.samples import GpuSample
from gpu_triage.model.snapshot import GpuStatus, JobStatus
from gpu_triage.model.states import ENDED_VERDICTS, Verdict
from gpu_triage.signals.fleet.facts import NodeJobFacts, local_facts, spin_since_by_gpu
from gpu_triage.signals.fleet.remote import RemoteFacts
from gpu_triage.signals.progress import ProgressView
from gpu_triage.signals.ranks import ProgressClaim, RankProcess
from gpu_triage.signals.stacks.dumps import StackPhase
from gpu_triage.verdicts.fusion import job_views
from gpu_triage.verdicts.views import GpuView, JobView

if TYPE_CHECKING:
    from gpu_triage.daemon.loop import Daemon

_CALM = frozenset({Verdict.HEALTHY, Verdict.CHECKPOINT, *ENDED_VERDICTS})
"""Verdicts that need no urgent look (an ended job is not sampled in a hurry)."""


def observe(
    d: Daemon, now: float, samples: Sequence[GpuSample], statuses: Sequence[GpuStatus]
) -> tuple[list[GpuView], list[JobView]]:
    """What the detector reads this cycle: a view of each GPU and of each job."""
    view = d.progress.read(now, wall_s=d._wall)
    d._progress_errors = tuple(
        {"kind": "progress_file", "where": printable(str(e.path)), "error": printable(e.error)}
        for e in view.errors
    )
    gpu_pids = {s.gpu: list(s.pids) for s in samples if s.pids}
    uuid_to_index = {g.uuid: g.gpu for g in statuses if g.uuid}
    d._process_view = d.inspector.inspect(
        now,
        gpu_pids=gpu_pids,
        claims=progress_claims(view, d.progress.host),
        uuid_to_index=uuid_to_index,
    )
    d.progress.priority = frozenset(
        name.split("@", 1)[0]
        for name, ranks in d._process_view.jobs.items()
        if any(r.alive and r.proof for r in ranks)
    )
    untrusted_files = [u.to_dict() for u in view.untrusted]
    jobs = job_views(
        view.jobs,
        d._process_view.jobs,
        untrusted=d._process_view.untrusted,
        untrusted_files=untrusted_files,
    )
    d._untrusted = tuple([*untrusted_files, *(u.to_dict() for u in d._process_view.untrusted)])
    jobs = with_stacks(d, now, jobs)
    jobs = with_remote(d, now, jobs)
    if d.actions is not None:  # ranks the kill ladder signalled read `killed`, never a new stall
        signalled = d.actions.signalled_pids
        jobs = [replace(j, signalled_pids=signalled(j.job, now)) for j in jobs]
    gviews = [
        GpuView(
            g.gpu,
            g.state,
            g.state_since,
            d.gpus.nvlink_bytes(g.gpu),
            util_known=g.utilization_ratio is not None or g.power_w is None,
        )
        for g in statuses
    ]
    return gviews, jobs


def progress_claims(view: ProgressView, host: str) -> list[ProgressClaim]:
    """What each believed progress file claims about its process (the inspector checks the claim)."""
    claims = []
    for job, jp in view.jobs.items():
        ranks = dict(jp.ranks)
        for rank, r in jp.stale.items():
            ranks.setdefault(rank, r)
        for rank, r in ranks.items():
            rec = r.record
            claims.append(
                ProgressClaim(
                    job, rank, rec.pid, rec.local_rank, host_is_local=rec.host == host, owner_uid=r.owner_uid
                )
            )
    return claims


def with_stacks(d: Daemon, now: float, jobs: list[JobView]) -> list[JobView]:
    """Ask the sampler for dumps of every job's proven live ranks (it decides what is due) and
    hand each job its latest stacks."""
    procs: Mapping[str, tuple[RankProcess, ...]] = d._process_view.jobs if d._process_view is not None else {}
    out = []
    suspicious = False
    for j in jobs:
        pids = {r.rank: r.pid for r in j.ranks if r.proven and r.alive and r.pid is not None}
        sizes = {p.world_size for p in procs.get(j.job, ()) if p.world_size is not None}
        world = j.world_size if j.world_size is not None else (sizes.pop() if len(sizes) == 1 else None)
        prev = d._verdicts.get(j.job)
        d.stacks.request(
            now,
            j.job,
            pids,
            urgent=prev is not None and prev not in _CALM,
            blind=not j.has_progress,
            world_size=world,
        )
        summary = d.stacks.summary(j.job)
        waiting = summary is not None and any(
            s.samples > 1 and s.info.phase is StackPhase.COLLECTIVE for s in summary.ranks.values()
        )
        suspicious = suspicious or waiting or (prev is not None and prev not in _CALM)
        ras = d.ras.facts(set(pids.values()))
        out.append(replace(j, stacks=summary, ras=ras))
    d.stacks.forget({j.job for j in jobs})
    d.ras.request(now, suspicious)
    return out


def with_remote(d: Daemon, now: float, jobs: list[JobView]) -> list[JobView]:
    """[cluster]: hand each job whose world is larger than its ranks here the other nodes' latest
    facts (gpu_triage.signals.fleet), asking Prometheus again - off this thread - while it is
    suspicious."""
    if not d.fleet.enabled:
        return jobs
    out = []
    for j in jobs:
        world = j.world_size if j.world_size is not None else (j.stacks.world_size if j.stacks else None)
        if world is None or world <= len({r.rank for r in j.ranks}):
            out.append(j)
            continue
        prev = d._verdicts.get(j.job)
        d.fleet.request(now, j.job, _waits_in_a_collective(j) or (prev is not None and prev not in _CALM))
        remote = d.fleet.latest(j.job)
        if remote is None:
            remote = RemoteFacts(j.job, now, error="not asked for: the job was never suspicious", asked=False)
        out.append(replace(j, remote=remote))
    d.fleet.forget({j.job for j in jobs})
    return out


def _waits_in_a_collective(j: JobView) -> bool:
    """A rank's stack waits in a collective, whatever its phase: inside a training step, or inside a
    save's or an eval's collective (alone a save here; with another node's facts maybe the split
    deadlock), so the other nodes' facts are worth asking for."""
    return j.stacks is not None and any(
        s.samples > 1 and (s.info.phase is StackPhase.COLLECTIVE or s.info.collective is not None)
        for s in j.stacks.ranks.values()
    )


def node_facts(
    d: Daemon, now: float, jobs: list[JobView], results: tuple[JobStatus, ...], statuses: Sequence[GpuStatus]
) -> tuple[NodeJobFacts, ...]:
    """This node's facts about each job, exported for the other nodes (gpu_watchdog_fleet_*)."""
    spin = spin_since_by_gpu(statuses)
    by_job = {j.job: j for j in results}
    c = d.detector.config
    out = []
    for view in jobs:
        st = by_job.get(view.job)
        if st is None:
            continue
        ev = st.evidence
        world = (
            view.world_size
            if view.world_size is not None
            else (view.stacks.world_size if view.stacks is not None else None)
        )
        out.append(
            local_facts(
                now,
                d.node,
                job=view.job,
                world_size=world,
                ranks=view.ranks,
                stacks=view.stacks,
                verdict=str(st.verdict),
                onset=st.onset,
                kill_worthy=st.kill_worthy,
                writing=ev is not None and ev.bytes_written_recently >= c.write_active_bytes,
                reading=ev is not None and ev.bytes_read_recently >= c.read_active_bytes,
                gpu_spin_since=spin,
                fresh_s=c.stacks.fresh_s,
            )
        )
    return tuple(out)
