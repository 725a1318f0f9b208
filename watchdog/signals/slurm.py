"""Which Slurm job (and step) a rank belongs to, and whether that can be believed enough to cancel it.

A rank started by Slurm carries ``SLURM_JOB_ID`` (and, inside an ``srun`` step, ``SLURM_STEP_ID``;
``SLURM_PROCID``/``SLURM_LOCALID`` are its task numbers) in its environment. The environment belongs
to the job's owner, who can write anything there, so before the daemon asks Slurm to cancel a job it
wants the id confirmed by something the owner cannot forge:

- ``stepd``: a parent of the rank (within :data:`MAX_ANCESTRY` generations) is slurmd's
  ``slurmstepd: [<job>.<step>]``, a process owned by root; this works with every ``ProctrackType``
  (``proctrack/linuxproc`` and ``pgid`` included, which keep no cgroup);
- ``cgroup``: the rank's cgroup path holds ``/job_<id>/`` (``proctrack/cgroup``, written by slurmd).

:func:`judge_slurm_ranks` holds the rules (pure): every rank must be a *proven* rank (a rank
environment, a GPU context or a launcher parent - the same proof :mod:`gpu_triage.signals.processes` asks of a
kill target), every rank must name the same job in its environment, at least one confirmation must
hold for every rank and none may contradict it, and all ranks must belong to one user. Slurm's own
record of the job's owner is checked after that by the canceller
(:mod:`gpu_triage.actions.slurm_cancel`). A job the daemon did not see this way is never cancelled.

:func:`job_name` is how the process inspector names a Slurm job it finds through the environment
(``slurm-<job>``, or ``slurm-<job>.<step>`` inside a numbered step); :func:`read_facts` does the I/O
(``/proc/<pid>/environ``, ``/proc/<pid>/cgroup``, the parent chain).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpu_triage.signals.slurm_identity import (
    SlurmIdentity,
    identity_from_cgroup,
    identity_from_environ,
    identity_from_stepd,
    job_name,
)

MAX_ANCESTRY = 6
"""How many parents up a rank's ``slurmstepd`` may be (a launcher and a shell or two sit between)."""
RANK_PROOFS = frozenset({"rank_env", "gpu_context", "launcher_child"})


# ------------------------------------------------------------------------------------------ pure


@dataclass(frozen=True, slots=True)
class SlurmRankFacts:
    """What the node says about one rank process (gathered by :func:`read_facts`)."""

    pid: int
    uid: int | None
    proof: tuple[str, ...]
    """The inspector's proof that it is a rank (see :class:`gpu_triage.signals.processes.Candidate`)."""
    environ: SlurmIdentity | None
    environ_readable: bool = True
    cgroup: SlurmIdentity | None = None
    stepd: SlurmIdentity | None = None
    """From the nearest root-owned ``slurmstepd`` parent."""


@dataclass(frozen=True, slots=True)
class SlurmTarget:
    """A job (or step) the daemon may ask Slurm to cancel, and why it believes it."""

    identity: SlurmIdentity
    uid: int | None
    pids: tuple[int, ...]
    confirmed_by: tuple[str, ...]
    """Per rank, ``stepd`` and/or ``cgroup``."""

    def to_dict(self) -> dict[str, object]:
        return {
            "slurm_job": self.identity.job_id,
            "slurm_step": self.identity.step,
            "uid": self.uid,
            "pids": list(self.pids),
            "confirmed_by": sorted(set(self.confirmed_by)),
        }


@dataclass(frozen=True, slots=True)
class SlurmRefusal:
    """Why the ranks' job is not cancelled through Slurm. ``slurm_claimed``: some rank named a job."""

    reason: str
    slurm_claimed: bool


