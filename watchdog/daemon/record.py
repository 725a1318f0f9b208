"""What the daemon writes down: events in the store, verdict changes (event and log line), and the
memory a restarted daemon continues from - the clock timeline, the detector's episodes and the step
marks of the progress files, and the operator's silences (all in the store's key-value table).

:class:`Recorder` owns the store (attached at start; None without one) and what it remembers of
what it wrote: each job's last verdict, the errors persisting them, when the episodes and the
silences were last saved.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpu_triage.actions.silences import SilenceBook
from gpu_triage.journal import logs
from gpu_triage.journal.eventstore import EventStore, StoreError
from gpu_triage.model.clock import ClockStep, Timeline
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.names import printable
from gpu_triage.model.snapshot import JobStatus
from gpu_triage.model.states import Verdict
from gpu_triage.signals.processes import SessionScope

log = logging.getLogger("gpu_watchdog")

SILENCES_KEY = "control.silences"
TIMELINE_KEY = "daemon.timeline"
PROGRESS_KEY = "detector.step_marks"
DETECTOR_KEY = "detector.jobs"
EPISODE_STATE_MAX_AGE_S = 600.0
"""A restarted daemon continues what an earlier one saw at most this long ago (same boot)."""
EPISODE_SAVE_EVERY_S = 5.0
EPISODE_REFRESH_S = 60.0


def boot_id() -> str | None:
    """The kernel's boot id (the monotonic clock restarts with it), None where unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read(64).strip() or None
    except OSError:
        return None


class Memory(Protocol):
    """What keeps episodes across a restart (the step tracker, the detector): export and restore."""

    def export(self) -> Any: ...

    def restore(self, value: Any) -> int: ...


class JobMemories(Memory, Protocol):
    """The detector's job memories: memory whose urgent part (verdicts, onsets, hang clocks) is
    asked for alone every process period."""

    def export_core(self) -> dict[str, tuple[str, float | None, float | None]]: ...


class StepMarks(Memory, Protocol):
    """The progress files' step marks: memory with a version that moves when a mark does."""

    version: int


