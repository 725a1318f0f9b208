"""The kill ladder through Slurm: ``scancel`` of the ranks' job (or step) instead of signals.

With ``actions.kill_via = "slurm"`` (or ``"auto"`` when the ranks' job checks out, see below) the
ladder's rungs become:

- **SIGTERM rung**: ``scancel <job>`` (``scancel <job>.<step>`` with ``actions.slurm_cancel =
  "step"`` and ranks inside a numbered ``srun`` step). Slurm then does its own polite stop: SIGCONT
  and SIGTERM to every task, SIGKILL after the cluster's ``KillWait``, the epilog, and ``sacct``
  records the job ``CANCELLED`` - which a plain signal from outside would not (the job would end
  ``FAILED`` or ``COMPLETED``, and a requeue policy could not tell);
- **SIGKILL rung**, ``sigkill_grace_s`` later, only if a process of the SIGTERM plan is still alive:
  ``scancel --signal=KILL --full <job>`` (``--full``: the batch shell too; a step gets
  ``scancel --signal=KILL <job>.<step>``).

**Which job** (:func:`gpu_triage.signals.slurm.judge_slurm_ranks`, then :meth:`SlurmCanceller.resolve`): the
ranks must be proven ranks of the job (the inspector's proof), name one Slurm job in their own
environment, be confirmed by a root-owned ``slurmstepd`` parent or a Slurm cgroup, belong to one user,
and Slurm itself (``squeue``) must report that job running under that same user. Otherwise nothing is
sent through Slurm: with ``kill_via = "slurm"`` the rung records the refusal and does nothing; with
``"auto"`` the ladder signals the proven processes itself, as it does outside Slurm.

Commands run as an argument vector (never a shell) through the engine's runner, under
``capture_timeout_s``; the binaries come from ``actions.slurm_bin_dir`` or ``PATH``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_triage.actions.kill_targets import CommandResult, CommandRunner
from gpu_triage.signals.slurm import (
    SlurmRankFacts,
    SlurmRefusal,
    SlurmTarget,
    judge_slurm_ranks,
    read_facts,
)

KILL_VIA = ("auto", "signal", "slurm")
SLURM_CANCEL = ("job", "step")
FactsReader = Callable[[int, Sequence[str], "int | None"], SlurmRankFacts]


def find_slurm_binary(name: str, bin_dir: Path | None) -> str | None:
    """``bin_dir/name`` when it is executable, else ``name`` on ``PATH`` (None: absent)."""
    if bin_dir is not None:
        path = Path(bin_dir) / name
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(name)


def cancel_id(target: SlurmTarget, cancel: str) -> str:
    """What ``scancel`` gets: the job, or ``<job>.<step>`` for ``cancel = "step"`` in a numbered step."""
    ident = target.identity
    return ident.label if cancel == "step" and ident.numbered_step else ident.job_id


def term_argv(scancel: str, target: SlurmTarget, cancel: str) -> tuple[str, ...]:
    return (scancel, cancel_id(target, cancel))


def kill_argv(scancel: str, target: SlurmTarget, cancel: str) -> tuple[str, ...]:
    ident = cancel_id(target, cancel)
    full = () if "." in ident else ("--full",)
    return (scancel, "--signal=KILL", *full, ident)


def parse_squeue(stdout: str) -> tuple[str, str] | None:
    """``<uid>|<state>`` (``squeue -h -o %U|%T``) -> (uid, state); None when Slurm lists no such job."""
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 2 and parts[0].strip().isdigit():
            return parts[0].strip(), parts[1].strip()
    return None


@dataclass(frozen=True, slots=True)
class SlurmCommand:
    """One ``scancel`` (or a refusal to run one), as the engine records it."""

    argv: tuple[str, ...]
    result: CommandResult | None
    target: SlurmTarget

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"via": "slurm", "argv": list(self.argv), **self.target.to_dict()}
        if self.result is not None:
            out |= {
                "returncode": self.result.returncode,
                "stderr": self.result.stderr[-2000:],
                "duration_s": round(self.result.duration_s, 3),
            }
            if self.result.error:
                out["error"] = self.result.error
        return out


class SlurmCanceller:
    """Resolves the ranks' Slurm job and runs ``scancel``. Call from the kill worker thread."""

    def __init__(
        self,
        runner: CommandRunner,
        *,
        bin_dir: Path | None = None,
        cancel: str = "job",
        timeout_s: float = 30.0,
        facts_reader: FactsReader | None = None,
    ) -> None:
        if cancel not in SLURM_CANCEL:
            raise ValueError(f"cancel: expected one of {', '.join(SLURM_CANCEL)}, got {cancel!r}")
        self.runner = runner
        self.bin_dir = bin_dir
        self.cancel = cancel
        self.timeout_s = timeout_s
        self.read_facts: FactsReader = facts_reader or read_facts

    def resolve(self, ranks: Sequence[tuple[int, Sequence[str], int | None]]) -> SlurmTarget | SlurmRefusal:
        """``ranks``: (pid, proof, uid) of the job's live proven ranks."""
        facts = [self.read_facts(pid, proof, uid) for pid, proof, uid in ranks]
        judged = judge_slurm_ranks(facts)
        if isinstance(judged, SlurmRefusal):
            return judged
        squeue = find_slurm_binary("squeue", self.bin_dir)
        if squeue is None or find_slurm_binary("scancel", self.bin_dir) is None:
            where = self.bin_dir or "PATH"
            return SlurmRefusal(f"squeue/scancel not found in {where}", True)
        job = judged.identity.job_id
        result = self.runner.run([squeue, "-h", "-j", job, "-o", "%U|%T"], timeout_s=self.timeout_s)
        if not result.ok:
            return SlurmRefusal(
                f"squeue -j {job} failed: {result.error or result.stderr.strip()[:200]}", True
            )
        listed = parse_squeue(result.stdout)
        if listed is None:
            return SlurmRefusal(f"Slurm lists no job {job}", True)
        uid, state = listed
        if str(judged.uid) != uid:
            return SlurmRefusal(
                f"Slurm says job {job} belongs to uid {uid}, its ranks to uid {judged.uid}", True
            )
        if state not in ("RUNNING", "SUSPENDED", "COMPLETING"):
            return SlurmRefusal(f"Slurm job {job} is {state}, not running", True)
        return judged

    def terminate(self, target: SlurmTarget, *, dry_run: bool) -> SlurmCommand:
        return self._run(term_argv(self._scancel(), target, self.cancel), target, dry_run)

    def kill(self, target: SlurmTarget, *, dry_run: bool) -> SlurmCommand:
        return self._run(kill_argv(self._scancel(), target, self.cancel), target, dry_run)

    def _scancel(self) -> str:
        return find_slurm_binary("scancel", self.bin_dir) or "scancel"

    def _run(self, argv: tuple[str, ...], target: SlurmTarget, dry_run: bool) -> SlurmCommand:
        if dry_run:
            return SlurmCommand(argv, None, target)
        return SlurmCommand(argv, self.runner.run(argv, timeout_s=self.timeout_s), target)


__all__ = [
    "KILL_VIA",
    "SLURM_CANCEL",
    "SlurmCanceller",
    "SlurmCommand",
    "cancel_id",
    "find_slurm_binary",
    "kill_argv",
    "parse_squeue",
    "term_argv",
]
