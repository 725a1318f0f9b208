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

import dataclasses
import logging
import math
import os
import queue
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_triage.actions.delivery import Delivery
from gpu_triage.actions.evidence import (
    FLIGHT_RECORDER_WAIT_S,
    PY_SPY_PARALLEL,
    Bundle,
    CaptureRequest,
    EvidenceCapture,
    RankTarget,
    find_nvidia_smi,
    find_py_spy,
    prune_bundles,
    reserve_bundle,
)
from gpu_triage.actions.kill import (
    CommandRunner,
    HookError,
    Identity,
    KillExecutor,
    KillOutcome,
    KillPlan,
    Signaller,
    SubprocessRunner,
    render_hook,
    slurm_job_id,
)
from gpu_triage.actions.silences import SilenceBook
from gpu_triage.actions.slurm_cancel import SlurmCanceller, cancel_id
from gpu_triage.alerts.model import (
    Alert,
    Condition,
    build_alert,
    condition_for,
    gpu_hours,
    hang_signature,
    resolve,
    rfc3339,
)
from gpu_triage.alerts.registry import sink_kind
from gpu_triage.config.settings import ActionsConfig, AlertsConfig
from gpu_triage.journal import logs
from gpu_triage.journal.eventstore import EventStore, StoreError
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.names import printable
from gpu_triage.model.snapshot import GpuStatus, JobStatus
from gpu_triage.model.states import Mode, Verdict
from gpu_triage.signals.nccl_ras import client as ras
from gpu_triage.signals.processes import RankProcess
from gpu_triage.signals.slurm import SlurmRefusal, SlurmTarget

log = logging.getLogger(__name__)

AUTO = "auto"
JOB_GONE_AFTER_S = 30.0
CAPTURE_MIN_INTERVAL_S = 300.0
KILL_WINDOW_S = 3600.0
SAME_HANG_ONSET_TOLERANCE_S = 5.0
MAX_SIGNATURES = 200
KV_ACTIVE = "actions.active_alerts"
KV_KILLS = "actions.kill_times"
KV_SIGNATURES = "actions.hang_signatures"
KV_EPISODES = "actions.episodes"
KV_CAPTURES = "actions.last_capture"
_EPISODE_FIELDS = (
    "first_seen",
    "confirmed_seen",
    "signature",
    "sightings",
    "repeat",
    "capture_state",
    "capture_path",
    "capture_started",
    "capture_budget_s",
    "alert_key",
    "alerted_verdict",
    "kill_started",
)


# --------------------------------------------------------------------------------------------------
# Worker thread


class _OrderedWorker:
    """One daemon thread running submitted callables in order."""

    def __init__(self, name: str) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._busy = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            self._busy += 1
        self._tasks.put(task)

    @property
    def busy(self) -> int:
        with self._lock:
            return self._busy

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            try:
                task()
            except Exception:
                log.exception("action worker task failed")
            finally:
                with self._lock:
                    self._busy -= 1

    def close(self, timeout_s: float) -> None:
        self._tasks.put(None)
        self._thread.join(timeout_s)


# --------------------------------------------------------------------------------------------------
# Per-job state


@dataclass(slots=True)
class _Episode:
    job: str
    condition: Condition
    first_seen: float
    verdict: Verdict
    last: JobStatus
    confirmed_seen: float | None = None
    signature: str | None = None
    sightings: int = 1
    repeat: bool = False
    capture_state: str | None = None
    """None, 'running', 'done' or 'skipped'."""
    capture_path: str | None = None
    capture_started: float | None = None
    capture_budget_s: float = 0.0
    alert_key: str | None = None
    alerted_verdict: str | None = None
    kill_started: bool = False
    gpus: Sequence[GpuStatus] = ()
    once: set[str] = field(default_factory=set)

    @property
    def alert_condition(self) -> Condition:
        return Condition.DETERMINISTIC_HANG if self.repeat else self.condition

    def to_dict(self) -> dict[str, Any]:
        """What a restarted daemon needs to continue this episode (KV_EPISODES)."""
        out: dict[str, Any] = {"condition": str(self.condition), "verdict": str(self.verdict)}
        out |= {name: getattr(self, name) for name in _EPISODE_FIELDS}
        out["once"] = sorted(self.once)
        return out

    @classmethod
    def from_dict(cls, job: str, value: Mapping[str, Any], last: JobStatus) -> _Episode:
        ep = cls(
            job, Condition(value["condition"]), float(value["first_seen"]), Verdict(value["verdict"]), last
        )
        for name in _EPISODE_FIELDS[1:]:
            if name in value:
                setattr(ep, name, value[name])
        ep.sightings = int(ep.sightings)
        ep.once = {str(x) for x in value.get("once") or ()}
        if ep.capture_state == "running":  # it died with the previous daemon: no waiting for it
            ep.capture_state = "interrupted"
        return ep


@dataclass(slots=True)
class _Active:
    alert: Alert
    job: str
    delivered: bool
    """Queued to the sinks (False: the engine had no sink)."""
    last_sent: float


@dataclass(slots=True)
class _Kill:
    job: str
    hook: bool
    dry_run: bool
    stage: str
    """'term_running', 'term_sent', 'kill_running', 'done'."""
    plan: KillPlan | None = None
    term_time: float | None = None
    alert_key: str | None = None
    counted_at: float | None = None
    """Its entry in the kills-per-hour budget (returned when nothing was sent after all)."""
    slurm_refused: str | None = None
    """Why the ranks' claimed Slurm job was not cancelled through Slurm (kill_via "auto" signals)."""
    slurm: SlurmTarget | None = None
    """The Slurm job the SIGTERM rung cancelled (the SIGKILL rung then goes through Slurm too)."""


