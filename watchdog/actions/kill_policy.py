"""Kill coordination on the loop thread: the SIGTERM rung's checks (armed, the deterministic-hang
breaker, evidence still being captured, proven targets of one owner, the kills-per-hour budget persisted in
``actions.kill_times``), the kill's stages, the SIGKILL rung after ``sigkill_grace_s``, and the workers'
outcomes turned into records. What the worker runs is :mod:`gpu_triage.actions.kill_runner`.

A kill outlives a restart of the daemon (``actions.kills_in_progress``): which pids were signalled (the
detector keeps calling them ``killed``, so the dying job never begins a new episode) and, once a SIGTERM
went out by signal, its plan - the restarted daemon sends the SIGKILL rung when its grace runs out, to
the plan's processes whose create time still matches (a reused pid is never signalled)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from gpu_triage.actions.captures import rank_targets
from gpu_triage.actions.config import ActionsConfig
from gpu_triage.actions.episode import KillState
from gpu_triage.actions.kill_runner import KillRunner
from gpu_triage.actions.kill_targets import Identity, KillPlan
from gpu_triage.actions.ladder import sigkill_step
from gpu_triage.actions.records import KV_KILLS, KV_KILLS_IN_PROGRESS, KvState, Records
from gpu_triage.actions.turn import JobTurn
from gpu_triage.actions.worker import HookRun, HookSurvivors, KillDone, OrderedWorker, TermDone
from gpu_triage.alerts.model import rfc3339
from gpu_triage.model.actions import Action, CaptureState, KillStage, Result
from gpu_triage.model.health import Blame
from gpu_triage.model.jsonable import finite_number
from gpu_triage.model.states import Mode

KILL_WINDOW_S = 3600.0
MAX_SAVED_PIDS = 4096
"""Pids kept per saved kill (a job's ranks and their descendants; more is not a training job)."""

log = logging.getLogger(__name__)


def _pids(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, list) or len(value) > MAX_SAVED_PIDS:
        return None
    out = tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool) and v > 1)
    return out if len(out) == len(value) else None


def saved_kill(k: KillState) -> dict[str, Any] | None:
    """What a restarted daemon needs to send ``k``'s SIGKILL rung (None: nothing to continue - a hook,
    Slurm or dry-run kill, or one whose SIGTERM has not gone out)."""
    if k.stage is not KillStage.TERM_SENT or k.hook or k.dry_run or k.slurm is not None:
        return None
    if k.plan is None or k.plan.empty or k.term_time is None:
        return None
    return {
        "term_time": k.term_time,
        "groups": list(k.plan.groups),
        "pids": list(k.plan.pids),
        "members": [[pid, created] for pid, created in sorted(k.plan.members.items())],
    }


def restored_kill(job: str, saved: object) -> KillState | None:
    """The kill ``saved`` describes, waiting for its SIGKILL rung; None for anything malformed."""
    if not isinstance(saved, Mapping):
        return None
    term_time = finite_number(saved.get("term_time"))
    groups, pids = _pids(saved.get("groups")), _pids(saved.get("pids"))
    members_raw = saved.get("members")
    if term_time is None or groups is None or pids is None or not isinstance(members_raw, list):
        return None
    members: dict[int, float | None] = {}
    for entry in members_raw[:MAX_SAVED_PIDS]:
        if not (isinstance(entry, list) and len(entry) == 2 and _pids([entry[0]])):
            return None
        pid, created = entry
        if created is not None and finite_number(created) is None:
            return None
        members[pid] = None if created is None else float(created)
    plan = KillPlan(groups, pids, members)
    if plan.empty:
        return None
    return KillState(job, False, False, KillStage.TERM_SENT, plan=plan, term_time=term_time, resumed=True)


