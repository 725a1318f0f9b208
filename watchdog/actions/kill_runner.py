"""What the kill worker thread runs: the SIGTERM rung (signals, the kill hook, or ``scancel`` for a
Slurm job that checks out, per ``kill_via``) and the SIGKILL rung (signals, or ``scancel
--signal=KILL`` after a Slurm SIGTERM). Each hands a typed result back to the loop thread."""

from __future__ import annotations

import dataclasses
import logging
import queue
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpu_triage.actions.config import ActionsConfig
from gpu_triage.actions.episode import KillState
from gpu_triage.actions.kill_targets import (
    CommandRunner,
    HookError,
    Identity,
    KillExecutor,
    KillOutcome,
    KillPlan,
    render_hook,
    slurm_job_id,
)
from gpu_triage.actions.requeue import requeue
from gpu_triage.actions.slurm_cancel import SlurmCanceller, cancel_id
from gpu_triage.actions.worker import HookRun, HookSurvivors, KillDone, TermDone, WorkerResult
from gpu_triage.model.actions import Result
from gpu_triage.signals.slurm import SlurmRefusal

log = logging.getLogger("gpu_triage.actions.engine")

RankClaim = tuple[int, Sequence[str], int | None]
"""(pid, proof, uid) of a rank process: what Slurm's job check reads."""