@dataclass(frozen=True, slots=True)
class _Done:
    """A worker's result, handled on the loop thread."""

    kind: str
    job: str
    value: Any


# --------------------------------------------------------------------------------------------------
# The engine


class ActionEngine:
    """The action ladder. The loop calls :meth:`on_cycle` every cycle and :meth:`close` at shutdown."""

    def __init__(
        self,
        *,
        actions: ActionsConfig,
        alerts: AlertsConfig,
        store: EventStore,
        state_dir: Path,
        node: str,
        runner: CommandRunner | None = None,
        signaller: Signaller | None = None,
        clock: Callable[[], float] = time.time,
        own_pid: int | None = None,
        ras_address: tuple[str, int] = (ras.DEFAULT_HOST, ras.DEFAULT_PORT),
        py_spy: str | None = AUTO,
        nvidia_smi: str | None = AUTO,
        generator_url: str | None = None,
        delivery_poll_interval_s: float = 0.5,
        rng: random.Random | None = None,
        max_bundles: int = 50,
        evidence_retention_s: float | None = None,
        adopt_window_s: float = 300.0,
    ) -> None:
        """``py_spy``/``nvidia_smi``: a path, ``"auto"`` (search PATH and the interpreter's directory)
        or None (absent). ``generator_url`` is sent to Alertmanager as ``generatorURL`` (e.g. the
        daemon's ``/status``). ``adopt_window_s``: how long alerts persisted by a previous daemon wait
        for their condition to come back before they are resolved."""
        self.actions = actions
        self.alerts = alerts
        self.store = store
        self.state_dir = Path(state_dir)
        self.node = node
        self.clock = clock
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self.ras_address = ras_address
        self.py_spy = find_py_spy() if py_spy == AUTO else py_spy
        self.nvidia_smi = find_nvidia_smi() if nvidia_smi == AUTO else nvidia_smi
        self.max_bundles = max_bundles
        self.evidence_retention_s = evidence_retention_s
        self.prune_evidence()  # retention holds across restarts, not only when a capture runs
        self.adopt_window_s = adopt_window_s
        self.runner: CommandRunner = runner or SubprocessRunner()
        self.executor = KillExecutor(signaller, own_pid=self.own_pid)
        self.capturer = EvidenceCapture(self.runner, clock=clock)
        self.delivery = Delivery(
            store,
            alerts,
            clock=clock,
            rng=rng,
            poll_interval_s=delivery_poll_interval_s,
            generator_url=generator_url,
        )
        self._lock = threading.Lock()
        self._counters: Counter[tuple[str, str]] = Counter()
        self._done: queue.SimpleQueue[_Done] = queue.SimpleQueue()
        self._episodes: dict[str, _Episode] = {}
        self._kills: dict[str, _Kill] = {}
        self._signalled: dict[str, tuple[float, frozenset[int]]] = {}
        """job -> (when, pids) of the last real kill: the detector calls those ranks ``killed``."""
        self._absent_since: dict[str, float] = {}
        captures = self._kv_get(KV_CAPTURES, {})
        self._last_capture: dict[str, float] = {
            str(k): float(v)
            for k, v in (captures.items() if isinstance(captures, dict) else ())
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        """The capture rate limit, persisted: a restart does not allow a second bundle for one hang."""
        persisted_episodes = self._kv_get(KV_EPISODES, {})
        self._resumable: dict[str, Mapping[str, Any]] = {
            str(k): v
            for k, v in (persisted_episodes.items() if isinstance(persisted_episodes, dict) else ())
            if isinstance(v, dict)
        }
        """Episodes in progress when the previous daemon stopped: continued when their job comes back
        with the same condition within ``adopt_window_s``, never begun (nor counted) again."""
        self._resume_until: float | None = None
        self._episodes_saved: Any = None
        self._active: dict[str, _Active] = {}
        self._limbo: dict[str, Alert] = {}
        self._limbo_until: float | None = None
        self._next_resend: float | None = None
        self._started = False
        self._closed = False
        self._mode = actions.mode
        self._am_sinks = tuple(s.name for s in alerts.sinks if sink_kind(s.kind).resends_active)
        self._kill_times: list[float] = [
            float(t) for t in self._kv_get(KV_KILLS, []) if isinstance(t, (int, float))
        ]
        signatures = self._kv_get(KV_SIGNATURES, {})
        self._signatures: dict[str, dict[str, Any]] = signatures if isinstance(signatures, dict) else {}
        persisted = self._kv_get(KV_ACTIVE, {})
        for key, value in (persisted if isinstance(persisted, dict) else {}).items():
            try:
                self._limbo[key] = Alert.from_dict(value)
            except (TypeError, ValueError) as e:
                log.warning("dropping unreadable persisted alert %s: %s", key, e)
        self._capture_worker = _OrderedWorker("evidence-capture")
        self._kill_worker = _OrderedWorker("kill-executor")
        self.delivery.start()
        self.sink_problems = self.delivery.problems()
        for problem in self.sink_problems:
            log.error("alert sink misconfigured: %s", problem)

    # ----------------------------------------------------------------------------------- public

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
        return self._capture_worker.busy + self._kill_worker.busy

    def on_cycle(
        self,
        now: float,
        *,
        mode: Mode,
        jobs: Sequence[JobStatus],
        processes: Mapping[str, Sequence[RankProcess]],
        gpus: Sequence[GpuStatus],
        silences: SilenceBook,
        progress_dir: Path | None,
    ) -> list[dict[str, Any]]:
        """Decide and queue this cycle's actions; return the action records (also stored as events)."""
        records: list[dict[str, Any]] = []
        if self._closed:
            return records
        try:
            self._mode = Mode(mode)
            self._cycle(now, self._mode, jobs, processes, gpus, silences, progress_dir, records)
        except Exception as e:
            log.exception("action engine cycle failed")
            records.append(self._make(now, "engine", "error", error=f"{type(e).__name__}: {e}"))
        if records:
            self._commit(records)
        return records

    def signalled_pids(self, job: str, now: float | None = None) -> frozenset[int]:
        """The pids of ``job`` this engine has signalled (SIGTERM, the kill hook, scancel) in the last
        hour, from the moment the SIGTERM rung started; empty for a dry run."""
        entry = self._signalled.get(job)
        if entry is None:
            return frozenset()
        if (self.clock() if now is None else now) - entry[0] >= KILL_WINDOW_S:
            del self._signalled[job]
            return frozenset()
        return entry[1]

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the workers; results that arrive in time are recorded. Undelivered alerts stay in the
        outbox for the next daemon."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        self._capture_worker.close(max(0.0, deadline - time.monotonic()) / 2)
        self._kill_worker.close(max(0.0, deadline - time.monotonic()) / 2)
        self.delivery.close(max(0.1, deadline - time.monotonic()))
        records: list[dict[str, Any]] = []
        self._drain(self.clock(), self._mode, records)
        if records:
            self._commit(records)

    # ------------------------------------------------------------------------------------ cycle

    def _cycle(
        self,
        now: float,
        mode: Mode,
        jobs: Sequence[JobStatus],
        processes: Mapping[str, Sequence[RankProcess]],
        gpus: Sequence[GpuStatus],
        silences: SilenceBook,
        progress_dir: Path | None,
        records: list[dict[str, Any]],
    ) -> None:
        if not self._started:
            self._started = True
            self._resume_until = now + self.adopt_window_s if self._resumable else None
            self._limbo_until = now + self.adopt_window_s if self._limbo else None
            if self._limbo:
                self._next_resend = now
            for problem in self.sink_problems:
                records.append(self._make(now, "alert_sink", "misconfigured", error=problem))
        if not self._done.empty():
            self._drain(now, mode, records)
        seen: set[str] = set()
        for job in jobs:
            seen.add(job.job)
            try:  # an error on one job stays in that job: the others still get their actions
                self._job_cycle(job, now, mode, processes, gpus, silences, progress_dir, records)
            except Exception as e:
                log.exception("action engine failed on job %s", printable(job.job, 200))
                error = f"{type(e).__name__}: {e}"[:300]
                records.append(self._make(now, "engine", "error", job=job.job, error=error))
        if self._absent_since or not seen.issuperset(self._episodes):
            for name in [n for n in self._episodes if n not in seen]:
                since = self._absent_since.setdefault(name, now)
                if now - since >= JOB_GONE_AFTER_S:
                    self._end(self._episodes[name], now, "the job is gone", records)
                    self._absent_since.pop(name, None)
            for name in [n for n in self._absent_since if n not in self._episodes]:
                del self._absent_since[name]
        if self._kills:
            self._progress_kills(now, mode, records)
        if self._next_resend is not None and now >= self._next_resend:
            self._resend(now)
        if self._limbo_until is not None and now >= self._limbo_until:
            self._expire_limbo(now, records)
        if self._resume_until is not None and now >= self._resume_until:
            self._resume_until = None
            self._resumable.clear()
        self._persist_episodes(now)

    def _persist_episodes(self, now: float) -> None:
        value = {name: ep.to_dict() for name, ep in self._episodes.items()}
        value |= {k: dict(v) for k, v in self._resumable.items() if k not in value}
        if value != self._episodes_saved:
            self._kv_set(KV_EPISODES, value, now)
            self._episodes_saved = value

    def _resume(
        self, job: JobStatus, condition: Condition, now: float, records: list[dict[str, Any]]
    ) -> _Episode | None:
        """Continue an episode the previous daemon had in progress (same job, same condition): its
        delays, signature count, capture and kill state carry on; no new sighting is counted."""
        saved = self._resumable.pop(job.job, None)
        if saved is None:
            return None
        try:
            ep = _Episode.from_dict(job.job, saved, job)
        except (KeyError, TypeError, ValueError) as e:
            log.warning("cannot continue the persisted episode of %s: %s", job.job, e)
            return None
        if ep.condition is not condition:
            return None
        if ep.alert_key is not None and ep.alert_key in self._limbo:
            self._active[ep.alert_key] = _Active(self._limbo.pop(ep.alert_key), job.job, True, now)
            records.append(self._make(now, "alert", "adopted", job=job.job, dedup_key=ep.alert_key))
        elif ep.alert_key is not None and ep.alert_key not in self._active:
            ep.alert_key, ep.alerted_verdict = None, None
        records.append(
            self._make(
                now,
                "ladder",
                "resumed",
                job=job.job,
                verdict=str(job.verdict),
                condition=str(condition),
                first_seen=ep.first_seen,
                signature=ep.signature,
                sightings=ep.sightings,
            )
        )
        self._episodes[job.job] = ep
        return ep

    def _job_cycle(
        self,
        job: JobStatus,
        now: float,
        mode: Mode,
        processes: Mapping[str, Sequence[RankProcess]],
        gpus: Sequence[GpuStatus],
        silences: SilenceBook,
        progress_dir: Path | None,
        records: list[dict[str, Any]],
    ) -> None:
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
        self._update(ep, job, now, gpus)
        self._ladder(ep, job, now, mode, processes.get(job.job, ()), gpus, silences, progress_dir, records)

    # -------------------------------------------------------------------------------- episodes

    def _begin(
        self, job: JobStatus, condition: Condition, now: float, records: list[dict[str, Any]]
    ) -> _Episode:
        ep = _Episode(job.job, condition, now, job.verdict, job)
        details: dict[str, Any] = {"condition": str(condition)}
        if condition is Condition.DEADLOCK:
            ep.signature = hang_signature(job)
            if ep.signature is not None:
                ep.sightings = self._sighting(ep.signature, job.onset, now)
                ep.repeat = ep.sightings >= 2
                details |= {"signature": ep.signature, "sightings": ep.sightings}
        for key, alert in list(self._limbo.items()):
            if alert.job == job.job and alert.condition == str(ep.alert_condition):
                del self._limbo[key]
                self._active[key] = _Active(alert, job.job, True, now)
                ep.alert_key, ep.alerted_verdict = key, alert.verdict
                records.append(self._make(now, "alert", "adopted", job=job.job, dedup_key=key))
        records.append(self._make(now, "ladder", "started", job=job.job, verdict=str(job.verdict), **details))
        self._episodes[job.job] = ep
        return ep

    def _update(self, ep: _Episode, job: JobStatus, now: float, gpus: Sequence[GpuStatus]) -> None:
        ep.verdict = job.verdict
        ep.last = job
        ep.gpus = gpus
        if job.verdict == Verdict.DEADLOCK_CONFIRMED and ep.confirmed_seen is None:
            ep.confirmed_seen = now

    def _end(self, ep: _Episode, now: float, reason: str, records: list[dict[str, Any]]) -> None:
        del self._episodes[ep.job]
        if ep.alert_key is not None and ep.alert_key in self._active:
            self._resolve(ep.alert_key, now, reason, records)
        records.append(self._make(now, "ladder", "ended", job=ep.job, reason=reason))

    def _sighting(self, signature: str, onset: float | None, now: float) -> int:
        """Count an episode of ``signature``; the same hang seen again by a restarted daemon (same
        onset) does not count twice."""
        entry = self._signatures.get(signature)
        if (
            entry is not None
            and onset is not None
            and entry.get("onset") is not None
            and abs(float(entry["onset"]) - onset) <= SAME_HANG_ONSET_TOLERANCE_S
        ):
            entry["last_seen"] = now
        else:
            entry = {
                "count": int(entry["count"]) + 1 if entry else 1,
                "onset": onset,
                "first_seen": entry.get("first_seen", now) if entry else now,
                "last_seen": now,
            }
        self._signatures[signature] = entry
        if len(self._signatures) > MAX_SIGNATURES:
            oldest = sorted(self._signatures, key=lambda k: self._signatures[k].get("last_seen") or 0.0)
            for key in oldest[: len(self._signatures) - MAX_SIGNATURES]:
                del self._signatures[key]
        self._kv_set(KV_SIGNATURES, self._signatures, now)
        return int(entry["count"])

    # ---------------------------------------------------------------------------------- ladder

    def _ladder(
        self,
        ep: _Episode,
        job: JobStatus,
        now: float,
        mode: Mode,
        procs: Sequence[RankProcess],
        gpus: Sequence[GpuStatus],
        silences: SilenceBook,
        progress_dir: Path | None,
        records: list[dict[str, Any]],
    ) -> None:
        a = self.actions
        elapsed = now - ep.first_seen
        capture = ep.condition in (Condition.DEADLOCK, Condition.STALLED)
        if capture and ep.capture_state is None and elapsed >= a.capture_after_s:
            self._capture(ep, job, now, mode, procs, gpus, progress_dir, records)
        if mode in (Mode.ALERT, Mode.KILL) and elapsed >= a.alert_after_s:
            self._alert(ep, job, now, mode, gpus, silences, records)
        if (
            ep.condition is Condition.DEADLOCK
            and not ep.kill_started
            and ep.confirmed_seen is not None
            and job.verdict == Verdict.DEADLOCK_CONFIRMED
            and job.kill_worthy
            and now - ep.confirmed_seen >= a.sigterm_after_s
        ):
            self._kill(ep, job, now, mode, procs, gpus, records)

    def _once(self, ep: _Episode, tag: str) -> bool:
        if tag in ep.once:
            return False
        ep.once.add(tag)
        return True

    # ---------------------------------------------------------------------------------- capture

    def _capture(
        self,
        ep: _Episode,
        job: JobStatus,
        now: float,
        mode: Mode,
        procs: Sequence[RankProcess],
        gpus: Sequence[GpuStatus],
        progress_dir: Path | None,
        records: list[dict[str, Any]],
    ) -> None:
        last = self._last_capture.get(job.job)
        if last is not None and now - last < CAPTURE_MIN_INTERVAL_S:
            ep.capture_state = "skipped"
            records.append(
                self._make(
                    now,
                    "capture",
                    "skipped",
                    job=job.job,
                    reason=f"a bundle was captured {now - last:.0f} s ago",
                )
            )
            return
        targets = _targets(job, procs)
        try:
            path = reserve_bundle(self.state_dir, job.job, now)
        except OSError as e:
            ep.capture_state = "skipped"
            records.append(self._make(now, "capture", "error", job=job.job, error=f"evidence directory: {e}"))
            return
        status = {
            "time": now,
            "node": self.node,
            "mode": str(mode),
            "signature": ep.signature,
            "sightings": ep.sightings,
            "job": jsonable(dataclasses.asdict(job)),
            "processes": [jsonable(dataclasses.asdict(p)) for p in procs],
            "gpus": [jsonable(dataclasses.asdict(g)) for g in gpus],
        }
        request = CaptureRequest(
            job=job.job,
            node=self.node,
            verdict=str(job.verdict),
            path=path,
            ranks=targets,
            status=status,
            progress_dir=progress_dir,
            timeout_s=self.actions.capture_timeout_s,
            py_spy=self.py_spy,
            nvidia_smi=self.nvidia_smi,
            ras_host=self.ras_address[0],
            ras_port=self.ras_address[1],
        )
        ep.capture_state, ep.capture_path, ep.capture_started = "running", str(path), now
        rounds = math.ceil(max(1, len(targets)) / PY_SPY_PARALLEL)
        ep.capture_budget_s = self.actions.capture_timeout_s * (rounds + 3) + FLIGHT_RECORDER_WAIT_S + 5.0
        self._last_capture[job.job] = now
        cutoff = now - CAPTURE_MIN_INTERVAL_S
        self._last_capture = {k: t for k, t in self._last_capture.items() if t >= cutoff or k == job.job}
        self._kv_set(KV_CAPTURES, self._last_capture, now)
        self._capture_worker.submit(lambda: self._run_capture(job.job, request))
        records.append(
            self._make(
                now,
                "capture",
                "started",
                job=job.job,
                verdict=str(job.verdict),
                path=str(path),
                pids=[t.pid for t in targets],
            )
        )

    def prune_evidence(self) -> list[Path]:
        """Apply ``evidence.max_bundles`` and ``evidence.retention_days`` to the evidence directory."""
        doomed = prune_bundles(
            self.state_dir,
            max(1, self.max_bundles),
            max_age_s=self.evidence_retention_s,
            now=self.clock(),
        )
        if doomed:
            log.info("evidence retention: removed %d old bundle(s)", len(doomed))
        return doomed

    def _run_capture(self, job: str, request: CaptureRequest) -> None:
        try:
            self.prune_evidence()
            bundle: Bundle | Exception = self.capturer.capture(request)
        except Exception as e:
            log.exception("evidence capture for %s failed", job)
            bundle = e
        self._done.put(_Done("capture", job, (request, bundle)))

    # ------------------------------------------------------------------------------------ alerts

    def _alert(
        self,
        ep: _Episode,
        job: JobStatus,
        now: float,
        mode: Mode,
        gpus: Sequence[GpuStatus],
        silences: SilenceBook,
        records: list[dict[str, Any]],
    ) -> None:
        escalated = (
            ep.alert_key is not None
            and ep.alerted_verdict != str(job.verdict)
            and job.verdict == Verdict.DEADLOCK_CONFIRMED
        )
        if ep.alert_key is not None and not escalated:
            return
        silence = silences.silenced_by({"node": self.node, "job": job.job, "verdict": str(job.verdict)}, now)
        if silence is not None:
            if self._once(ep, f"silenced:{silence.id}:{job.verdict}"):
                records.append(
                    self._make(
                        now,
                        "alert",
                        "silenced",
                        job=job.job,
                        verdict=str(job.verdict),
                        silence=silence.id,
                        comment=silence.comment,
                    )
                )
            return
        alert = self._build(ep, job, now, mode, gpus)
        self._send(alert, ep.job, now, records, "updated" if escalated else "queued")
        ep.alert_key, ep.alerted_verdict = alert.dedup_key, str(job.verdict)

    def _build(
        self,
        ep: _Episode,
        job: JobStatus,
        now: float,
        mode: Mode,
        gpus: Sequence[GpuStatus] = (),
        kill: Mapping[str, Any] | None = None,
    ) -> Alert:
        notes: dict[str, Any] = {"mode": str(mode), "next": self._next_step(ep, mode)}
        if ep.capture_state:
            notes["capture"] = ep.capture_state
        if ep.signature:
            notes |= {"signature": ep.signature, "sightings": ep.sightings}
        if kill:
            notes["kill"] = dict(kill)
        return build_alert(
            job,
            node=self.node,
            condition=ep.alert_condition,
            now=now,
            first_seen=ep.first_seen,
            gpus=gpus,
            runbook_base=self.alerts.runbook_url,
            bundle=ep.capture_path,
            actions=notes,
        )

    def _next_step(self, ep: _Episode, mode: Mode) -> str:
        a = self.actions
        if ep.condition is not Condition.DEADLOCK:
            return "alert only: this verdict never kills"
        if ep.repeat:
            return (
                f"deterministic hang (signature {ep.signature} seen {ep.sightings} times): the watchdog will "
                "NOT kill it; do not restart before the cause is fixed"
            )
        if mode is not Mode.KILL:
            return f"no kill: mode {mode} (arm kill mode to let the watchdog stop the job)"
        how = "run the kill hook" if a.kill_hook else "SIGTERM the job's processes"
        if not a.kill_hook and a.kill_via == "slurm":
            how = "scancel the job through Slurm"
        if a.dry_run:
            how += " (dry run: record only)"
        if ep.confirmed_seen is not None:
            return f"{how} at {rfc3339(ep.confirmed_seen + a.sigterm_after_s)} unless it recovers"
        return f"{how} {a.sigterm_after_s:g} s after the deadlock is confirmed"

    def _send(self, alert: Alert, job: str, now: float, records: list[dict[str, Any]], result: str) -> None:
        queued = self.delivery.enqueue(alert, now)
        self._active[alert.dedup_key] = _Active(alert, job, bool(queued), now)
        if self._next_resend is None and self._am_sinks:
            self._next_resend = now + self.alerts.resend_interval_s
        self._persist_active(now)
        records.append(
            self._make(
                now,
                "alert",
                result if queued else "no_sinks",
                job=job,
                dedup_key=alert.dedup_key,
                condition=alert.condition,
                verdict=alert.verdict,
                severity=alert.severity,
                sinks=queued,
                summary=alert.summary,
                bundle=alert.bundle,
                gpu_hours=alert.gpu_hours,
            )
        )

    def _resolve(self, key: str, now: float, reason: str, records: list[dict[str, Any]]) -> None:
        active = self._active.pop(key)
        resolved = resolve(active.alert, now, reason)
        queued = self.delivery.enqueue(resolved, now) if active.delivered else []
        self._persist_active(now)
        records.append(
            self._make(
                now,
                "resolve",
                "queued" if queued else "no_sinks",
                job=active.job,
                dedup_key=key,
                condition=resolved.condition,
                reason=reason,
                sinks=queued,
            )
        )

    def _resend(self, now: float) -> None:
        """Re-send firing alerts to Alertmanager sinks that have nothing queued for them already."""
        self._next_resend = now + self.alerts.resend_interval_s if (self._active or self._limbo) else None
        if not self._am_sinks:
            self._next_resend = None
            return
        firing = [(a.alert, a.job) for a in self._active.values() if a.delivered] + [
            (alert, alert.job) for alert in self._limbo.values()
        ]
        for alert, _job in firing:
            if alert.dedup_key in self._active:
                alert = dataclasses.replace(
                    alert, time=now, gpu_hours=gpu_hours(len(alert.gpus), alert.starts_at, now)
                )
                self._active[alert.dedup_key].alert = alert
            sinks = [s for s in self._am_sinks if not self.delivery.has_pending(s, alert.dedup_key)]
            if sinks:
                self.delivery.enqueue(alert, now, sinks=sinks)
                with self._lock:
                    self._counters[("alert_resend", "queued")] += 1

    def _expire_limbo(self, now: float, records: list[dict[str, Any]]) -> None:
        self._limbo_until = None
        for key, alert in list(self._limbo.items()):
            del self._limbo[key]
            self._active[key] = _Active(alert, alert.job, True, now)
            self._resolve(key, now, "cleared while the watchdog was restarting", records)

    def _persist_active(self, now: float) -> None:
        value = {k: a.alert.to_dict() for k, a in self._active.items() if a.delivered}
        value |= {k: alert.to_dict() for k, alert in self._limbo.items()}
        self._kv_set(KV_ACTIVE, value, now)

    # -------------------------------------------------------------------------------------- kill

    def _kill(
        self,
        ep: _Episode,
        job: JobStatus,
        now: float,
        mode: Mode,
        procs: Sequence[RankProcess],
        gpus: Sequence[GpuStatus],
        records: list[dict[str, Any]],
    ) -> None:
        a = self.actions
        action = "kill_hook" if a.kill_hook else "sigterm"
        pids = [t.pid for t in _targets(job, procs)]
        if mode is not Mode.KILL:
            if self._once(ep, f"not_armed:{mode}"):
                records.append(self._make(now, action, "not_armed", job=job.job, mode=str(mode), pids=pids))
            return
        if ep.repeat:
            ep.kill_started = True
            records.append(
                self._make(
                    now,
                    action,
                    "refused",
                    job=job.job,
                    pids=pids,
                    signature=ep.signature,
                    reason="deterministic hang: same signature seen before; not killing again",
                )
            )
            return
        if (
            ep.capture_state == "running"
            and ep.capture_started is not None
            and now - ep.capture_started < ep.capture_budget_s
        ):
            if self._once(ep, "waiting_for_evidence"):
                records.append(
                    self._make(now, action, "waiting_for_evidence", job=job.job, path=ep.capture_path)
                )
            return
        if not pids:
            if self._once(ep, "no_targets"):
                records.append(self._make(now, action, "no_targets", job=job.job))
            return
        owners = sorted({p.uid for p in procs if p.alive and p.proof}, key=lambda u: (u is None, u or 0))
        if len(owners) > 1:  # one job is one owner: never signal a set that mixes users
            if self._once(ep, "mixed_owners"):
                records.append(
                    self._make(
                        now,
                        action,
                        "refused",
                        job=job.job,
                        pids=pids,
                        reason=f"the job's processes belong to several users (uids {owners}); not killing",
                    )
                )
            return
        if not a.dry_run:
            self._kill_times = [t for t in self._kill_times if now - t < KILL_WINDOW_S]
            if len(self._kill_times) >= a.max_kills_per_hour:
                if self._once(ep, f"rate_limited:{len(self._kill_times)}"):
                    records.append(
                        self._make(
                            now,
                            action,
                            "rate_limited",
                            job=job.job,
                            pids=pids,
                            limit=a.max_kills_per_hour,
                            kills_in_last_hour=len(self._kill_times),
                        )
                    )
                return
            self._kill_times.append(now)
            self._kv_set(KV_KILLS, self._kill_times, now)
        ep.kill_started = True
        if not a.dry_run:
            self._signalled[job.job] = (now, frozenset(pids))
        k = _Kill(job.job, bool(a.kill_hook), a.dry_run, "term_running", alert_key=ep.alert_key)
        k.counted_at = None if a.dry_run else now
        self._kills[job.job] = k
        values = {"job": job.job, "node": self.node, "pids": ",".join(map(str, pids))}
        ranks = [(p.pid, p.proof, p.uid) for p in procs if p.alive and p.proof]
        identities = {
            p.pid: Identity(p.create_time, p.uid) for p in procs if p.alive and p.proof and p.pid in pids
        }
        self._kill_worker.submit(lambda: self._run_term(k, pids, values, ranks, identities))
        records.append(self._make(now, action, "started", job=job.job, pids=pids, dry_run=a.dry_run))

    def _run_term(
        self,
        k: _Kill,
        pids: list[int],
        values: dict[str, str],
        ranks: Sequence[tuple[int, Sequence[str], int | None]] = (),
        identities: Mapping[int, Identity] | None = None,
    ) -> None:
        try:
            plan = self.executor.plan(pids, identities)
            slurm = None if k.hook or self.actions.kill_via == "signal" else self._slurm_term(k, plan, ranks)
            if slurm is not None:
                outcome: Any = slurm
            elif not k.hook:
                outcome = self.executor.send(plan, signal.SIGTERM, dry_run=k.dry_run, now=self.clock())
                if k.slurm_refused is not None:
                    outcome = dataclasses.replace(outcome, extra={"slurm_refused": k.slurm_refused})
            else:
                outcome = (plan, self._run_hook(plan, pids, values, k.dry_run))
        except Exception as e:
            log.exception("kill of %s failed", k.job)
            outcome = e
        self._done.put(_Done("term", k.job, outcome))

    def _canceller(self) -> SlurmCanceller:
        a = self.actions
        return SlurmCanceller(
            self.runner, bin_dir=a.slurm_bin_dir, cancel=a.slurm_cancel, timeout_s=a.capture_timeout_s
        )

    def _slurm_term(
        self, k: _Kill, plan: KillPlan, ranks: Sequence[tuple[int, Sequence[str], int | None]]
    ) -> KillOutcome | None:
        """The SIGTERM rung through Slurm (``scancel``), or None to signal (``kill_via = "auto"`` and the
        ranks' Slurm job did not check out, or scancel failed). With ``kill_via = "slurm"`` a refusal or a
        failed scancel sends nothing (``sigterm/refused``, ``sigterm/error``)."""
        canceller = self._canceller()
        target = canceller.resolve(ranks)
        if isinstance(target, SlurmRefusal):
            if self.actions.kill_via == "slurm":
                empty = KillPlan((), (), {})
                extra = {"via": "slurm", "refused": target.reason}
                return KillOutcome("SIGTERM", empty, k.dry_run, (), (), self.clock(), extra=extra)
            if target.slurm_claimed:
                k.slurm_refused = target.reason
            return None
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
        return KillOutcome("SIGTERM", plan, k.dry_run, sent, (), self.clock(), extra=cmd.to_dict())

    def _slurm_kill(self, k: _Kill) -> KillOutcome:
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
            return {**info, "result": "error", "error": str(e)}
        info["argv"] = list(argv)
        if dry_run:
            return {**info, "result": "dry_run"}
        result = self.runner.run(argv, timeout_s=self.actions.capture_timeout_s)
        info |= {
            "returncode": result.returncode,
            "stdout": result.stdout[-2000:],
            "stderr": result.stderr[-2000:],
            "duration_s": round(result.duration_s, 3),
        }
        if result.error:
            info["error"] = result.error
        return {**info, "result": "ok" if result.ok else "error"}

    def _run_kill(self, k: _Kill) -> None:
        try:
            assert k.plan is not None
            if k.hook:
                outcome: Any = ("survivors", self.executor.survivors(k.plan))
            elif k.slurm is not None:
                outcome = self._slurm_kill(k)
            else:
                outcome = self.executor.escalate(k.plan, dry_run=k.dry_run, now=self.clock())
        except Exception as e:
            log.exception("SIGKILL of %s failed", k.job)
            outcome = e
        self._done.put(_Done("kill", k.job, outcome))

    def _progress_kills(self, now: float, mode: Mode, records: list[dict[str, Any]]) -> None:
        for k in list(self._kills.values()):
            if k.stage == "done":
                del self._kills[k.job]
                continue
            if (
                k.stage != "term_sent"
                or k.term_time is None
                or now - k.term_time < self.actions.sigkill_grace_s
            ):
                continue
            if not k.hook and not k.dry_run and mode is not Mode.KILL:
                k.stage = "done"
                records.append(self._make(now, "sigkill", "disarmed", job=k.job, mode=str(mode)))
                continue
            k.stage = "kill_running"
            self._kill_worker.submit(lambda k=k: self._run_kill(k))

    # ----------------------------------------------------------------------------- completions

    def _drain(self, now: float, mode: Mode, records: list[dict[str, Any]]) -> None:
        while True:
            try:
                done = self._done.get_nowait()
            except queue.Empty:
                return
            try:
                if done.kind == "capture":
                    self._captured(done.job, *done.value, now, records)
                elif done.kind == "term":
                    self._termed(done.job, done.value, now, mode, records)
                elif done.kind == "kill":
                    self._killed(done.job, done.value, now, records)
            except Exception as e:
                log.exception("handling a %s result failed", done.kind)
                records.append(
                    self._make(now, "engine", "error", job=done.job, error=f"{type(e).__name__}: {e}")
                )

    def _captured(
        self,
        job: str,
        request: CaptureRequest,
        bundle: Bundle | Exception,
        now: float,
        records: list[dict[str, Any]],
    ) -> None:
        ep = self._episodes.get(job)
        if ep is not None and ep.capture_path == str(request.path):
            ep.capture_state = "done"
        if isinstance(bundle, Exception):
            records.append(
                self._make(
                    now,
                    "capture",
                    "error",
                    job=job,
                    path=str(request.path),
                    error=f"{type(bundle).__name__}: {bundle}",
                )
            )
            return
        items = [
            {k: v for k, v in i.to_dict().items() if k in ("name", "status", "rank", "pid", "file", "error")}
            for i in bundle.items
        ]
        payload = {
            "path": str(bundle.path),
            "job": job,
            "node": self.node,
            "verdict": request.verdict,
            "items": items,
            "ok_items": bundle.ok_items,
            "duration_s": round(bundle.duration_s, 3),
        }
        try:
            self.store.append("evidence", payload, time_s=now, job=job)
        except StoreError as e:
            log.warning("cannot index the evidence bundle %s: %s", bundle.path, e)
        records.append(
            self._make(
                now,
                "capture",
                "ok",
                job=job,
                path=str(bundle.path),
                ok_items=bundle.ok_items,
                items=len(items),
                duration_s=round(bundle.duration_s, 3),
            )
        )

    def _termed(self, job: str, value: Any, now: float, mode: Mode, records: list[dict[str, Any]]) -> None:
        k = self._kills.get(job)
        if k is None:
            return
        if isinstance(value, Exception):
            k.stage = "done"
            records.append(
                self._make(now, "kill_hook" if k.hook else "sigterm", "error", job=job, error=str(value))
            )
            return
        if k.hook:
            plan, info = value
            k.plan, k.term_time = plan, now
            k.stage = "term_sent" if info["result"] == "ok" else "done"
            records.append(self._make(now, "kill_hook", info.pop("result"), job=job, **info))
            kill_note: dict[str, Any] = {"hook": info.get("argv"), "at": rfc3339(now)}
        else:
            outcome: KillOutcome = value
            k.plan, k.term_time = outcome.plan, outcome.time
            if outcome.extra.get("refused") or outcome.extra.get("failed"):
                k.stage = "done"  # kill_via "slurm": nothing was sent, nothing else will be
                result = "refused" if outcome.extra.get("refused") else "error"
                if k.counted_at in self._kill_times:  # nothing was sent: no kill to count
                    self._kill_times.remove(k.counted_at)
                    self._kv_set(KV_KILLS, self._kill_times, now)
            elif outcome.plan.empty:
                k.stage = "done"
                result = "no_targets"
            else:
                k.stage = "term_sent"
                result = "dry_run" if outcome.dry_run else ("ok" if outcome.signalled else "error")
            records.append(self._make(now, "sigterm", result, job=job, **outcome.to_dict()))
            kill_note = {"sigterm": list(outcome.signalled), "dry_run": outcome.dry_run, "at": rfc3339(now)}
        self._update_alert_after_kill(job, now, mode, kill_note, records)

    def _killed(self, job: str, value: Any, now: float, records: list[dict[str, Any]]) -> None:
        k = self._kills.get(job)
        if k is None:
            return
        k.stage = "done"
        if isinstance(value, Exception):
            records.append(self._make(now, "sigkill", "error", job=job, error=str(value)))
        elif isinstance(value, tuple):
            survivors = value[1]
            records.append(
                self._make(
                    now, "kill_hook", "still_alive" if survivors else "gone", job=job, survivors=survivors
                )
            )
        else:
            outcome: KillOutcome = value
            if outcome.plan.empty:
                result = "not_needed"
            else:
                result = "dry_run" if outcome.dry_run else ("ok" if outcome.signalled else "error")
            records.append(self._make(now, "sigkill", result, job=job, **outcome.to_dict()))

    def _update_alert_after_kill(
        self, job: str, now: float, mode: Mode, kill: Mapping[str, Any], records: list[dict[str, Any]]
    ) -> None:
        ep = self._episodes.get(job)
        if ep is None or ep.alert_key is None or ep.alert_key not in self._active:
            return
        alert = self._build(ep, ep.last, now, mode, ep.gpus, kill=kill)
        self._send(alert, job, now, records, "updated")

    # ----------------------------------------------------------------------------------- helpers

    def _make(self, now: float, action: str, result: str, **details: Any) -> dict[str, Any]:
        return {"time": now, "node": self.node, "action": action, "result": result, **details}

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

    def _kv_get(self, key: str, default: Any) -> Any:
        try:
            return self.store.kv_get(key, default)
        except (StoreError, ValueError) as e:
            log.warning("cannot read %s from the event store: %s", key, e)
            return default

    def _kv_set(self, key: str, value: Any, now: float) -> None:
        try:
            self.store.kv_set(key, value, now)
        except (StoreError, ValueError) as e:
            log.warning("cannot persist %s: %s", key, e)


def _targets(job: JobStatus, procs: Sequence[RankProcess]) -> tuple[RankTarget, ...]:
    """The job's live rank processes that the inspector tied to it by proof (a rank environment, a GPU
    context, a launcher parent, a progress file whose claim checked out). Never a pid taken from a
    progress file on trust: with no proven process there is nothing to signal."""
    return tuple(RankTarget(p.rank, p.pid, p.gpu) for p in procs if p.alive and p.proof)


__all__ = ["AUTO", "ActionEngine"]
