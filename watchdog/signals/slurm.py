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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

MAX_ANCESTRY = 6
"""How many parents up a rank's ``slurmstepd`` may be (a launcher and a shell or two sit between)."""
_JOB_ID = re.compile(r"^\d{1,20}$")
_STEP_ID = re.compile(r"^(\d{1,10}|batch|extern|interactive)$")
_CGROUP = re.compile(r"/job_(\d{1,20})(?:/step_([A-Za-z0-9]{1,20}))?(?:/|$)", re.MULTILINE)
_STEPD = re.compile(r"^slurmstepd: \[(\d{1,20})\.([A-Za-z0-9]{1,20})\]")
RANK_PROOFS = frozenset({"rank_env", "gpu_context", "launcher_child"})


# ------------------------------------------------------------------------------------------ pure


@dataclass(frozen=True, slots=True)
class SlurmIdentity:
    """A Slurm job and, where the ranks run inside a numbered step, that step."""

    job_id: str
    step: str | None = None
    """A step number (``srun``), ``batch`` (the batch script and what it starts), or None (unknown)."""

    @property
    def numbered_step(self) -> bool:
        return self.step is not None and self.step.isdigit()

    @property
    def label(self) -> str:
        """``<job>`` or ``<job>.<step>`` for a numbered step (what ``scancel`` and ``sacct`` take)."""
        return f"{self.job_id}.{self.step}" if self.numbered_step else self.job_id


def identity_from_environ(environ: Mapping[str, str]) -> SlurmIdentity | None:
    """The job (and step) the environment names, or None when it names none or a malformed one."""
    job = (environ.get("SLURM_JOB_ID") or "").strip()
    if not _JOB_ID.match(job):
        return None
    step = (environ.get("SLURM_STEP_ID") or "").strip()
    return SlurmIdentity(job, step if _STEP_ID.match(step) else None)


def job_name(environ: Mapping[str, str]) -> str | None:
    """``slurm-<job>`` or ``slurm-<job>.<step>`` (a numbered ``srun`` step), None outside Slurm."""
    ident = identity_from_environ(environ)
    return None if ident is None else f"slurm-{ident.label}"


def identity_from_cgroup(cgroup_text: str | None) -> SlurmIdentity | None:
    """``.../slurm/uid_<u>/job_<id>/step_<s>/...`` (cgroup v1 or v2) -> the job and step."""
    if not cgroup_text:
        return None
    found = _CGROUP.search(cgroup_text)
    if found is None:
        return None
    return SlurmIdentity(found.group(1), found.group(2))


def identity_from_stepd(cmdline: Sequence[str]) -> SlurmIdentity | None:
    """slurmstepd's process title ``slurmstepd: [<job>.<step>]`` -> the job and step."""
    title = " ".join(cmdline)
    found = _STEPD.match(title)
    return SlurmIdentity(found.group(1), found.group(2)) if found else None


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
    import psutil  # here, not at the top: the pure identity rules above are read without it

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
    import psutil

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
