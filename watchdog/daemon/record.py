"""What the daemon writes down: events in the store, verdict changes (event and log line), and the
memory a restarted daemon continues from - the clock timeline, the detector's episodes and the step
marks of the progress files, and the operator's silences (all in the store's key-value table)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from gpu_triage.daemon.build import boot_id
from gpu_triage.journal import logs
from gpu_triage.journal.eventstore import StoreError
from gpu_triage.model.clock import ClockStep
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.names import printable
from gpu_triage.model.snapshot import JobStatus
from gpu_triage.model.states import Verdict

if TYPE_CHECKING:
    from gpu_triage.daemon.loop import Daemon

log = logging.getLogger("gpu_watchdog")

SILENCES_KEY = "control.silences"
TIMELINE_KEY = "daemon.timeline"
PROGRESS_KEY = "detector.step_marks"
DETECTOR_KEY = "detector.jobs"
EPISODE_STATE_MAX_AGE_S = 600.0
"""A restarted daemon continues what an earlier one saw at most this long ago (same boot)."""
EPISODE_SAVE_EVERY_S = 5.0
EPISODE_REFRESH_S = 60.0


def event(
    d: Daemon,
    kind: str,
    payload: dict[str, Any],
    now: float | None = None,
    *,
    gpu: int | None = None,
    job: str | None = None,
) -> None:
    """One event in the store (none without a store)."""
    if d.store is None:
        return
    clean = jsonable(payload)
    d.store.append(kind, clean, time_s=d.clock() if now is None else now, gpu=gpu, job=job)


def verdict_changes(d: Daemon, results: tuple[JobStatus, ...], now: float) -> None:
    """Record each job whose verdict changed this cycle, and each job gone since the last; an error
    while persisting one job's verdict stays in that job (Snapshot.input_errors, logged once)."""
    persist_errors: dict[str, str] = {}
    for j in results:
        prev = d._verdicts.get(j.job)
        if prev is j.verdict:
            continue
        try:
            record_verdict(d, j, prev, now)
        except Exception as e:
            persist_errors[j.job] = f"{type(e).__name__}: {e}"[:300]
        d._verdicts[j.job] = j.verdict
    for job, error in persist_errors.items():
        if d._persist_errors.get(job) != error:
            log.error("could not record the verdict of job %s: %s", printable(job, 200), printable(error))
    d._persist_errors = persist_errors
    for gone in set(d._verdicts) - {j.job for j in results}:
        last = str(d._verdicts.pop(gone))
        event(d, "verdict", {"from": last, "to": None, "event": "job_gone"}, now, job=gone)
        logs.EVENTS.verdict(gone, last, None, cause="job_gone")