class KillCoordinator:
    """The kills in progress, the budget and which pids were signalled."""

    def __init__(self, *, actions: ActionsConfig, runs: KillRunner, kv: KvState, node: str) -> None:
        self.actions = actions
        self.runs = runs
        self.node = node
        self._kv = kv
        self.worker = OrderedWorker("kill-executor")
        self._kills: dict[str, KillState] = {}
        self._signalled: dict[str, tuple[float, frozenset[int]]] = {}
        """job -> (when, pids) of the last real kill: the detector calls those ranks ``killed``."""
        self._kill_times: list[float] = [
            float(t) for t in kv.get(KV_KILLS, []) if isinstance(t, (int, float))
        ]
        self._saved: Any = None
        self._restore(kv.get(KV_KILLS_IN_PROGRESS, {}))

    def _restore(self, saved: object) -> None:
        """Take over the kills the previous daemon had in progress (see the module's docstring)."""
        if not isinstance(saved, Mapping):
            return
        signalled, kills = saved.get("signalled"), saved.get("kills")
        for job, entry in signalled.items() if isinstance(signalled, Mapping) else ():
            if isinstance(job, str) and isinstance(entry, list) and len(entry) == 2:
                when, pids = finite_number(entry[0]), _pids(entry[1])
                if when is not None and pids is not None:
                    self._signalled[job] = (when, frozenset(pids))
        for job, entry in kills.items() if isinstance(kills, Mapping) else ():
            k = restored_kill(job, entry) if isinstance(job, str) else None
            if k is None:
                log.warning("cannot continue the persisted kill of %r: malformed", str(job)[:200])
                continue
            self._kills[job] = k
            log.warning("continuing the kill of %s: its SIGTERM went out before the restart", job)
        self._saved = {"signalled": saved.get("signalled"), "kills": saved.get("kills")}

    def persist(self, now: float) -> None:
        """Mirror the signalled pids and the kills awaiting their SIGKILL rung to the store."""
        value = {
            "signalled": {job: [when, sorted(pids)] for job, (when, pids) in self._signalled.items()},
            "kills": {job: v for job, k in self._kills.items() if (v := saved_kill(k)) is not None},
        }
        if value != self._saved:
            self._kv.set(KV_KILLS_IN_PROGRESS, value, now)
            self._saved = value

    def signalled_pids(self, job: str, now: float) -> frozenset[int]:
        entry = self._signalled.get(job)
        if entry is None:
            return frozenset()
        if now - entry[0] >= KILL_WINDOW_S:
            del self._signalled[job]
            return frozenset()
        return entry[1]

    # ------------------------------------------------------------------------------ SIGTERM

    def sigterm(self, turn: JobTurn) -> None:
        """The SIGTERM rung is due: start it, or record why not (once per episode and reason)."""
        ep, job, now, mode, procs, records = turn.ep, turn.job, turn.now, turn.mode, turn.procs, turn.records
        a = self.actions
        action = Action.KILL_HOOK if a.kill_hook else Action.SIGTERM
        pids = [t.pid for t in rank_targets(job, procs)]
        if mode is not Mode.KILL:
            if ep.once_only(f"not_armed:{mode}"):
                records.add(now, action, Result.NOT_ARMED, job=job.job, mode=str(mode), pids=pids)
            return
        if ep.repeat:  # the deterministic-hang breaker
            ep.kill_started = True
            records.add(
                now,
                action,
                Result.REFUSED,
                job=job.job,
                pids=pids,
                signature=ep.signature,
                reason="deterministic hang: same signature seen before; not killing again",
            )
            return
        if (
            ep.capture_state is CaptureState.RUNNING
            and ep.capture_started is not None
            and now - ep.capture_started < ep.capture_budget_s
        ):
            if ep.once_only("waiting_for_evidence"):
                records.add(now, action, Result.WAITING_FOR_EVIDENCE, job=job.job, path=ep.capture_path)
            return
        if not pids:
            if ep.once_only("no_targets"):
                records.add(now, action, Result.NO_TARGETS, job=job.job)
            return
        owners = sorted({p.uid for p in procs if p.alive and p.proof}, key=lambda u: (u is None, u or 0))
        if len(owners) > 1:  # one job is one owner: never signal a set that mixes users
            if ep.once_only("mixed_owners"):
                records.add(
                    now,
                    action,
                    Result.REFUSED,
                    job=job.job,
                    pids=pids,
                    reason=f"the job's processes belong to several users (uids {owners}); not killing",
                )
            return
        if not a.dry_run:
            self._kill_times = [t for t in self._kill_times if now - t < KILL_WINDOW_S]
            if len(self._kill_times) >= a.max_kills_per_hour:
                if ep.once_only(f"rate_limited:{len(self._kill_times)}"):
                    records.add(
                        now,
                        action,
                        Result.RATE_LIMITED,
                        job=job.job,
                        pids=pids,
                        limit=a.max_kills_per_hour,
                        kills_in_last_hour=len(self._kill_times),
                    )
                return
            self._kill_times.append(now)
            self._kv.set(KV_KILLS, self._kill_times, now)
        ep.kill_started = True
        if not a.dry_run:
            self._signalled[job.job] = (now, frozenset(pids))
        k = KillState(job.job, bool(a.kill_hook), a.dry_run, KillStage.TERM_RUNNING, alert_key=ep.alert_key)
        k.requeue = a.requeue and job.blame is Blame.NODE  # gpu_triage.actions.requeue
        k.counted_at = None if a.dry_run else now
        self._kills[job.job] = k
        values = {"job": job.job, "node": self.node, "pids": ",".join(map(str, pids))}
        ranks = [(p.pid, p.proof, p.uid) for p in procs if p.alive and p.proof]
        identities = {
            p.pid: Identity(p.create_time, p.uid) for p in procs if p.alive and p.proof and p.pid in pids
        }
        self.worker.submit(lambda: self.runs.term(k, pids, values, ranks, identities))
        records.add(now, action, Result.STARTED, job=job.job, pids=pids, dry_run=a.dry_run)
        self.persist(now)

    # ------------------------------------------------------------------------------ SIGKILL

    def progress(self, now: float, mode: Mode, records: Records) -> None:
        """Drop finished kills; start the SIGKILL rung of those whose grace ran out."""
        for k in list(self._kills.values()):
            if k.stage is KillStage.DONE:
                del self._kills[k.job]
                continue
            step = sigkill_step(k.term_time, self.actions)
            if k.stage is not KillStage.TERM_SENT or step is None or not step.is_due(now):
                continue
            if not k.hook and not k.dry_run and mode is not Mode.KILL:
                k.stage = KillStage.DONE
                records.add(now, Action.SIGKILL, Result.DISARMED, job=k.job, mode=str(mode))
                continue
            k.stage = KillStage.KILL_RUNNING
            self.worker.submit(functools.partial(self.runs.kill, k))
        self.persist(now)

    def __bool__(self) -> bool:
        return bool(self._kills)

    # ------------------------------------------------------------------------------ results

    def termed(self, done: TermDone, now: float, records: Records) -> dict[str, Any] | None:
        """The SIGTERM rung came back; returns the note for the job's alert (None: no update)."""
        job, value = done.job, done.outcome
        k = self._kills.get(job)
        if k is None:
            return None
        if isinstance(value, Exception):
            k.stage = KillStage.DONE
            action = Action.KILL_HOOK if k.hook else Action.SIGTERM
            records.add(now, action, Result.ERROR, job=job, error=str(value))
            return None
        if isinstance(value, HookRun):
            info = dict(value.info)
            k.plan, k.term_time = value.plan, now
            k.stage = KillStage.TERM_SENT if info["result"] == Result.OK else KillStage.DONE
            records.add(now, Action.KILL_HOOK, Result(info.pop("result")), job=job, **info)
            return {"hook": info.get("argv"), "at": rfc3339(now)}
        outcome = value
        k.plan, k.term_time = outcome.plan, outcome.time
        if outcome.extra.get("refused") or outcome.extra.get("failed"):
            k.stage = KillStage.DONE  # kill_via "slurm": nothing was sent, nothing else will be
            result = Result.REFUSED if outcome.extra.get("refused") else Result.ERROR
            if k.counted_at in self._kill_times:  # nothing was sent: no kill to count
                self._kill_times.remove(k.counted_at)
                self._kv.set(KV_KILLS, self._kill_times, now)
        elif outcome.plan.empty:
            k.stage = KillStage.DONE
            result = Result.NO_TARGETS
        else:
            k.stage = KillStage.TERM_SENT
            result = Result.DRY_RUN if outcome.dry_run else (Result.OK if outcome.signalled else Result.ERROR)
        action = Action.REQUEUE if outcome.extra.get("requeue") else Action.SIGTERM
        records.add(now, action, result, job=job, **outcome.to_dict())
        self.persist(now)
        return {"sigterm": list(outcome.signalled), "dry_run": outcome.dry_run, "at": rfc3339(now)}

    def killed(self, done: KillDone, now: float, records: Records) -> None:
        """The SIGKILL rung came back."""
        job, value = done.job, done.outcome
        k = self._kills.get(job)
        if k is None:
            return
        k.stage = KillStage.DONE
        if isinstance(value, Exception):
            records.add(now, Action.SIGKILL, Result.ERROR, job=job, error=str(value))
        elif isinstance(value, HookSurvivors):
            survivors = value.survivors
            result = Result.STILL_ALIVE if survivors else Result.GONE
            records.add(now, Action.KILL_HOOK, result, job=job, survivors=survivors)
        else:
            if value.plan.empty:
                result = Result.NOT_NEEDED
            else:
                result = Result.DRY_RUN if value.dry_run else (Result.OK if value.signalled else Result.ERROR)
            resumed = {"resumed": True} if k.resumed else {}
            records.add(now, Action.SIGKILL, result, job=job, **value.to_dict(), **resumed)
        self.persist(now)


__all__ = ["KILL_WINDOW_S", "KillCoordinator"]
