"""``gpu-watchdog run``: the per-node loop.

One thread owns all state and runs one cycle per period::

    sample GPUs -> classify (per GPU, hysteresis) -> [every process period] read progress files,
    inspect rank processes, detect (per job) -> act -> record events -> publish an immutable snapshot

REST and /metrics (uvicorn in a thread) only ever read the latest published snapshot, so an HTTP
client can never delay a cycle; mutations reach the loop through a queue it drains each cycle. The
main thread owns the signals: SIGTERM/SIGINT stop cleanly, SIGHUP reloads the configuration.

This module is the cycle itself; what it calls lives by concern next to it: ``build`` (the parts made
from the Config, start checks), ``observe`` (one cycle's JobViews), ``record`` (events, verdict changes,
what a restarted daemon continues from), ``health`` (failed and degraded cycles, input errors),
``reload`` (SIGHUP, signal handlers) and ``summary`` (the foreground line).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_triage import __version__
from gpu_triage.daemon import health, observe, record
from gpu_triage.daemon import reload as reloading
from gpu_triage.daemon.build import (
    boot_id,
    check_token,
    detector_settings,
    make_actions,
    make_fleet,
    make_health,
    make_ras,
    make_reader,
    make_sampler,
    make_tracker,
    start_checks,
    start_http,
    take_state_lock,
    validate_classifier,
)
from gpu_triage.daemon.config import Config, ConfigError
from gpu_triage.daemon.health import CycleStats
from gpu_triage.daemon.observe import progress_claims
from gpu_triage.daemon.reload import install_signal_handlers
from gpu_triage.daemon.sdnotify import SdNotifier
from gpu_triage.daemon.state_lock import StateLock
from gpu_triage.daemon.summary import summary_line
from gpu_triage.journal.eventstore import EventStore, StoreError
from gpu_triage.model.clock import Clock, ClockStep, Timeline
from gpu_triage.model.health import UNKNOWN_HEALTH, HealthLevel, NodeHealth
from gpu_triage.model.samples import GpuSample, TelemetrySource
from gpu_triage.model.snapshot import GpuStatus, JobStatus, Snapshot
from gpu_triage.model.states import Mode, Verdict
from gpu_triage.serving.control import QueuedControl
from gpu_triage.serving.publish import SnapshotHolder
from gpu_triage.signals.fleet.facts import JobFacts
from gpu_triage.signals.pods import PodResolver
from gpu_triage.signals.processes import ProcessInspector, ProcessView
from gpu_triage.verdicts.detector import Detector

if TYPE_CHECKING:  # the HTTP stack is imported only when the daemon serves
    from gpu_triage.serving.http_server import HttpServer

log = logging.getLogger("gpu_watchdog")


class Daemon:
    """The loop. Construct, :meth:`start` (opens the store and the HTTP server), then
    :meth:`run_forever` on the main thread; or drive :meth:`cycle` directly in tests."""

    SILENCES_KEY = record.SILENCES_KEY
    TIMELINE_KEY = record.TIMELINE_KEY
    PROGRESS_KEY = record.PROGRESS_KEY
    DETECTOR_KEY = record.DETECTOR_KEY
    EPISODE_STATE_MAX_AGE_S = record.EPISODE_STATE_MAX_AGE_S
    EPISODE_SAVE_EVERY_S = record.EPISODE_SAVE_EVERY_S
    EPISODE_REFRESH_S = record.EPISODE_REFRESH_S

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
        self.gpus = make_tracker(config)
        self.detector = Detector(detector_settings(config))
        self.stacks = make_sampler(config, self.clock)
        self.ras = make_ras(config, self.clock)
        self.fleet = make_fleet(config, self.clock)
        self.health = make_health(config, source)
        """The node health signal (signals/health): Xid, ECC, NVLink... into a NodeHealth per cycle."""
        self._node_health: NodeHealth = UNKNOWN_HEALTH
        """The node's hardware health this cycle: the detector's blame and the engine's drains read it."""
        self._fleet_facts: tuple[JobFacts, ...] = ()
        self.progress = make_reader(config)
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
        self._state_lock = take_state_lock(state_dir)
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
        self.health.open()
        record.restore_timeline(self)
        record.restore_silences(self)
        record.restore_episodes(self)
        if self.actions is None:
            self.actions = make_actions(self, state_dir)
        if self.serve_http:
            try:
                start_http(self)
            except BaseException:  # the port is taken: exit 2 without holding the state directory
                if self._state_lock is not None:
                    self._state_lock.release()
                raise

    @property
    def url(self) -> str | None:
        return self.http.url if self.http is not None else None

    def stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload.set()

    def reload(self) -> None:
        """SIGHUP: re-read the config file and apply what can change live (daemon/reload.py)."""
        reloading.reload(self)

    def clock_step(self, step: ClockStep) -> None:
        """The wall clock jumped: logged and recorded; no duration moves (they are on the timeline)."""
        record.clock_step(self, step)

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
        self.health.close()
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
        """Count consecutive failed cycles (daemon/health.py): /healthz turns 503 ``failing``."""
        health.cycle_failed(self, error)

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
        self._observe_health(now)
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
                    node_health=self._node_health,
                )
                health.actions_ran(self, None)
            except Exception as e:
                health.actions_ran(self, e)
        record.persist_silences(self, now)
        if self.store is not None:
            self.store.maybe_reattach(now)
            self.store.maybe_prune(now)
        self.stats.cycles += 1
        input_errors = health.input_errors(self)
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
            node_health=self._node_health,
            health=self.health.status(),
        )
        self.snapshots.publish(snap)
        if self.on_cycle is not None:
            self.on_cycle(snap)
        return snap

    def _observe_health(self, now: float) -> None:
        """The node verdict this cycle (signals/health); a change of the node's or a GPU's level is an
        event."""
        before = self._node_health
        after = self.health.sample(now)
        self._node_health = after
        was = {g.gpu: g.level for g in before.gpus}
        for g in after.gpus:
            if g.level is not was.get(g.gpu, HealthLevel.HEALTHY):
                self._event(
                    "health",
                    {
                        "level": str(g.level),
                        "from": str(was.get(g.gpu, HealthLevel.HEALTHY)),
                        "pci_bus_id": g.pci_bus_id,
                        "reasons": list(g.reasons),
                    },
                    now,
                    gpu=g.gpu,
                )
        if after.level is not before.level:
            self._event("health", {"node": str(after.level), "from": str(before.level)}, now)

    def _detect(
        self, now: float, samples: Sequence[GpuSample], statuses: Sequence[GpuStatus]
    ) -> tuple[JobStatus, ...]:
        """Every process period: observe the jobs (daemon/observe.py), judge them, record what changed."""
        gviews, jobs = observe.observe(self, now, samples, statuses)
        results = tuple(
            self.detector.update(
                now, gviews, jobs, telemetry_ok=self.source.name != "none", node_health=self._node_health
            )
        )
        record.persist_episode_state(self, now)
        self._fleet_facts = observe.node_facts(self, now, jobs, results, statuses)
        record.verdict_changes(self, results, now)
        return results

    def _event(
        self,
        kind: str,
        payload: dict[str, Any],
        now: float | None = None,
        *,
        gpu: int | None = None,
        job: str | None = None,
    ) -> None:
        record.event(self, kind, payload, now, gpu=gpu, job=job)


__all__ = [
    "CycleStats",
    "Daemon",
    "boot_id",
    "check_token",
    "detector_settings",
    "install_signal_handlers",
    "make_fleet",
    "make_ras",
    "make_sampler",
    "progress_claims",
    "start_checks",
    "summary_line",
    "validate_classifier",
]