def record_verdict(d: Daemon, j: JobStatus, prev: Verdict | None, now: float) -> None:
    """One verdict change: an event in the store and a line in the event log."""
    signals = list(j.evidence.signals) if j.evidence is not None else []
    ranks = [r.rank for r in j.ranks]
    event(
        d,
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
def restore_timeline(d: Daemon) -> None:
    """Within one boot the timeline continues across restarts (the monotonic clock does): a restarted
    daemon takes the anchor of the first daemon of this boot, so persisted times (kill budget,
    episodes, silences) keep their meaning, and a clock step while it was down is seen as a step."""
    boot = d._boot_id
    saved = d.store.kv_get(TIMELINE_KEY, None) if d.store is not None else None
    if (
        boot is not None
        and isinstance(saved, dict)
        and saved.get("boot_id") == boot
        and isinstance(saved.get("anchor_s"), (int, float))
        and math.isfinite(saved["anchor_s"])
    ):
        d.timeline.anchor_s = float(saved["anchor_s"])
        offset = saved.get("offset_s")
        d.timeline.last_offset_s = float(offset) if isinstance(offset, (int, float)) else 0.0
        d.started_at = d.clock()
    persist_timeline(d)


def persist_timeline(d: Daemon) -> None:
    if d.store is None:
        return
    value = {
        "boot_id": boot_id(),
        "anchor_s": d.timeline.anchor_s,
        "offset_s": d.timeline.last_offset_s,
    }
    try:
        d.store.kv_set(TIMELINE_KEY, value, d.clock())
    except StoreError as e:
        log.warning("could not persist the timeline anchor: %s", e)


def clock_step(d: Daemon, step: ClockStep) -> None:
    """The wall clock jumped: logged and recorded; no duration moves (they are on the timeline)."""
    log.warning(
        "wall clock stepped %+.1f s against the monotonic clock (wall is now %+.1f s from the daemon's "
        "timeline); durations, leases, budgets and silences are unaffected",
        step.step_s,
        step.offset_s,
    )
    event(
        d,
        "daemon",
        {"event": "clock_step", "step_s": round(step.step_s, 3), "offset_s": round(step.offset_s, 3)},
        step.timeline_s,
    )
    persist_timeline(d)


# -- episodes in progress -------------------------------------------------------------------------
def restore_episodes(d: Daemon) -> None:
    """Episodes survive a restart: what the previous daemon of this boot saw of each job (step marks
    of the progress files, the detector's verdicts, onsets and hang clocks) seeds this one, so a
    hang in progress is neither re-dated nor seen again as a new episode."""
    if d.store is None:
        return
    boot = d._boot_id
    restored = []
    targets: tuple[tuple[str, Any], ...] = ((PROGRESS_KEY, d.progress.tracker), (DETECTOR_KEY, d.detector))
    for key, target in targets:
        saved = d.store.kv_get(key, None)
        if not isinstance(saved, dict) or boot is None or saved.get("boot_id") != boot:
            continue
        at = saved.get("saved_at")
        if not isinstance(at, (int, float)) or not 0 <= d.clock() - at <= EPISODE_STATE_MAX_AGE_S:
            continue
        n = target.restore(saved.get("value"))
        if n:
            restored.append(f"{key}={n}")
    if restored:
        log.info("continuing what the previous daemon saw: %s", ", ".join(restored))
        event(d, "daemon", {"event": "episodes_restored", "restored": restored})


def persist_episode_state(d: Daemon, now: float) -> None:
    """Mirror the step marks and the detector's job memories into the store: at once when a verdict,
    onset or hang clock changed, else at most every EPISODE_SAVE_EVERY_S while marks move."""
    if d.store is None:
        return
    detector = d.detector.export()
    core = {j: (e["verdict"], e["onset"], e["hang_since"]) for j, e in detector.items()}
    marks = d.progress.tracker.version
    saved, at = d._episode_saved, d._episode_saved_at
    age = None if at is None else now - at
    recent = age is not None and 0 <= age < EPISODE_REFRESH_S
    if (
        saved is not None
        and saved[1] == core
        and recent
        and (saved[0] == marks or (age is not None and age < EPISODE_SAVE_EVERY_S))
    ):
        return
    boot = d._boot_id
    try:
        d.store.kv_set(
            PROGRESS_KEY,
            {"boot_id": boot, "saved_at": now, "value": d.progress.tracker.export()},
            now,
        )
        d.store.kv_set(DETECTOR_KEY, {"boot_id": boot, "saved_at": now, "value": detector}, now)
    except StoreError as e:
        log.warning("could not persist the episodes in progress: %s", e)
        return
    d._episode_saved, d._episode_saved_at = (marks, core), now


# -- silences -------------------------------------------------------------------------------------
def restore_silences(d: Daemon) -> None:
    """Silences survive a restart (an operator who silenced a known issue must not be paged again)."""
    book = d.control.silences
    if d.store is not None:
        restored = book.restore(d.store.kv_get(SILENCES_KEY, []) or [], d.clock())
        if restored:
            event(d, "daemon", {"event": "silences_restored", "count": restored})
    d._silences_saved = book.version


def persist_silences(d: Daemon, now: float) -> None:
    book = d.control.silences
    if d.store is None or book.version == d._silences_saved:
        return
    try:
        d.store.kv_set(SILENCES_KEY, book.export(), now)
        d._silences_saved = book.version
    except StoreError as e:  # a full disk: keep them in memory and try again next cycle
        log.warning("could not persist silences: %s", e)
