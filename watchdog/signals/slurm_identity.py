"""Which Slurm job (and step) a process names or sits in, from text alone (pure): its environment
(``SLURM_JOB_ID``/``SLURM_STEP_ID``, a claim), its cgroup path (``/job_<id>/``, written by slurmd) and
slurmstepd's process title. :mod:`gpu_triage.signals.slurm` reads those texts from ``/proc`` and decides
whether a job can be believed enough to cancel; :mod:`gpu_triage.signals.ranks` names Slurm jobs with
:func:`job_name`. Standard library only."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_JOB_ID = re.compile(r"^\d{1,20}$")
_STEP_ID = re.compile(r"^(\d{1,10}|batch|extern|interactive)$")
_CGROUP = re.compile(r"/job_(\d{1,20})(?:/step_([A-Za-z0-9]{1,20}))?(?:/|$)", re.MULTILINE)
_STEPD = re.compile(r"^slurmstepd: \[(\d{1,20})\.([A-Za-z0-9]{1,20})\]")


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
