"""``gpu-watchdog run``: the per-node loop.

One thread owns all state and runs one cycle per period::

    sample GPUs -> classify (per GPU, hysteresis) -> [every process period] read progress files,
    inspect rank processes, detect (per job) -> act -> record events -> publish an immutable snapshot

REST and /metrics (uvicorn in a thread) only ever read the latest published snapshot, so an HTTP
client can never delay a cycle; mutations reach the loop through a queue it drains each cycle. The
main thread owns the signals: SIGTERM/SIGINT stop cleanly, SIGHUP reloads the configuration.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_triage import __version__
from gpu_triage.classify.tracker import GpuTracker
from gpu_triage.daemon.config import (
    Config,
    ConfigError,
    detector_config,
    load_config,
    load_token,
    missing_token_note,
    override,
    token_file_absent,
)
from gpu_triage.daemon.sdnotify import SdNotifier
from gpu_triage.daemon.state_lock import StateLock
from gpu_triage.journal import logs
from gpu_triage.journal.eventstore import EventStore, StoreError
from gpu_triage.model.clock import Clock, ClockStep, Timeline
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.names import printable
from gpu_triage.model.samples import TelemetrySource
from gpu_triage.model.snapshot import GpuStatus, JobStatus, Snapshot
from gpu_triage.model.states import ENDED_VERDICTS, Mode, Verdict
from gpu_triage.serving.control import QueuedControl
from gpu_triage.serving.publish import SnapshotHolder
from gpu_triage.signals.fleet.facts import JobFacts, local_facts, spin_since_by_gpu
from gpu_triage.signals.fleet.poller import FleetPoller, PollerConfig
from gpu_triage.signals.fleet.remote import RemoteFacts
from gpu_triage.signals.nccl_ras.poller import RasPoller
from gpu_triage.signals.pods import PodResolver
from gpu_triage.signals.processes import ProcessInspector, ProcessView, ProgressClaim, RankProcess
from gpu_triage.signals.progress import ProgressReader, ProgressView
from gpu_triage.signals.stacks.dumps import StackPhase
from gpu_triage.signals.stacks.sampler import SamplerConfig, StackSampler
from gpu_triage.verdicts.detector import Detector, DetectorConfig, GpuView, JobView
from gpu_triage.verdicts.fusion import job_views

if TYPE_CHECKING:  # the HTTP stack is imported only when the daemon serves
    from gpu_triage.serving.http_server import HttpServer

log = logging.getLogger("gpu_watchdog")


@dataclass
class CycleStats:
    cycles: int = 0
    missed: int = 0
    """Ticks skipped because a cycle overran its period."""
    worst_lateness_s: float = 0.0
    last_duration_s: float = 0.0
    failed: int = 0
    """Cycles that raised (nothing published)."""


class Daemon:
    """The loop. Construct, :meth:`start` (opens the store and the HTTP server), then
    :meth:`run_forever` on the main thread; or drive :meth:`cycle` directly in tests."""

    def __init__(
        self,
        config: Config,
        source: TelemetrySource,
        *,
        config_path: Path | None = None,
        clock: Clock | None = None,
        serve_http: bool = True,
        on_cycle: Callable[[Snapshot], None] | None = None,
        actions: Any | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        """``overrides``: the command-line values applied over the file (re-applied on reload)."""
        self.config = config
        self.config_path = config_path
        self.overrides = dict(overrides or {})
        self._app: Any = None
        self.source = source
        self.timeline = Timeline(clock)
        """Every duration is a difference on this monotonic timeline (gpu_triage.model.clock)."""
        self.clock = self.timeline.now
        self.monotonic = self.timeline.clock.monotonic
        self.serve_http = serve_http
        self.on_cycle = on_cycle
        self.node = config.daemon.node
        self.snapshots = SnapshotHolder()
        self.control = QueuedControl()
        self.mode: Mode = config.actions.mode
        self.stats = CycleStats()
        self.started_at = self.clock()
        self.gpus = GpuTracker(
            model=config.classifier.model,
            table_path=config.classifier.table,
            dwell_s=dict(config.classifier.dwell_s),
        )
        self.detector = Detector(detector_settings(config))
        self.stacks = make_sampler(config, self.clock)
        self.ras = make_ras(config, self.clock)
        self.fleet = make_fleet(config, self.clock)
        self._fleet_facts: tuple[JobFacts, ...] = ()
        self.progress = ProgressReader(
            config.progress.dir, stale_after_s=config.progress.stale_after_s, host=socket.gethostname()
        )
        self.inspector = ProcessInspector()
        self.pods = PodResolver()  # Kubernetes pod of each rank (gpu_triage.signals.pods); none outside one
        self.store: EventStore | None = None
        self.http: HttpServer | None = None
        self.notifier = SdNotifier()
        self.actions = actions
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._last_process_s: float | None = None
        self._jobs: tuple[JobStatus, ...] = ()
        self._verdicts: dict[str, Verdict] = {}
        self._last_sample_time: float | None = None
        self._wall: float | None = None
        self._boot_id = boot_id()
        self._episode_saved: tuple[int, Any] | None = None
        self._episode_saved_at: float | None = None
        self._sample_duration_s = 0.0
        self._process_view: ProcessView | None = None
        self._untrusted: tuple[dict[str, Any], ...] = ()
        self._silences_saved = 0
        self.cycle_no = 0
        self.failed_cycles = 0
        self._last_cycle_error: str | None = None
        self._progress_errors: tuple[dict[str, Any], ...] = ()
        self._actions_error: str | None = None
        self._logged_job_errors: dict[str, str] = {}
        self._persist_errors: dict[str, str] = {}
        self.degraded_cycles = 0
        """Cycles that failed, or in which a job could not be judged or recorded (never only 3 in a row)."""
        self._state_lock: StateLock | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Raises ConfigError (exit 2) for what the config names but cannot be used - checked here
        once, not found failing in every cycle."""
        for check in start_checks():
            if check is not check_token or self.serve_http:  # the token serves the HTTP API only
                check(self.config)
        state_dir = Path(self.config.daemon.state_dir)
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):  # a wrong path or no permission: say so
                raise ConfigError(
                    [f"daemon.state_dir: cannot create the state directory {state_dir}: {e.strerror}"]
                ) from None
            # a full disk: the store runs on memory and reattaches later
            log.error("cannot create the state directory %s: %s", state_dir, e)
        self._take_state_lock(state_dir)
        ev = self.config.events
        try:
            self.store = EventStore(
                state_dir,
                self.clock(),
                retention_s=ev.retention_days * 86400,
                max_bytes=ev.max_bytes,
                prune_interval_s=ev.prune_interval_s,
                memory_fallback=True,  # a full disk must not disable alerting and killing
            )
        except (StoreError, OSError) as e:
            log.error("event store unavailable, running without it: %s", e)
            self.store = None
        self._event(
            "daemon",
            {
                "event": "started",
                "version": __version__,
                "source": self.source.name,
                "mode": str(self.mode),
                "config": self.config.origin,
            },
        )
        self._restore_timeline()
        self._restore_silences()
        self._restore_episodes()
        if self.actions is None:
            self.actions = self._make_actions(state_dir)
        if self.serve_http:
            try:
                self._start_http()
            except BaseException:  # the port is taken: exit 2 without holding the state directory
                if self._state_lock is not None:
                    self._state_lock.release()
                raise

    def _take_state_lock(self, state_dir: Path) -> None:
        """One daemon per state directory (daemon/state_lock.py): a second exits 2 naming the first."""
        from gpu_triage.daemon.state_lock import StateDirInUse, acquire

        if not state_dir.is_dir():
            return  # a full disk kept it from being made: nothing to share yet
        try:
            self._state_lock = acquire(state_dir)
        except StateDirInUse as e:
            raise ConfigError([str(e)]) from None
        except OSError as e:
            raise ConfigError(
                [f"daemon.state_dir: cannot open the lock file in {state_dir}: {e.strerror}"]
            ) from None
        if self._state_lock is None:
            log.error(
                "state directory %s: no room for the lock file (a full disk); running unlocked", state_dir
            )

    SILENCES_KEY = "control.silences"
    TIMELINE_KEY = "daemon.timeline"
    PROGRESS_KEY = "detector.step_marks"
    DETECTOR_KEY = "detector.jobs"
    EPISODE_STATE_MAX_AGE_S = 600.0
    """A restarted daemon continues what an earlier one saw at most this long ago (same boot)."""

    def _restore_timeline(self) -> None:
        """Within one boot the timeline continues across restarts (the monotonic clock does): a restarted
        daemon takes the anchor of the first daemon of this boot, so persisted times (kill budget,
        episodes, silences) keep their meaning, and a clock step while it was down is seen as a step."""
        boot = self._boot_id
        saved = self.store.kv_get(self.TIMELINE_KEY, None) if self.store is not None else None
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
            self.started_at = self.clock()
        self._persist_timeline()

    def _restore_episodes(self) -> None:
        """Episodes survive a restart: what the previous daemon of this boot saw of each job (step marks
        of the progress files, the detector's verdicts, onsets and hang clocks) seeds this one, so a
        hang in progress is neither re-dated nor seen again as a new episode."""
        if self.store is None:
            return
        boot = self._boot_id
        restored = []
        for key, target in ((self.PROGRESS_KEY, self.progress.tracker), (self.DETECTOR_KEY, self.detector)):
            saved = self.store.kv_get(key, None)
            if not isinstance(saved, dict) or boot is None or saved.get("boot_id") != boot:
                continue
            at = saved.get("saved_at")
            if not isinstance(at, (int, float)) or not 0 <= self.clock() - at <= self.EPISODE_STATE_MAX_AGE_S:
                continue
            n = target.restore(saved.get("value"))
            if n:
                restored.append(f"{key}={n}")
        if restored:
            log.info("continuing what the previous daemon saw: %s", ", ".join(restored))
            self._event("daemon", {"event": "episodes_restored", "restored": restored})

    EPISODE_SAVE_EVERY_S = 5.0
    EPISODE_REFRESH_S = 60.0

    def _persist_episode_state(self, now: float) -> None:
        """Mirror the step marks and the detector's job memories into the store: at once when a verdict,
        onset or hang clock changed, else at most every EPISODE_SAVE_EVERY_S while marks move."""
        if self.store is None:
            return
        detector = self.detector.export()
        core = {j: (e["verdict"], e["onset"], e["hang_since"]) for j, e in detector.items()}
        marks = self.progress.tracker.version
        saved, at = self._episode_saved, self._episode_saved_at
        age = None if at is None else now - at
        recent = age is not None and 0 <= age < self.EPISODE_REFRESH_S
        if (
            saved is not None
            and saved[1] == core
            and recent
            and (saved[0] == marks or (age is not None and age < self.EPISODE_SAVE_EVERY_S))
        ):
            return
        boot = self._boot_id
        try:
            self.store.kv_set(
                self.PROGRESS_KEY,
                {"boot_id": boot, "saved_at": now, "value": self.progress.tracker.export()},
                now,
            )
            self.store.kv_set(self.DETECTOR_KEY, {"boot_id": boot, "saved_at": now, "value": detector}, now)
        except StoreError as e:
            log.warning("could not persist the episodes in progress: %s", e)
            return
        self._episode_saved, self._episode_saved_at = (marks, core), now

    def _persist_timeline(self) -> None:
        if self.store is None:
            return
        value = {
            "boot_id": boot_id(),
            "anchor_s": self.timeline.anchor_s,
            "offset_s": self.timeline.last_offset_s,
        }
        try:
            self.store.kv_set(self.TIMELINE_KEY, value, self.clock())
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
        self._event(
            "daemon",
            {"event": "clock_step", "step_s": round(step.step_s, 3), "offset_s": round(step.offset_s, 3)},
            step.timeline_s,
        )
        self._persist_timeline()

    def _restore_silences(self) -> None:
        """Silences survive a restart (an operator who silenced a known issue must not be paged again)."""
        book = self.control.silences
        if self.store is not None:
            restored = book.restore(self.store.kv_get(self.SILENCES_KEY, []) or [], self.clock())
            if restored:
                self._event("daemon", {"event": "silences_restored", "count": restored})
        self._silences_saved = book.version

    def _persist_silences(self, now: float) -> None:
        book = self.control.silences
        if self.store is None or book.version == self._silences_saved:
            return
        try:
            self.store.kv_set(self.SILENCES_KEY, book.export(), now)
            self._silences_saved = book.version
        except StoreError as e:  # a full disk: keep them in memory and try again next cycle
            log.warning("could not persist silences: %s", e)

    def _make_actions(self, state_dir: Path):
        from gpu_triage.actions.engine import ActionEngine

        if self.store is None:  # the outbox and the kill budget live in the store
            return None
        return ActionEngine(
            actions=self.config.actions,
            alerts=self.config.alerts,
            store=self.store,
            state_dir=state_dir,
            node=self.node,
            generator_url=f"http://{self.config.daemon.listen}/status",
            max_bundles=self.config.evidence.max_bundles,
            evidence_retention_s=self.config.evidence.retention_days * 86400.0,
            clock=self.clock,
        )

    def _start_http(self) -> None:
        from gpu_triage.serving.api import create_app
        from gpu_triage.serving.http_server import HttpServer

        host, _, port = self.config.daemon.listen.rpartition(":")
        token = load_token(self.config)
        if token_file_absent(self.config):
            log.warning("%s", missing_token_note(self.config))
        app = create_app(
            snapshots=self.snapshots,
            events=self.store,
            table=self._table_doc,
            control=self.control,
            token=token,
            period_s=self.config.daemon.period_s,
            clock=self.clock,
            allowed_hosts=[
                *self.config.daemon.allowed_hosts,
                self.node,
                socket.gethostname(),
                socket.getfqdn(),  # once, at start (/etc/hosts or DNS)
                host.strip("[]"),
            ],
        )
        self._app = app
        self.http = HttpServer(app, host.strip("[]") or "127.0.0.1", int(port))
        self.http.start()

    def _table_doc(self) -> dict[str, Any]:
        tables = self.gpus.tables()
        if not tables:
            return {"tables": []}
        distinct = {t.model: t for t in tables.values()}
        first = next(iter(distinct.values()))
        doc = first.to_dict()
        doc["gpus"] = {str(g): t.model for g, t in tables.items()}
        if len(distinct) > 1:
            doc["others"] = [t.to_dict() for t in list(distinct.values())[1:]]
        return doc

    @property
    def url(self) -> str | None:
        return self.http.url if self.http is not None else None

    def stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload.set()

    def close(self) -> None:
        self.notifier.stopping("stopping")
        self._event("daemon", {"event": "stopped", "cycles": self.stats.cycles})
        if self.actions is not None:
            try:
                self.actions.close()
            except Exception:
                log.exception("closing actions")
        if self.http is not None:
            self.http.stop()
        try:
            self.source.close()
        except Exception:
            log.exception("closing the telemetry source")
        if self.store is not None:
            self.store.close()
        self.stacks.close()
        self.fleet.close()
        if self._state_lock is not None:
            self._state_lock.release()
            self._state_lock = None

    # -- the loop -------------------------------------------------------------------------------
    def run_forever(self) -> None:
        period = self.config.daemon.period_s
        self.notifier.ready(f"watching {len(self.source.gpus())} GPU(s) from {self.source.name}")
        next_tick = self.monotonic()
        while not self._stop.is_set():
            if self._reload.is_set():
                self._reload.clear()
                self.reload()
                period = self.config.daemon.period_s
            t0 = self.monotonic()
            self.tick()
            self.stats.last_duration_s = self.monotonic() - t0
            now_m = self.monotonic()
            if self.notifier.watchdog_due(now_m):
                self.notifier.watchdog(now_m)
            next_tick += period
            lateness = now_m - next_tick
            if lateness > 0:
                missed = int(lateness // period) + 1
                self.stats.missed += missed
                self.stats.worst_lateness_s = max(self.stats.worst_lateness_s, lateness)
                next_tick += missed * period
            self._stop.wait(max(0.0, next_tick - self.monotonic()))

    def tick(self) -> Snapshot | None:
        """One cycle of the loop at the clock's time: a clock step is noticed (and moves nothing), then
        :meth:`cycle` runs on the timeline; a failed cycle is counted, never raised."""
        step = self.timeline.check_step()
        if step is not None:
            self.clock_step(step)
        try:
            snap = self.cycle(self.clock(), wall=self.timeline.wall())
        except Exception as e:
            self._cycle_failed(e)
            return None
        self._cycle_failed(None)
        return snap

    def _cycle_failed(self, error: Exception | None) -> None:
        """Count consecutive failed cycles; the last good snapshot is republished with the count so
        /healthz turns 503 ``failing``. Logged with its traceback when the error changes, not each time."""
        if error is None:
            if self.failed_cycles:
                log.warning("cycle %d succeeded after %d failed cycle(s)", self.cycle_no, self.failed_cycles)
            self.failed_cycles, self._last_cycle_error = 0, None
            return
        self.failed_cycles += 1
        self.stats.failed += 1
        failed_total = float(self.stats.failed)
        text = f"{type(error).__name__}: {error}"[:300]
        if text != self._last_cycle_error:
            log.error(
                "cycle %d failed (%d in a row): %s",
                self.cycle_no,
                self.failed_cycles,
                printable(text),
                exc_info=error,
            )
            self._event("daemon", {"event": "cycle_failed", "cycle": self.cycle_no, "error": text})
            self._last_cycle_error = text
        latest = self.snapshots.latest()
        if latest is not None:  # visible at once in /healthz (degraded) and the failed-cycle counter
            counters = {
                **latest.counters,
                "failed_cycles_total": failed_total,
                "degraded_cycles_total": float(self.degraded_cycles) + failed_total,
            }
            self.snapshots.publish(replace(latest, failed_cycles=self.failed_cycles, counters=counters))
        elif self.failed_cycles >= 3:  # never a good cycle: say "failing", not "starting" forever
            self.snapshots.publish(
                Snapshot(
                    node=self.node,
                    source=self.source.name,
                    mode=self.mode,
                    armed=self.mode is not Mode.OBSERVE,
                    cycle=self.cycle_no,
                    time=self.started_at,
                    period_s=self.config.daemon.period_s,
                    started_at=self.started_at,
                    version=__version__,
                    failed_cycles=self.failed_cycles,
                )
            )

    def cycle(self, now: float, *, wall: float | None = None) -> Snapshot:
        """One cycle at ``now`` on the daemon's timeline (gpu_triage.model.clock); ``wall``: the wall clock
        now, to place the times read from progress files (None: the same as ``now``, as in tests that
        drive cycles by hand). Returns (and publishes) the snapshot."""
        cfg = self.config
        self._wall = now if wall is None else wall
        self.cycle_no += 1
        for cmd in self.control.drain():
            if cmd.mode is not self.mode:
                self._event("action", {"action": "mode", "from": str(self.mode), "to": str(cmd.mode)}, now)
            self.mode = cmd.mode
        t0 = time.perf_counter()
        samples = self.source.sample(now)
        self._sample_duration_s = time.perf_counter() - t0
        if samples:
            self._last_sample_time = now
        for ch in self.gpus.update(now, samples):
            self._event(
                "state_change",
                {
                    "from": str(ch.old),
                    "to": str(ch.new),
                    "since": ch.since,
                    "power_w": ch.power_w,
                    "utilization_ratio": ch.utilization_ratio,
                    "uuid": ch.uuid,
                },
                now,
                gpu=ch.gpu,
            )
        statuses = self.gpus.statuses()
        due = self._last_process_s is None or now - self._last_process_s >= cfg.daemon.process_period_s - 1e-6
        if due:
            self._last_process_s = now
            self._jobs = self.pods.attribute(self._detect(now, samples, statuses))
        if self.actions is not None and due:
            try:
                self.actions.on_cycle(
                    now,
                    mode=self.mode,
                    jobs=self._jobs,
                    processes=self._process_view.jobs if self._process_view else {},
                    gpus=statuses,
                    silences=self.control.silences,
                    progress_dir=cfg.progress.dir,
                )
                self._actions_error = None
            except Exception as e:
                text = f"{type(e).__name__}: {e}"[:300]
                if text != self._actions_error:
                    log.exception("actions failed")
                self._actions_error = text
        self._persist_silences(now)
        if self.store is not None:
            self.store.maybe_reattach(now)
            self.store.maybe_prune(now)
        self.stats.cycles += 1
        input_errors = self._input_errors()
        if any(e["kind"] in ("job", "persist", "actions") for e in input_errors):
            self.degraded_cycles += 1
        snap = Snapshot(
            node=self.node,
            source=self.source.name,
            mode=self.mode,
            armed=self.mode is not Mode.OBSERVE,
            cycle=self.cycle_no,
            time=now,
            period_s=cfg.daemon.period_s,
            gpus=statuses,
            jobs=self._jobs,
            sample_duration_s=self._sample_duration_s,
            last_sample_time=self._last_sample_time,
            started_at=self.started_at,
            counters={
                "cycles_total": float(self.stats.cycles),
                "missed_cycles_total": float(self.stats.missed),
                "failed_cycles_total": float(self.stats.failed),
                "degraded_cycles_total": float(self.degraded_cycles + self.stats.failed),
            },
            actions=dict(getattr(self.actions, "counters", {}) or {}),
            version=__version__,
            untrusted_progress_files=self._untrusted,
            input_errors=input_errors,
            stacks={**self.stacks.status(), "nccl_ras": self.ras.status()},
            fleet=self._fleet_facts,
            cluster=self.fleet.status(),
            clock_offset_s=(self._wall if self._wall is not None else now) - now,
        )
        self.snapshots.publish(snap)
        if self.on_cycle is not None:
            self.on_cycle(snap)
        return snap

    def _input_errors(self) -> tuple[dict[str, Any], ...]:
        """What failed this cycle without stopping it (Snapshot.input_errors)."""
        out = list(self._progress_errors)
        job_errors = dict(self.detector.job_errors)
        for job, error in sorted(job_errors.items()):
            if self._logged_job_errors.get(job) != error:  # once per job and error, not every cycle
                log.error(
                    "detector could not judge job %s (last verdict kept, never a kill): %s",
                    printable(job, 200),
                    printable(error),
                )
        self._logged_job_errors = job_errors
        out += [{"kind": "job", "where": j, "error": e} for j, e in sorted(job_errors.items())]
        out += [{"kind": "persist", "where": j, "error": e} for j, e in sorted(self._persist_errors.items())]
        if self.store is not None and getattr(self.store, "memory_only", False):
            out.append({"kind": "store", "where": str(self.store.path), "error": self.store.memory_reason})
        if self._actions_error is not None:
            out.append({"kind": "actions", "where": "actions", "error": self._actions_error})
        return tuple(out)

    def _detect(self, now: float, samples, statuses) -> tuple[JobStatus, ...]:
        view = self.progress.read(now, wall_s=self._wall)
        self._progress_errors = tuple(
            {"kind": "progress_file", "where": printable(str(e.path)), "error": printable(e.error)}
            for e in view.errors
        )
        gpu_pids = {s.gpu: list(s.pids) for s in samples if s.pids}
        uuid_to_index = {g.uuid: g.gpu for g in statuses if g.uuid}
        self._process_view = self.inspector.inspect(
            now,
            gpu_pids=gpu_pids,
            claims=progress_claims(view, self.progress.host),
            uuid_to_index=uuid_to_index,
        )
        self.progress.priority = frozenset(
            name.split("@", 1)[0]
            for name, ranks in self._process_view.jobs.items()
            if any(r.alive and r.proof for r in ranks)
        )
        untrusted_files = [u.to_dict() for u in view.untrusted]
        jobs = job_views(
            view.jobs,
            self._process_view.jobs,
            untrusted=self._process_view.untrusted,
            untrusted_files=untrusted_files,
        )
        self._untrusted = tuple([*untrusted_files, *(u.to_dict() for u in self._process_view.untrusted)])
        jobs = self._with_stacks(now, jobs)
        jobs = self._with_remote(now, jobs)
        signalled = getattr(self.actions, "signalled_pids", None)
        if signalled is not None:  # ranks the kill ladder signalled read `killed`, never a new stall
            jobs = [replace(j, signalled_pids=signalled(j.job, now)) for j in jobs]
        gviews = [
            GpuView(
                g.gpu,
                g.state,
                g.state_since,
                self.gpus.nvlink_bytes(g.gpu),
                util_known=g.utilization_ratio is not None or g.power_w is None,
            )
            for g in statuses
        ]
        results = tuple(self.detector.update(now, gviews, jobs, telemetry_ok=self.source.name != "none"))
        self._persist_episode_state(now)
        self._fleet_facts = self._local_facts(now, jobs, results, statuses)
        persist_errors: dict[str, str] = {}
        for j in results:
            prev = self._verdicts.get(j.job)
            if prev is j.verdict:
                continue
            try:  # an error while persisting one job's verdict stays in that job
                self._record_verdict(j, prev, now)
            except Exception as e:
                persist_errors[j.job] = f"{type(e).__name__}: {e}"[:300]
            self._verdicts[j.job] = j.verdict
        for job, error in persist_errors.items():
            if self._persist_errors.get(job) != error:
                log.error("could not record the verdict of job %s: %s", printable(job, 200), printable(error))
        self._persist_errors = persist_errors
        for gone in set(self._verdicts) - {j.job for j in results}:
            last = str(self._verdicts.pop(gone))
            self._event("verdict", {"from": last, "to": None, "event": "job_gone"}, now, job=gone)
            logs.EVENTS.verdict(gone, last, None, cause="job_gone")
        return results

    def _record_verdict(self, j: JobStatus, prev: Verdict | None, now: float) -> None:
        self._event(
            "verdict",
            {
                "from": str(prev) if prev else None,
                "to": str(j.verdict),
                "onset": j.onset,
                "cause": j.cause,
                "signals": list(j.evidence.signals) if j.evidence is not None else [],
                "ranks": [r.rank for r in j.ranks],
            },
            now,
            job=j.job,
        )
        logs.EVENTS.verdict(
            j.job,
            str(prev) if prev else None,
            str(j.verdict),
            cause=j.cause,
            signals=list(j.evidence.signals) if j.evidence is not None else [],
            ranks=[r.rank for r in j.ranks],
            onset=j.onset,
            kill_worthy=j.kill_worthy,
        )

    def _with_stacks(self, now: float, jobs: list[JobView]) -> list[JobView]:
        """Ask the sampler for dumps of every job's proven live ranks (it decides what is due) and
        hand each job its latest stacks."""
        procs: Mapping[str, tuple[RankProcess, ...]] = (
            self._process_view.jobs if self._process_view is not None else {}
        )
        out = []
        suspicious = False
        for j in jobs:
            pids = {r.rank: r.pid for r in j.ranks if r.proven and r.alive and r.pid is not None}
            sizes = {p.world_size for p in procs.get(j.job, ()) if p.world_size is not None}
            world = j.world_size if j.world_size is not None else (sizes.pop() if len(sizes) == 1 else None)
            prev = self._verdicts.get(j.job)
            self.stacks.request(
                now,
                j.job,
                pids,
                urgent=prev is not None and prev not in _CALM,
                blind=not j.has_progress,
                world_size=world,
            )
            summary = self.stacks.summary(j.job)
            waiting = summary is not None and any(
                s.samples > 1 and s.info.phase is StackPhase.COLLECTIVE for s in summary.ranks.values()
            )
            suspicious = suspicious or waiting or (prev is not None and prev not in _CALM)
            ras = self.ras.facts(set(pids.values()))
            out.append(replace(j, stacks=summary, ras=ras))
        self.stacks.forget({j.job for j in jobs})
        self.ras.request(now, suspicious)
        return out

    def _with_remote(self, now: float, jobs: list[JobView]) -> list[JobView]:
        """[cluster]: hand each job whose world is larger than its ranks here the other nodes' latest
        facts (gpu_triage.signals.fleet), asking Prometheus again - off this thread - while it is
        suspicious."""
        if not self.fleet.enabled:
            return jobs
        out = []
        for j in jobs:
            world = j.world_size if j.world_size is not None else (j.stacks.world_size if j.stacks else None)
            if world is None or world <= len({r.rank for r in j.ranks}):
                out.append(j)
                continue
            prev = self._verdicts.get(j.job)
            waiting = j.stacks is not None and any(
                s.samples > 1 and s.info.phase is StackPhase.COLLECTIVE for s in j.stacks.ranks.values()
            )
            self.fleet.request(now, j.job, waiting or (prev is not None and prev not in _CALM))
            remote = self.fleet.latest(j.job)
            if remote is None:
                remote = RemoteFacts(
                    j.job, now, error="not asked for: the job was never suspicious", asked=False
                )
            out.append(replace(j, remote=remote))
        self.fleet.forget({j.job for j in jobs})
        return out

    def _local_facts(
        self, now: float, jobs: list[JobView], results: tuple[JobStatus, ...], statuses: Sequence[GpuStatus]
    ) -> tuple[JobFacts, ...]:
        """This node's facts about each job, exported for the other nodes (gpu_watchdog_fleet_*)."""
        spin = spin_since_by_gpu(statuses)
        by_job = {j.job: j for j in results}
        d = self.detector.config
        out = []
        for view in jobs:
            st = by_job.get(view.job)
            if st is None:
                continue
            ev = st.evidence
            world = (
                view.world_size
                if view.world_size is not None
                else (view.stacks.world_size if view.stacks is not None else None)
            )
            out.append(
                local_facts(
                    now,
                    self.node,
                    job=view.job,
                    world_size=world,
                    ranks=view.ranks,
                    stacks=view.stacks,
                    verdict=str(st.verdict),
                    onset=st.onset,
                    kill_worthy=st.kill_worthy,
                    writing=ev is not None and ev.bytes_written_recently >= d.write_active_bytes,
                    reading=ev is not None and ev.bytes_read_recently >= d.read_active_bytes,
                    gpu_spin_since=spin,
                    fresh_s=d.stacks.fresh_s,
                )
            )
        return tuple(out)

    def _event(
        self,
        kind: str,
        payload: dict[str, Any],
        now: float | None = None,
        *,
        gpu: int | None = None,
        job: str | None = None,
    ) -> None:
        if self.store is None:
            return
        clean = jsonable(payload)
        self.store.append(kind, clean, time_s=self.clock() if now is None else now, gpu=gpu, job=job)

    # -- reload ---------------------------------------------------------------------------------
    def reload(self) -> None:
        """SIGHUP: re-read the config file; apply what can change live (mode, detector, classifier
        dwell, progress dir); listen address, state dir and source need a restart (logged)."""
        self.notifier.reloading()
        try:
            new = load_config(self.config_path, os.environ)
            if self.overrides:  # the same command line as at start: a flag is no change
                new = override(new, self.overrides, origin="command line")
            validate_classifier(new)
            token = load_token(new) if self._app is not None else None
        except Exception as e:
            log.error("reload failed, keeping the running configuration: %s", e)
            self._event("daemon", {"event": "reload_failed", "error": str(e)})
            self.notifier.ready("reload failed; running configuration kept")
            return
        for key in ("listen", "state_dir", "source"):
            if getattr(new.daemon, key) != getattr(self.config.daemon, key):
                log.warning("daemon.%s changed: takes effect after a restart", key)
        new = replace(
            new,
            daemon=replace(
                new.daemon,
                listen=self.config.daemon.listen,
                state_dir=self.config.daemon.state_dir,
                source=self.config.daemon.source,
            ),
        )
        self.detector.config = detector_settings(new)
        if new.stacks != self.config.stacks:
            self.stacks.close()
            self.stacks = make_sampler(new, self.clock)
        if new.ras != self.config.ras:
            self.ras = make_ras(new, self.clock)
        if new.cluster != self.config.cluster:
            self.fleet.close()
            self.fleet = make_fleet(new, self.clock)
        if new.progress != self.config.progress:
            self.progress = ProgressReader(
                new.progress.dir, stale_after_s=new.progress.stale_after_s, host=socket.gethostname()
            )
        if new.actions.mode != self.config.actions.mode:
            self.mode = new.actions.mode
        if self._app is not None:
            from gpu_triage.serving.api import set_token

            set_token(self._app, token)  # a rotated token file takes effect now; the old one stops
            if token_file_absent(new):
                log.warning("%s", missing_token_note(new))
            else:
                log.info("auth token re-read from %s", new.auth.token_file)
        self.config = new
        self._event("daemon", {"event": "reloaded", "config": new.origin})
        self.notifier.ready("configuration reloaded")
        log.info("configuration reloaded from %s", new.origin)


def boot_id() -> str | None:
    """The kernel's boot id (the monotonic clock restarts with it), None where unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read(64).strip() or None
    except OSError:
        return None


def check_token(config: Config) -> None:
    """The token file, as :meth:`Daemon.start` loads it (ConfigError naming ``auth.token_file``)."""
    from gpu_triage.daemon.config import ConfigError

    try:
        load_token(config)
    except ConfigError as e:
        raise ConfigError([f"auth.token_file: {p}" for p in e.problems]) from None


def start_checks() -> tuple[Callable[[Config], None], ...]:
    """Every check ``run`` makes of a configuration before its first cycle (each raises ConfigError);
    ``check-config`` runs the same list, so it never approves what ``run`` refuses."""
    return (validate_classifier, check_token)


def validate_classifier(config: Config) -> None:
    """The table file or model the config names must load now (ConfigError naming the key), rather
    than raise in every cycle once a GPU is seen."""
    from gpu_triage.classify.power_table import TableError
    from gpu_triage.classify.table_files import resolve_table
    from gpu_triage.daemon.config import ConfigError

    c = config.classifier
    try:
        resolve_table(model=c.model, path=c.table)
    except TableError as e:
        key = "classifier.table" if c.table is not None else "classifier.model"
        raise ConfigError([f"{config.origin}: {key}: {e}"]) from None


def detector_settings(config: Config) -> DetectorConfig:
    """The detector's config: ``[detector]`` with what it takes from ``[stacks]``, ``[daemon]`` and
    ``[cluster]`` filled in."""
    return detector_config(config)


def make_fleet(config: Config, clock: Callable[[], float] = time.time) -> FleetPoller:
    c = config.cluster
    return FleetPoller(
        PollerConfig(
            prometheus_url=c.prometheus_url,
            node=config.daemon.node,
            min_interval_s=c.min_interval_s,
            timeout_s=c.timeout_s,
            max_response_bytes=c.max_response_bytes,
        ),
        clock=clock,
    )


_CALM = frozenset({Verdict.HEALTHY, Verdict.CHECKPOINT, *ENDED_VERDICTS})
"""Verdicts that need no urgent look (an ended job is not sampled in a hurry)."""


def make_ras(config: Config, clock: Callable[[], float] = time.time) -> RasPoller:
    return RasPoller(config.ras, clock=clock)


def make_sampler(config: Config, clock: Callable[[], float] = time.time) -> StackSampler:
    s = config.stacks
    return StackSampler(
        SamplerConfig(
            enabled=s.enabled,
            py_spy=s.py_spy,
            nonblocking=s.nonblocking,
            healthy_interval_s=s.healthy_interval_s,
            blind_interval_s=s.blind_interval_s,
            suspect_interval_s=s.suspect_interval_s,
            timeout_s=s.timeout_s,
            budget_cpu_s_per_min=s.budget_cpu_s_per_min,
            max_parallel=s.max_parallel,
        ),
        clock=clock,
    )


def progress_claims(view: ProgressView, host: str) -> list[ProgressClaim]:
    """What each believed progress file claims about its process (the inspector checks the claim)."""
    claims = []
    for job, jp in view.jobs.items():
        ranks = dict(jp.ranks)
        for rank, r in jp.stale.items():
            ranks.setdefault(rank, r)
        for rank, r in ranks.items():
            rec = r.record
            claims.append(
                ProgressClaim(
                    job, rank, rec.pid, rec.local_rank, host_is_local=rec.host == host, owner_uid=r.owner_uid
                )
            )
    return claims


def summary_line(snap: Snapshot) -> str:
    """One line per cycle for the foreground run: GPU states and job verdicts."""
    counts: dict[str, int] = {}
    for g in snap.gpus:
        counts[str(g.state)] = counts.get(str(g.state), 0) + 1
    short = {
        "compute": "compute",
        "checkpoint_or_deadlock": "ckpt/deadlock",
        "data_starvation": "starved",
        "communication": "comm",
        "idle": "idle",
        "unknown": "unknown",
    }
    gpus = " ".join(f"{short[k]}={v}" for k, v in sorted(counts.items())) or "no GPUs"
    power = sum(g.power_w or 0.0 for g in snap.gpus)
    jobs = (
        "; ".join(
            f"{j.job}: {j.verdict}"
            + (f" since {time.strftime('%H:%M:%S', time.localtime(j.onset))}" if j.onset else "")
            + (
                f" step {max(s for s in (r.step for r in j.ranks) if s is not None)}"
                if any(r.step is not None for r in j.ranks)
                else ""
            )
            for j in snap.jobs
        )
        or "no jobs"
    )
    clock = time.strftime("%H:%M:%S", time.localtime(snap.time))
    return f"{clock} [{snap.mode}] GPUs {gpus} ({power:,.0f} W) | {jobs}"


def install_signal_handlers(daemon: Daemon) -> None:
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: daemon.request_reload())


__all__ = ["CycleStats", "Daemon", "install_signal_handlers", "summary_line"]