class KillRunner:
    """Runs the kill rungs (call from the kill worker thread)."""

    def __init__(
        self,
        *,
        actions: ActionsConfig,
        executor: KillExecutor,
        runner: CommandRunner,
        results: queue.SimpleQueue[WorkerResult],
        clock: Callable[[], float],
    ) -> None:
        self.actions = actions
        self.executor = executor
        self.runner = runner
        self.clock = clock
        self._results = results

    def term(
        self,
        k: KillState,
        pids: list[int],
        values: dict[str, str],
        ranks: Sequence[RankClaim] = (),
        identities: Mapping[int, Identity] | None = None,
    ) -> None:
        """The SIGTERM rung; ``identities``: the (create time, uid) the inspector proved for each pid,
        checked again against the process table when the plan is made."""
        outcome: KillOutcome | HookRun | Exception
        try:
            plan = self.executor.plan(pids, identities)
            slurm = None if k.hook or self.actions.kill_via == "signal" else self._slurm_term(k, plan, ranks)
            if slurm is not None:
                outcome = slurm
            elif not k.hook:
                outcome = self.executor.send(plan, signal.SIGTERM, dry_run=k.dry_run, now=self.clock())
                if k.slurm_refused is not None:
                    outcome = dataclasses.replace(outcome, extra={"slurm_refused": k.slurm_refused})
            else:
                outcome = HookRun(plan, self._run_hook(plan, pids, values, k.dry_run))
        except Exception as e:
            log.exception("kill of %s failed", k.job)
            outcome = e
        self._results.put(TermDone(k.job, outcome))

    def kill(self, k: KillState) -> None:
        outcome: KillOutcome | HookSurvivors | Exception
        try:
            assert k.plan is not None
            if k.hook:
                outcome = HookSurvivors(self.executor.survivors(k.plan))
            elif k.slurm is not None:
                outcome = self._slurm_kill(k)
            else:
                outcome = self.executor.escalate(k.plan, dry_run=k.dry_run, now=self.clock())
        except Exception as e:
            log.exception("SIGKILL of %s failed", k.job)
            outcome = e
        self._results.put(KillDone(k.job, outcome))

    def _canceller(self) -> SlurmCanceller:
        a = self.actions
        return SlurmCanceller(
            self.runner, bin_dir=a.slurm_bin_dir, cancel=a.slurm_cancel, timeout_s=a.capture_timeout_s
        )

    def _slurm_term(self, k: KillState, plan: KillPlan, ranks: Sequence[RankClaim]) -> KillOutcome | None:
        """The SIGTERM rung through Slurm (``scancel``), or None to signal (``kill_via = "auto"`` and the
        ranks' Slurm job did not check out, or scancel failed). With ``kill_via = "slurm"`` a refusal or a
        failed scancel sends nothing (``sigterm/refused``, ``sigterm/error``)."""
        canceller = self._canceller()
        target = canceller.resolve(ranks)
        if isinstance(target, SlurmRefusal):
            if self.actions.kill_via == "slurm":
                empty = KillPlan((), (), {})
                extra: dict[str, Any] = {"via": "slurm", "refused": target.reason}
                return KillOutcome("SIGTERM", empty, k.dry_run, (), (), self.clock(), extra=extra)
            if target.slurm_claimed:
                k.slurm_refused = target.reason
            return None
        if k.requeue:  # a hang blamed on the node: requeue a requeueable job (gpu_triage.actions.requeue)
            rq = requeue(
                self.runner,
                target,
                bin_dir=self.actions.slurm_bin_dir,
                timeout_s=self.actions.capture_timeout_s,
                dry_run=k.dry_run,
            )
            if rq.ok:  # k.slurm stays None: the SIGKILL rung signals survivors, never scancels the job
                sent = () if k.dry_run else (f"slurm-requeue:{target.identity.job_id}",)
                extra = {**target.to_dict(), **rq.to_dict()}
                return KillOutcome("SIGTERM", plan, k.dry_run, sent, (), self.clock(), extra=extra)
            k.requeue_refused = rq.refused
        cmd = canceller.terminate(target, dry_run=k.dry_run)
        if not cmd.ok and not k.dry_run:
            why = cmd.result.error or cmd.result.stderr.strip()[:500] if cmd.result else "not run"
            if self.actions.kill_via == "auto":  # e.g. the daemon's user is no Slurm operator
                k.slurm_refused = f"scancel failed: {why}"
                return None
            extra = {**cmd.to_dict(), "failed": f"scancel failed: {why}"}
            return KillOutcome("SIGTERM", KillPlan((), (), {}), k.dry_run, (), (), self.clock(), extra=extra)
        k.slurm = target  # the SIGKILL rung goes through Slurm too
        sent = (f"slurm:{cancel_id(target, canceller.cancel)}",) if cmd.ok else ()
        refused = {"requeue_refused": k.requeue_refused} if k.requeue_refused else {}
        return KillOutcome("SIGTERM", plan, k.dry_run, sent, (), self.clock(), extra=cmd.to_dict() | refused)

    def _slurm_kill(self, k: KillState) -> KillOutcome:
        """The SIGKILL rung through Slurm: ``scancel --signal=KILL`` only if a process of the SIGTERM
        plan is still alive."""
        assert k.plan is not None and k.slurm is not None
        survivors = self.executor.survivors(k.plan)
        if not survivors:
            return KillOutcome("SIGKILL", KillPlan((), (), {}), k.dry_run, (), (), self.clock())
        canceller = self._canceller()
        cmd = canceller.kill(k.slurm, dry_run=k.dry_run)
        extra = {**cmd.to_dict(), "survivors": survivors}
        if cmd.ok or k.dry_run:
            sent = (f"slurm:{cancel_id(k.slurm, canceller.cancel)}",) if cmd.ok else ()
            return KillOutcome("SIGKILL", k.plan, k.dry_run, sent, (), self.clock(), extra=extra)
        # Slurm refuses to signal a job it is already cancelling (COMPLETING until its KillWait runs
        # out): the survivors of the SIGTERM plan get SIGKILL directly, under the signal ladder's rules.
        why = cmd.result.error or cmd.result.stderr.strip()[:500] if cmd.result else "not run"
        direct = self.executor.escalate(k.plan, dry_run=k.dry_run, now=self.clock())
        return dataclasses.replace(
            direct, errors=(*direct.errors, f"scancel: {why}"), extra={**extra, "fallback": "signal"}
        )

    def _run_hook(
        self, plan: KillPlan, pids: list[int], values: dict[str, str], dry_run: bool
    ) -> dict[str, Any]:
        template = self.actions.kill_hook
        info: dict[str, Any] = {"template": list(template)}
        slurm: str | None = None
        if any("{slurm_job_id}" in arg for arg in template):
            slurm, source = slurm_job_id(pids)
            info["slurm_job_id_source"] = source
        try:
            argv = render_hook(template, {**values, "slurm_job_id": slurm})
        except HookError as e:
            return {**info, "result": Result.ERROR, "error": str(e)}
        info["argv"] = list(argv)
        if dry_run:
            return {**info, "result": Result.DRY_RUN}
        result = self.runner.run(argv, timeout_s=self.actions.capture_timeout_s)
        info |= {
            "returncode": result.returncode,
            "stdout": result.stdout[-2000:],
            "stderr": result.stderr[-2000:],
            "duration_s": round(result.duration_s, 3),
        }
        if result.error:
            info["error"] = result.error
        return {**info, "result": Result.OK if result.ok else Result.ERROR}


__all__ = ["KillRunner", "RankClaim"]
