"""Requeue a hung Slurm job whose hang blames the node (``[actions] requeue``; docs/actions.md).

A job killed for a hardware fault did nothing wrong: with ``actions.requeue = true`` the SIGTERM rung of
a ``deadlock_confirmed`` whose ``blame`` is ``node`` asks Slurm to put the job back in the queue
(``scontrol requeue <job>``) instead of cancelling it - only when Slurm says the job may be requeued
(``scontrol show job -o <job>`` reports ``Requeue=1``: ``sbatch --requeue`` or ``JobRequeue=1``).
Otherwise, or when ``scontrol requeue`` fails, the rung cancels as it always did (``scancel``), and the
record says why (``requeue_refused``). The job is the one :class:`~gpu_triage.actions.slurm_cancel.
SlurmCanceller` resolved (proven ranks, ``slurmstepd`` or cgroup, ``squeue``'s owner): nothing else
is ever requeued. The node should be drained first (``actions.drain``), or Slurm may start the job
on it again; drains run on the same worker, before the SIGTERM rung.

Slurm stops the requeued job's processes itself; the SIGKILL rung afterwards signals only what is left
of the SIGTERM plan (never ``scancel``, which would cancel the requeued job).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpu_triage.actions.kill_targets import CommandResult, CommandRunner
from gpu_triage.actions.slurm_cancel import find_slurm_binary
from gpu_triage.signals.slurm import SlurmTarget

_REQUEUE = re.compile(r"(?:^|\s)Requeue=(\d)(?:\s|$)")
_RESTARTS = re.compile(r"(?:^|\s)Restarts=(\d{1,9})(?:\s|$)")


def requeue_allowed(show_job: str) -> bool | None:
    """``Requeue=1`` in ``scontrol show job -o`` output: True; ``Requeue=0``: False; absent: None."""
    m = _REQUEUE.search(show_job)
    return None if m is None else m.group(1) == "1"


def restarts(show_job: str) -> int | None:
    """``Restarts=N`` in ``scontrol show job -o`` output (how often Slurm requeued and restarted it)."""
    m = _RESTARTS.search(show_job)
    return None if m is None else int(m.group(1))


@dataclass(frozen=True, slots=True)
class RequeueOutcome:
    """What the requeue attempt did: ``ok`` (requeued), else ``refused`` says why (the rung cancels)."""

    argv: tuple[str, ...]
    result: CommandResult | None
    refused: str | None = None

    @property
    def ok(self) -> bool:
        return self.refused is None and (self.result is None or self.result.ok)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"via": "slurm", "requeue": True, "argv": list(self.argv)}
        if self.result is not None:
            out |= {"returncode": self.result.returncode, "stderr": self.result.stderr[-2000:]}
        return out


def requeue(
    runner: CommandRunner, target: SlurmTarget, *, bin_dir: Path | None, timeout_s: float, dry_run: bool
) -> RequeueOutcome:
    """Requeue ``target``'s job when Slurm allows it (call from the kill worker); ``dry_run``: check,
    run nothing."""
    scontrol = find_slurm_binary("scontrol", bin_dir)
    job = target.identity.job_id
    if scontrol is None:
        return RequeueOutcome((), None, "scontrol not found")
    shown = runner.run([scontrol, "show", "job", "-o", job], timeout_s=timeout_s)
    if not shown.ok:
        why = shown.error or shown.stderr.strip()[:200]
        return RequeueOutcome((), None, f"scontrol show job {job} failed: {why}")
    allowed = requeue_allowed(shown.stdout)
    if not allowed:
        return RequeueOutcome((), None, f"Slurm job {job} is not requeueable (Requeue=0: sbatch --requeue)")
    argv = (scontrol, "requeue", job)
    if dry_run:
        return RequeueOutcome(argv, None)
    result = runner.run(argv, timeout_s=timeout_s)
    if not result.ok:
        why = result.error or result.stderr.strip()[:300]
        return RequeueOutcome(argv, result, f"scontrol requeue {job} failed: {why}")
    return RequeueOutcome(argv, result)


__all__ = ["RequeueOutcome", "requeue", "requeue_allowed", "restarts"]