def judge_slurm_ranks(facts: Sequence[SlurmRankFacts]) -> SlurmTarget | SlurmRefusal:
    """The job to cancel for these ranks, or why not (the rules are in the module docstring)."""
    if not facts:
        return SlurmRefusal("no rank process", False)
    claimed = any(f.environ is not None for f in facts)
    for f in facts:
        if not set(f.proof) & RANK_PROOFS:
            return SlurmRefusal(
                f"pid {f.pid} is not a proven rank (proof: {', '.join(f.proof) or 'none'})", claimed
            )
        if f.environ is None:
            why = "no readable environment" if not f.environ_readable else "no well-formed SLURM_JOB_ID"
            return SlurmRefusal(f"pid {f.pid}: {why}", claimed)
    jobs = sorted({f.environ.job_id for f in facts if f.environ is not None})
    if len(jobs) > 1:
        return SlurmRefusal(f"the ranks name different Slurm jobs ({', '.join(jobs)})", claimed)
    job = jobs[0]
    confirmed: list[str] = []
    for f in facts:
        got = []
        for source, ident in (("stepd", f.stepd), ("cgroup", f.cgroup)):
            if ident is None:
                continue
            if ident.job_id != job:
                return SlurmRefusal(
                    f"pid {f.pid}: SLURM_JOB_ID={job} but its {source} says job {ident.job_id}", claimed
                )
            got.append(source)
        if not got:
            return SlurmRefusal(
                f"pid {f.pid}: SLURM_JOB_ID={job} is not confirmed (no slurmstepd parent, no Slurm cgroup)",
                claimed,
            )
        confirmed.extend(got)
    uids = {f.uid for f in facts}
    if len(uids) > 1 or None in uids:
        return SlurmRefusal(f"the ranks' owners differ or are unknown ({sorted(map(str, uids))})", claimed)
    steps = {_step_of(f) for f in facts}
    step = steps.pop() if len(steps) == 1 else None
    return SlurmTarget(
        SlurmIdentity(job, step), next(iter(uids)), tuple(f.pid for f in facts), tuple(confirmed)
    )


def _step_of(f: SlurmRankFacts) -> str | None:
    """The step a rank runs in: slurmd's word (stepd, cgroup) over the environment's."""
    for ident in (f.stepd, f.cgroup, f.environ):
        if ident is not None and ident.step is not None:
            return ident.step
    return None


# ------------------------------------------------------------------------------------------- I/O


def read_facts(pid: int, proof: Sequence[str], uid: int | None = None) -> SlurmRankFacts:
    """The Slurm facts of one rank process; a vanished or unreadable process gives empty facts."""
    environ: SlurmIdentity | None = None
    readable = True
    try:
        proc = psutil.Process(pid)
        environ = identity_from_environ(proc.environ())
        if uid is None:
            uid = proc.uids().real
    except (psutil.Error, OSError):
        readable = False
        proc = None
    try:
        cgroup = identity_from_cgroup(Path(f"/proc/{pid}/cgroup").read_text(errors="replace"))
    except OSError:
        cgroup = None
    return SlurmRankFacts(pid, uid, tuple(proof), environ, readable, cgroup, _stepd_parent(proc))


def _stepd_parent(proc: psutil.Process | None) -> SlurmIdentity | None:
    """The identity in the title of the nearest root-owned ``slurmstepd`` among the parents."""
    try:
        current = proc.parent() if proc is not None else None
        for _ in range(MAX_ANCESTRY):
            if current is None or current.pid <= 1:
                return None
            if current.uids().real == 0:
                ident = identity_from_stepd(current.cmdline())
                if ident is not None:
                    return ident
            current = current.parent()
    except (psutil.Error, OSError):
        return None
    return None


__all__ = [
    "MAX_ANCESTRY",
    "SlurmIdentity",
    "SlurmRankFacts",
    "SlurmRefusal",
    "SlurmTarget",
    "identity_from_cgroup",
    "identity_from_environ",
    "identity_from_stepd",
    "job_name",
    "judge_slurm_ranks",
    "read_facts",
]
