"""Join what the progress files and the process inspector say about each job into the detector's
:class:`~gpu_triage.verdicts.views.JobView` (pure).

Jobs are keyed by name: the progress files' ``job``; the inspector names a process group after the
progress file it joined (with proof) and otherwise after the launcher / environment. Ranks are matched
by rank number, else by pid.

- A rank's GPU comes only from its process (NVML, or its rank environment): a job known from progress
  files alone has *unmapped* GPUs and is reported so - never placed on another job's GPUs by its
  ``local_rank``.
- A progress file whose process was refused by the inspector (:class:`~gpu_triage.signals.processes.
  UntrustedClaim`: no rank environment, no GPU context, no launcher parent, another owner) does not
  speak for the job at all: its rank is left out and the file is listed in the job's ``untrusted``.
- A rank whose file went *silent* (older than ``stale_after_s``) while its process still lives is
  kept, with its last step: a rank hung for longer than the staleness window is exactly the deadlock
  the daemon exists to report. A rank whose process is gone is dropped (the contract's "stale and
  ignored") - unless every process of the job has exited: then their last records stay beside the
  exited processes, so the detector can say how the job ended (``done``, ``gone``, ``killed``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpu_triage.signals.progress_model import JobProgress, RankProgress, StaleReason
from gpu_triage.signals.ranks import RankProcess, UntrustedClaim
from gpu_triage.verdicts.views import JobView, RankView


def _rank_view(rank: int, prog: RankProgress | None, proc: RankProcess | None, fresh_io: bool) -> RankView:
    cpu_ratio = None
    if proc is not None and proc.cpu_time_delta_s is not None and proc.interval_s:
        cpu_ratio = proc.cpu_time_delta_s / proc.interval_s
    rec = prog.record if prog is not None else None  # its fields, not RankProgress's properties
    return RankView(
        rank=rank,
        pid=proc.pid if proc is not None else (rec.pid if rec is not None else None),
        gpu=proc.gpu if proc is not None else None,
        alive=proc.alive if proc is not None else None,
        status=proc.status if proc is not None else None,
        cpu_ratio=cpu_ratio,
        write_bytes_delta=(proc.write_bytes_delta if proc is not None and fresh_io else None),
        read_bytes_delta=(proc.read_bytes_delta if proc is not None and fresh_io else None),
        step=rec.step if rec is not None else None,
        phase=rec.phase if rec is not None else None,
        lease_until=rec.lease_until if rec is not None else None,
        step_changed_at=prog.step_since_s if prog is not None else None,
        phase_since=prog.phase_since_s if prog is not None else None,
        previous_phase=prog.previous_phase if prog is not None else None,
        proven=bool(proc is not None and proc.proof),
    )


def job_views(
    progress: Mapping[str, JobProgress],
    processes: Mapping[str, Sequence[RankProcess]],
    *,
    fresh_io: bool = True,
    untrusted: Sequence[UntrustedClaim] = (),
    untrusted_files: Sequence[Mapping[str, object]] = (),
) -> list[JobView]:
    """One JobView per job seen in either input. ``fresh_io``: the process deltas are new this cycle
    (False on cycles between two inspections, so writes are not counted twice). ``untrusted``: claims
    the inspector refused; ``untrusted_files``: files the reader refused (their owner), each a dict
    with at least ``job``."""
    # Indexed by job once: the cost is linear in claims + jobs, never jobs x claims (another user's
    # thousands of refused files must not slow every job's fusion).
    refused_by_job: dict[str, dict[int, UntrustedClaim]] = {}
    for u in untrusted:
        refused_by_job.setdefault(u.job, {})[u.rank] = u
    files_by_job: dict[str, list[Mapping[str, object]]] = {}
    for f in untrusted_files:
        files_by_job.setdefault(str(f.get("job")), []).append(f)
    out = []
    jobs = set(progress) | set(processes)
    for job in sorted(jobs):
        jp = progress.get(job)
        ranks_prog: dict[int, RankProgress] = {}
        if jp is not None:
            ranks_prog.update(jp.ranks)
            for rank, r in jp.stale.items():
                if r.stale is StaleReason.SILENT and rank not in ranks_prog:
                    ranks_prog[rank] = r
        refused = refused_by_job.get(job, {})
        notes = [u.to_dict() for u in refused.values()]
        notes += [dict(u) for u in files_by_job.get(job, ())]
        for rank in refused:
            ranks_prog.pop(rank, None)
        procs = list(processes.get(job, ()))
        by_rank = {p.rank: p for p in procs if p.rank is not None}
        by_pid = {p.pid: p for p in procs}
        if jp is not None and procs and not any(p.alive for p in procs):
            # every process of the job has exited: keep what its files said last (a rank that
            # announced `done`), so the job reads `done`/`gone`/`killed` until the inspector forgets
            for rank, r in jp.stale.items():
                if r.stale is StaleReason.PID_GONE and rank not in ranks_prog and rank in by_rank:
                    ranks_prog[rank] = r
        views = []
        for rank in sorted(set(ranks_prog) | set(by_rank)):
            prog = ranks_prog.get(rank)
            proc = by_rank.get(rank) or (by_pid.get(prog.record.pid) if prog is not None else None)
            if prog is not None and prog.stale is StaleReason.SILENT and (proc is None or not proc.alive):
                continue
            views.append(_rank_view(rank, prog, proc, fresh_io))
        world = jp.world_size if jp is not None else None
        if world is None:
            sizes = {p.world_size for p in procs if p.world_size is not None}
            world = sizes.pop() if len(sizes) == 1 else None
        if views:
            out.append(
                JobView(
                    job=job,
                    ranks=tuple(views),
                    has_progress=bool(ranks_prog),
                    world_size=world if ranks_prog else None,
                    lease_scope=jp.lease_scope if jp is not None and ranks_prog else None,
                    untrusted=tuple(notes),
                )
            )
    return out