class Recorder:
    """Events, verdict changes and the memory a restarted daemon continues from."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.clock: Callable[[], float] = timeline.now
        self.store: EventStore | None = None
        self.boot_id = boot_id()
        self._verdicts: dict[str, Verdict] = {}
        self.persist_errors: dict[str, str] = {}
        """Jobs whose verdict change could not be recorded this cycle (input_errors ``persist``)."""
        self._episode_saved: tuple[Any, Any] | None = None
        self._episode_saved_at: float | None = None
        self._silences_saved = 0

    @property
    def verdicts(self) -> Mapping[str, Verdict]:
        """Each job's last recorded verdict."""
        return self._verdicts

    def event(
        self,
        kind: str,
        payload: dict[str, Any],
        now: float | None = None,
        *,
        gpu: int | None = None,
        job: str | None = None,
    ) -> None:
        """One event in the store (none without a store)."""
        if self.store is None:
            return
        clean = jsonable(payload)
        self.store.append(kind, clean, time_s=self.clock() if now is None else now, gpu=gpu, job=job)

    def verdict_changes(self, results: tuple[JobStatus, ...], now: float) -> None:
        """Record each job whose verdict changed this cycle, and each job gone since the last; an error
        while persisting one job's verdict stays in that job (Snapshot.input_errors, logged once)."""
        persist_errors: dict[str, str] = {}
        for j in results:
            prev = self._verdicts.get(j.job)
            if prev is j.verdict:
                continue
            try:
                self.record_verdict(j, prev, now)
            except Exception as e:
                persist_errors[j.job] = f"{type(e).__name__}: {e}"[:300]
            self._verdicts[j.job] = j.verdict
        for job, error in persist_errors.items():
            if self.persist_errors.get(job) != error:
                log.error("could not record the verdict of job %s: %s", printable(job, 200), printable(error))
        self.persist_errors = persist_errors
        for gone in set(self._verdicts) - {j.job for j in results}:
            last = str(self._verdicts.pop(gone))
            self.event("verdict", {"from": last, "to": None, "event": "job_gone"}, now, job=gone)
            logs.EVENTS.verdict(gone, last, None, cause="job_gone")

    def record_verdict(self, j: JobStatus, prev: Verdict | None, now: float) -> None:
        """One verdict change: an event in the store and a line in the event log."""
        signals = list(j.evidence.signals) if j.evidence is not None else []
        ranks = [r.rank for r in j.ranks]
        self.event(
            "verdict",
            {
                "from": str(prev) if prev else None,
                "to": str(j.verdict),
                "onset": j.onset,
                "cause": j.cause,
                "signals": signals,
                "ranks": ranks,
                "blame": str(j.blame),
            },
            now,
            job=j.job,
        )
        logs.EVENTS.verdict(
            j.job,
            str(prev) if prev else None,
            str(j.verdict),
            cause=j.cause,
            signals=list(signals),
            ranks=list(ranks),
            onset=j.onset,
            kill_worthy=j.kill_worthy,
            blame=str(j.blame),
        )

    # -- the clock timeline ---------------------------------------------------------------------------
    def restore_timeline(self) -> bool:
        """Within one boot the timeline continues across restarts (the monotonic clock does): a restarted
        daemon takes the anchor of the first daemon of this boot, so persisted times (kill budget,
        episodes, silences) keep their meaning, and a clock step while it was down is seen as a step.
        True when the timeline was moved onto the earlier anchor."""
        boot = self.boot_id
        saved = self.store.kv_get(TIMELINE_KEY, None) if self.store is not None else None
        if (
            boot is not None
            and isinstance(saved, dict)
            and saved.get("boot_id") == boot
            and isinstance(saved.get("anchor_s"), (int, float))
            and math.isfinite(saved["anchor_s"])
        ):
            self.timeline.anchor_s = float(saved["anchor_s"])
            offset = saved.get("offset_s")
            self.timeline.last_offset_s = float(offset) if isinstance(offset, (int, float)) else 0.0
            self.persist_timeline()
            return True
        self.persist_timeline()
        return False

    def persist_timeline(self) -> None:
        if self.store is None:
            return
        value = {
            "boot_id": boot_id(),
            "anchor_s": self.timeline.anchor_s,
            "offset_s": self.timeline.last_offset_s,
        }
        try:
            self.store.kv_set(TIMELINE_KEY, value, self.clock())
        except StoreError as e:
            log.warning("could not persist the timeline anchor: %s", e)

    def clock_step(self, step: ClockStep) -> None:
        """The wall clock jumped: logged and recorded; no duration moves (they are on the timeline)."""
        log.warning(
            "wall clock stepped %+.1f s against the monotonic clock (wall is now %+.1f s from the daemon's "
            "timeline); durations, leases, budgets and silences are unaffected",
            step.step_s,
            step.offset_s,
        )
        self.event(
            "daemon",
            {"event": "clock_step", "step_s": round(step.step_s, 3), "offset_s": round(step.offset_s, 3)},
            step.timeline_s,
        )
        self.persist_timeline()

    # -- episodes in progress -------------------------------------------------------------------------
    def restore_episodes(self, marks: Memory, detector: Memory, *, scope: SessionScope | None = None) -> None:
        """Episodes survive a restart: what the previous daemon of this boot saw of each job (step marks
        of the progress files, the detector's verdicts, onsets and hang clocks) seeds this one, so a
        hang in progress is neither re-dated nor seen again as a new episode. With a ``scope`` (a
        simulation: its own job only), only the jobs of ranks it holds now (:func:`in_scope`)."""
        if self.store is None:
            return
        boot = self.boot_id
        restored = []
        scoped_jobs: set[str] = set()
        targets: tuple[tuple[str, Any], ...] = ((PROGRESS_KEY, marks), (DETECTOR_KEY, detector))
        for key, target in targets:
            saved = self.store.kv_get(key, None)
            if not isinstance(saved, dict) or boot is None or saved.get("boot_id") != boot:
                continue
            at = saved.get("saved_at")
            if not isinstance(at, (int, float)) or not 0 <= self.clock() - at <= EPISODE_STATE_MAX_AGE_S:
                continue
            value = saved.get("value")
            if scope is not None:
                value, scoped_jobs = in_scope(scope, key, value, scoped_jobs)
            n = target.restore(value)
            if n:
                restored.append(f"{key}={n}")
        if restored:
            log.info("continuing what the previous daemon saw: %s", ", ".join(restored))
            self.event("daemon", {"event": "episodes_restored", "restored": restored})

    def persist_episode_state(self, now: float, marks: StepMarks, detector: JobMemories) -> None:
        """Mirror the step marks and the detector's job memories into the store: at once when a verdict,
        onset or hang clock changed, else at most every EPISODE_SAVE_EVERY_S while marks move."""
        if self.store is None:
            return
        core = detector.export_core()  # the whole export only when it is saved
        version = marks.version
        saved, at = self._episode_saved, self._episode_saved_at
        age = None if at is None else now - at
        recent = age is not None and 0 <= age < EPISODE_REFRESH_S
        if (
            saved is not None
            and saved[1] == core
            and recent
            and (saved[0] == version or (age is not None and age < EPISODE_SAVE_EVERY_S))
        ):
            return
        boot = self.boot_id
        exported = detector.export()
        try:
            self.store.kv_set_many(  # one transaction, one rewrite of the kv mirror (fsync) for both
                {
                    PROGRESS_KEY: {"boot_id": boot, "saved_at": now, "value": marks.export()},
                    DETECTOR_KEY: {"boot_id": boot, "saved_at": now, "value": exported},
                },
                now,
            )
        except StoreError as e:
            log.warning("could not persist the episodes in progress: %s", e)
            return
        self._episode_saved, self._episode_saved_at = (version, core), now

    # -- silences -------------------------------------------------------------------------------------
    def restore_silences(self, book: SilenceBook) -> None:
        """Silences survive a restart (an operator who silenced a known issue must not be paged again)."""
        if self.store is not None:
            restored = book.restore(self.store.kv_get(SILENCES_KEY, []) or [], self.clock())
            if restored:
                self.event("daemon", {"event": "silences_restored", "count": restored})
        self._silences_saved = book.version

    def persist_silences(self, book: SilenceBook, now: float) -> None:
        if self.store is None or book.version == self._silences_saved:
            return
        try:
            self.store.kv_set(SILENCES_KEY, book.export(), now)
            self._silences_saved = book.version
        except StoreError as e:  # a full disk: keep them in memory and try again next cycle
            log.warning("could not persist silences: %s", e)


def in_scope(scope: SessionScope, key: str, value: Any, jobs: set[str]) -> tuple[Any, set[str]]:
    """What a daemon with a process scope (a simulation: its own job only) takes from the saved
    state: the step marks of ranks whose pid is in its scope now, and the detector's memory of the
    jobs those marks belong to (the marks come first). Every other job stays behind."""
    if key == PROGRESS_KEY:
        kept = [
            e
            for e in (value if isinstance(value, list) else ())
            if isinstance(e, dict) and isinstance(e.get("pid"), int) and scope.holds_pid(e["pid"])
        ]
        return kept, {str(e.get("job")) for e in kept}
    if isinstance(value, dict):
        return {job: e for job, e in value.items() if job in jobs}, jobs
    return None, jobs
