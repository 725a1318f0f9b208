"""The ladder: what to do about each job's verdict this cycle (:class:`ActionEngine`).

Per job, while its verdict holds, each rung with its delay from ``[actions]`` (times from when the
engine first saw the verdict; the SIGTERM delay from when it first saw ``deadlock_confirmed``):

1. ``deadlock_suspected`` or ``deadlock_confirmed``: **capture evidence** after ``capture_after_s``
   (every mode; once per episode, and at most once per job every ``CAPTURE_MIN_INTERVAL_S``);
2. **alert** after ``alert_after_s`` (modes ``alert`` and ``kill``; silences suppress it);
3. ``deadlock_confirmed``: **SIGTERM** the job's processes ``sigterm_after_s`` after confirmation (mode
   ``kill`` only; not while the capture is still running, within its time budget; at most
   ``max_kills_per_hour`` over a rolling hour, persisted) - or run ``kill_hook`` instead, or, for a
   Slurm job that checks out (``kill_via``), ``scancel`` it (:mod:`gpu_triage.actions.slurm_cancel`);
4. **SIGKILL** what is still alive ``sigkill_grace_s`` later (still mode ``kill``; through Slurm when
   the SIGTERM rung went through Slurm).

``stalled`` captures evidence and alerts; ``slow``, ``suspended``, ``stalled_checkpoint``,
``data_starvation`` and ``telemetry_lost`` alert (rung 2). None of them ever kills: SIGTERM needs
``deadlock_confirmed`` *and* the job status's ``kill_worthy`` (positive evidence of a hang). When the
verdict clears (``healthy``, ``checkpoint``) or the job has been gone for ``JOB_GONE_AFTER_S``, the
alert is resolved. A hang whose signature (job + the step its ranks froze at)
was seen in an earlier episode is a **deterministic hang**: the alert is the distinct
``deterministic_hang`` page ("do not restart") and no signal is sent.

The engine is a facade over small modules: :mod:`~gpu_triage.actions.ladder` (pure: which rungs are
due), :mod:`~gpu_triage.actions.episode` (per-job state), :mod:`~gpu_triage.actions.captures` (the
capture rung), :mod:`~gpu_triage.actions.alert_book` (pages, resends, resolves, silences),
:mod:`~gpu_triage.actions.kill_policy` and :mod:`~gpu_triage.actions.kill_runner` (the kill rungs),
:mod:`~gpu_triage.actions.worker` (threads and their typed results) and
:mod:`~gpu_triage.actions.records`. Actions and results are the enums of
:mod:`gpu_triage.model.actions`.

Everything slow runs on worker threads: evidence capture (one thread), kills and the kill hook (one
thread), alert delivery (one thread per sink, :mod:`gpu_triage.actions.delivery`). :meth:`on_cycle` only
decides, queues and records; it does not raise (an internal error becomes an ``engine``/``error``
record and a log line). Results of the workers come back as records in a later :meth:`on_cycle`.

Durable state in the event store's kv table: the alerts that are firing (``actions.active_alerts``: a
restarted daemon resolves those that do not come back within ``adopt_window_s``, and adopts those that
do without paging twice), the kill times of the last hour (``actions.kill_times``) and the hang
signatures seen (``actions.hang_signatures``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpu_triage.actions import ladder
from gpu_triage.actions.alert_book import AlertBook
from gpu_triage.actions.captures import CAPTURE_MIN_INTERVAL_S, CaptureScheduler
from gpu_triage.actions.config import EngineConfig
from gpu_triage.actions.delivery import Delivery
from gpu_triage.actions.drain import NodeDrainer
from gpu_triage.actions.episode import Episode, HangSignatures
from gpu_triage.actions.evidence_bundle import EvidenceCapture, find_nvidia_smi
from gpu_triage.actions.interface import Cycle
from gpu_triage.actions.kill_policy import KILL_WINDOW_S, KillCoordinator
from gpu_triage.actions.kill_runner import KillRunner
from gpu_triage.actions.kill_targets import KillExecutor
from gpu_triage.actions.ports import EnginePorts
from gpu_triage.actions.records import KV_EPISODES, KvState, Records
from gpu_triage.actions.turn import JobTurn
from gpu_triage.actions.worker import CaptureDone, KillDone, TermDone, WorkerResult
from gpu_triage.alerts.model import Condition, condition_for, hang_signature
from gpu_triage.journal import logs
from gpu_triage.journal.eventstore import EventStore, StoreError
from gpu_triage.model.actions import Action, Result
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.names import printable
from gpu_triage.model.snapshot import GpuStatus, JobStatus
from gpu_triage.model.states import Mode, Verdict
from gpu_triage.signals.stacks.sampler import find_py_spy
from gpu_triage.verdicts.blame import HARDWARE_BLAMES

log = logging.getLogger(__name__)

JOB_GONE_AFTER_S = 30.0


class ActionEngine:
    """The action ladder. The loop calls :meth:`on_cycle` every cycle and :meth:`close` at shutdown."""

    def __init__(self, config: EngineConfig, store: EventStore, ports: EnginePorts | None = None) -> None:
        """Built from ``config`` (the sections ``[actions]``, ``[evidence]``, ``[alerts]``, ``[ras]``,
        ``[stacks]`` whole, the node and the state directory) and ``ports`` (the runner, signaller,
        clock, random source and own pid; the real ones by default). Its outbox, kill budget and
        episodes live in ``store``."""
        ports = ports or EnginePorts()
        actions, evidence = config.actions, config.evidence
        self.actions = actions
        self.store = store
        self.node = config.node
        self.clock = ports.clock
        self.adopt_window_s = config.adopt_window_s
        kv = KvState(store)
        self._kv = kv
        self._results: queue.SimpleQueue[WorkerResult] = queue.SimpleQueue()
        self._captures = CaptureScheduler(
            capturer=EvidenceCapture(ports.runner, clock=ports.clock),
            store=store,
            kv=kv,
            results=self._results,
            state_dir=Path(config.state_dir),
            node=config.node,
            timeout_s=actions.capture_timeout_s,
            py_spy=find_py_spy(config.stacks.py_spy),
            nvidia_smi=find_nvidia_smi(),
            ras_address=(config.ras.host, config.ras.port),
            max_bundles=evidence.max_bundles,
            retention_s=evidence.retention_days * 86400.0,
            clock=ports.clock,
        )
        self.prune_evidence()  # retention holds across restarts, not only when a capture runs
        executor = KillExecutor(ports.signaller, own_pid=ports.own_pid)
        runs = KillRunner(
            actions=actions, executor=executor, runner=ports.runner, results=self._results, clock=ports.clock
        )
        self._kills = KillCoordinator(actions=actions, runs=runs, kv=kv, node=config.node)
        # Drains run on the kill worker: one ordered thread, so a drain goes before the job's requeue.
        self._drainer = NodeDrainer(
            actions=actions, runner=ports.runner, kv=kv, node=config.node, submit=self._kills.worker.submit
        )
        self.delivery = Delivery(
            store,
            config.alerts,
            clock=ports.clock,
            rng=ports.rng,
            poll_interval_s=config.delivery_poll_interval_s,
            generator_url=config.generator_url,
        )
        self._lock = threading.Lock()
        self._counters: Counter[tuple[str, str]] = Counter()
        self._alerts = AlertBook(
            delivery=self.delivery,
            alerts=config.alerts,
            actions=actions,
            kv=kv,
            node=config.node,
            count=self._count,
        )
        self._signatures = HangSignatures(kv)
        self._episodes: dict[str, Episode] = {}
        self._absent_since: dict[str, float] = {}
        persisted_episodes = kv.get(KV_EPISODES, {})
        self._resumable: dict[str, Mapping[str, Any]] = {
            str(k): v
            for k, v in (persisted_episodes.items() if isinstance(persisted_episodes, dict) else ())
            if isinstance(v, dict)
        }
        """Episodes in progress when the previous daemon stopped: continued when their job comes back
        with the same condition within ``adopt_window_s``, never begun (nor counted) again."""
        self._resume_until: float | None = None
        self._episodes_saved: Any = None
        self._started = False
        self._closed = False
        self._mode = actions.mode
        self.delivery.start()
        self.sink_problems = self.delivery.problems()
        for problem in self.sink_problems:
            log.error("alert sink misconfigured: %s", problem)

    # ----------------------------------------------------------------------------------- public

    @property
    def evidence_capture(self) -> CaptureScheduler:
        """The capture rung: what its bundles are made with (``py_spy``, ``ras_address``,
        ``timeout_s``, ``max_bundles``, ``retention_s``, ``state_dir``, ``node``)."""
        return self._captures

    @property
    def counters(self) -> dict[tuple[str, str], int]:
        """(action, result) -> count since start, alert deliveries included."""
        with self._lock:
            merged = Counter(self._counters)
        merged.update(self.delivery.counters())
        return dict(merged)

    @property
    def busy(self) -> int:
        """Evidence captures and kill stages queued or running on the worker threads."""
        return self._captures.worker.busy + self._kills.worker.busy

    def on_cycle(self, cycle: Cycle) -> list[dict[str, Any]]:
        """Decide and queue this cycle's actions; return the action records (also stored as events).
        ``cycle.node_health`` (the node's hardware health this cycle) drives drains
        (:mod:`gpu_triage.actions.drain`)."""
        records = Records(self.node)
        if self._closed:
            return records.items
        try:
            self._mode = Mode(cycle.mode)
            self._drainer.on_cycle(cycle.now, self._mode, cycle.jobs, cycle.node_health, records)
            self._cycle(cycle, records)
        except Exception as e:
            log.exception("action engine cycle failed")
            records.add(cycle.now, Action.ENGINE, Result.ERROR, error=f"{type(e).__name__}: {e}")
        if records:
            self._commit(records.items)
        return records.items

    def signalled_pids(self, job: str, now: float | None = None) -> frozenset[int]:
        """The pids of ``job`` this engine has signalled (SIGTERM, the kill hook, scancel) in the last
        hour, from the moment the SIGTERM rung started; empty for a dry run."""
        return self._kills.signalled_pids(job, self.clock() if now is None else now)

    def prune_evidence(self) -> list[Path]:
        """Apply ``evidence.max_bundles`` and ``evidence.retention_days`` to the evidence directory."""
        return self._captures.prune()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the workers; results that arrive in time are recorded. Undelivered alerts stay in the
        outbox for the next daemon."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        self._captures.worker.close(max(0.0, deadline - time.monotonic()) / 2)
        self._kills.worker.close(max(0.0, deadline - time.monotonic()) / 2)
        self.delivery.close(max(0.1, deadline - time.monotonic()))
        records = Records(self.node)
        self._drain(self.clock(), self._mode, records)
        self._drainer.collect(self.clock(), records)
        if records:
            self._commit(records.items)

    # ------------------------------------------------------------------------------------ cycle

    def _cycle(self, cycle: Cycle, records: Records) -> None:
        now, mode = cycle.now, self._mode
        if not self._started:
            self._started = True
            self._resume_until = now + self.adopt_window_s if self._resumable else None
            self._alerts.start(now, self.adopt_window_s)
            for problem in self.sink_problems:
                records.add(now, Action.ALERT_SINK, Result.MISCONFIGURED, error=problem)
        if not self._results.empty():
            self._drain(now, mode, records)
        seen: set[str] = set()
        for job in cycle.jobs:
            seen.add(job.job)
            try:  # an error on one job stays in that job: the others still get their actions
                self._job_cycle(cycle, job, records)
            except Exception as e:
                log.exception("action engine failed on job %s", printable(job.job, 200))
                error = f"{type(e).__name__}: {e}"[:300]
                records.add(now, Action.ENGINE, Result.ERROR, job=job.job, error=error)
        if self._absent_since or not seen.issuperset(self._episodes):
            for name in [n for n in self._episodes if n not in seen]:
                since = self._absent_since.setdefault(name, now)
                if now - since >= JOB_GONE_AFTER_S:
                    self._end(self._episodes[name], now, "the job is gone", records)
                    self._absent_since.pop(name, None)
            for name in [n for n in self._absent_since if n not in self._episodes]:
                del self._absent_since[name]
        if self._kills:
            self._kills.progress(now, mode, records)
        self._alerts.tick(now, records)
        if self._resume_until is not None and now >= self._resume_until:
            self._resume_until = None
            self._resumable.clear()
        self._persist_episodes(now)

    def _job_cycle(self, cycle: Cycle, job: JobStatus, records: Records) -> None:
        now = cycle.now
        condition = condition_for(job.verdict)
        ep = self._episodes.get(job.job)
        if ep is None and condition is None:
            return
        self._absent_since.pop(job.job, None)
        if ep is not None and ep.condition is not condition:
            self._end(ep, now, f"verdict is now {job.verdict}", records)
            ep = None
        if condition is None:
            return
        if ep is None:
            ep = self._resume(job, condition, now, records) or self._begin(job, condition, now, records)
        self._update(ep, job, now, cycle.gpus)
        self._ladder(JobTurn(cycle, ep, job, cycle.processes.get(job.job, ()), records))

    def _ladder(self, turn: JobTurn) -> None:
        """Run the episode's due rungs (:func:`gpu_triage.actions.ladder.episode_steps`)."""
        for step in ladder.due(ladder.episode_steps(turn.ep, turn.job, turn.mode, self.actions), turn.now):
            if isinstance(step, ladder.Capture):
                self._captures.capture(turn)
            elif isinstance(step, ladder.AlertStep):
                self._alerts.page(turn, step.escalation)
            elif isinstance(step, ladder.Sigterm):
                self._kills.sigterm(turn)

    def _persist_episodes(self, now: float) -> None:
        value = {name: ep.to_dict() for name, ep in self._episodes.items()}
        value |= {k: dict(v) for k, v in self._resumable.items() if k not in value}
        if value != self._episodes_saved:
            self._kv.set(KV_EPISODES, value, now)
            self._episodes_saved = value

    # -------------------------------------------------------------------------------- episodes

    def _resume(self, job: JobStatus, condition: Condition, now: float, records: Records) -> Episode | None:
        """Continue an episode the previous daemon had in progress (same job, same condition): its
        delays, signature count, capture and kill state carry on; no new sighting is counted."""
        saved = self._resumable.pop(job.job, None)
        if saved is None:
            return None
        try:
            ep = Episode.from_dict(job.job, saved, job)
        except (KeyError, TypeError, ValueError) as e:
            log.warning("cannot continue the persisted episode of %s: %s", job.job, e)
            return None
        if ep.condition is not condition:
            return None
        self._alerts.adopt_resumed(ep, now, records)
        records.add(
            now,
            Action.LADDER,
            Result.RESUMED,
            job=job.job,
            verdict=str(job.verdict),
            condition=str(condition),
            first_seen=ep.first_seen,
            signature=ep.signature,
            sightings=ep.sightings,
        )
        self._episodes[job.job] = ep
        return ep

    def _begin(self, job: JobStatus, condition: Condition, now: float, records: Records) -> Episode:
        ep = Episode(job.job, condition, now, job.verdict, job)
        details: dict[str, Any] = {"condition": str(condition)}
        if condition is Condition.DEADLOCK:
            ep.signature = hang_signature(job)
            if ep.signature is not None:
                ep.sightings = self._signatures.sighting(ep.signature, job.onset, now)
                ep.repeat = ep.sightings >= 2
                details |= {"signature": ep.signature, "sightings": ep.sightings}
            self._hardware_hang(ep, job, now)
        self._alerts.adopt_matching(ep, now, records)
        records.add(now, Action.LADDER, Result.STARTED, job=job.job, verdict=str(job.verdict), **details)
        self._episodes[job.job] = ep
        return ep

    def _hardware_hang(self, ep: Episode, job: JobStatus, now: float) -> None:
        """A hang blamed on the hardware (node or network) is never counted as the job's: its sighting
        is withdrawn and the deterministic-hang breaker does not fire for it (docs/actions.md)."""
        if ep.condition is not Condition.DEADLOCK or ep.hardware or job.blame not in HARDWARE_BLAMES:
            return
        ep.hardware, ep.repeat = True, False
        if ep.signature is not None:
            self._signatures.withdraw(ep.signature, now)

    def _update(self, ep: Episode, job: JobStatus, now: float, gpus: Sequence[GpuStatus]) -> None:
        ep.verdict = job.verdict
        ep.last = job
        ep.gpus = gpus
        self._hardware_hang(ep, job, now)
        if job.verdict == Verdict.DEADLOCK_CONFIRMED and ep.confirmed_seen is None:
            ep.confirmed_seen = now

    def _end(self, ep: Episode, now: float, reason: str, records: Records) -> None:
        del self._episodes[ep.job]
        self._alerts.resolve_episode(ep, now, reason, records)
        records.add(now, Action.LADDER, Result.ENDED, job=ep.job, reason=reason)

    # ----------------------------------------------------------------------------- completions

    def _drain(self, now: float, mode: Mode, records: Records) -> None:
        while True:
            try:
                done = self._results.get_nowait()
            except queue.Empty:
                return
            try:
                if isinstance(done, CaptureDone):
                    self._captures.done(done, self._episodes.get(done.job), now, records)
                elif isinstance(done, TermDone):
                    note = self._kills.termed(done, now, records)
                    if note is not None:
                        self._alerts.update_after_kill(self._episodes.get(done.job), now, mode, note, records)
                elif isinstance(done, KillDone):
                    self._kills.killed(done, now, records)
            except Exception as e:
                log.exception("handling a %s result failed", type(done).__name__)
                records.add(now, Action.ENGINE, Result.ERROR, job=done.job, error=f"{type(e).__name__}: {e}")

    # ----------------------------------------------------------------------------------- helpers

    def _count(self, action: Action, result: Result) -> None:
        with self._lock:
            self._counters[(action.value, result.value)] += 1

    def _commit(self, records: list[dict[str, Any]]) -> None:
        with self._lock:
            for r in records:
                self._counters[(r["action"], r["result"])] += 1
        for r in records:
            logs.EVENTS.action(r)  # evidence, kill and refusal lines (gpu_triage.journal.logs)
            try:
                self.store.append("action", jsonable(r), time_s=r["time"], job=r.get("job"))
            except StoreError as e:
                log.warning("cannot record action %s/%s: %s", r["action"], r["result"], e)


__all__ = ["CAPTURE_MIN_INTERVAL_S", "JOB_GONE_AFTER_S", "KILL_WINDOW_S", "ActionEngine"]
