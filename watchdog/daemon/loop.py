"""``gpu-watchdog run``: the per-node loop.

One thread owns all state and runs one cycle per period::

    sample GPUs -> [every publish period] classify each sample since (per GPU, hysteresis, at the
    sample's time) -> [every process period] read progress files, inspect rank processes, detect (per
    job) -> act -> record events -> publish an immutable snapshot

The cycles between two publishes (``daemon.publish_period_s``, 0.5 s) only read the GPUs: at 10 Hz the
loop classifies five samples at once, and the cost of a cycle is mostly what waking up costs (caches gone
cold after 100 ms asleep), so the rest of the cycle runs twice a second instead of ten times.

REST and /metrics (uvicorn in a thread) only ever read the latest published snapshot, so an HTTP
client can never delay a cycle; mutations reach the loop through a queue it drains each cycle. The
main thread owns the signals: SIGTERM/SIGINT stop cleanly, SIGHUP reloads the configuration.

This module is the cycle itself; the parts it composes own their state next to it: ``observe`` (the
Observer: progress files, processes, the registered signals, one cycle's JobViews), ``record`` (the
Recorder: events, verdict changes, what a restarted daemon continues from), ``health`` (the HealthBook:
failed and degraded cycles, input errors); ``build`` makes the rest from the Config (tracker, action
engine, HTTP server, state lock, start checks), ``reload`` re-reads the config on SIGHUP and installs
the signal handlers, ``summary`` writes the foreground line. None of them imports this module.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_triage import __version__
from gpu_triage.actions.interface import Actions, Cycle
from gpu_triage.classify.tracker import StatusInputs, status_rows
from gpu_triage.daemon.build import (
    check_token,
    make_actions,
    make_tracker,
    retarget_captures,
    signal_env,
    start_checks,
    start_http,
    take_state_lock,
)
from gpu_triage.daemon.config import (
    Config,
    ConfigError,
    detector_config,
    missing_token_note,
    token_file_absent,
)
from gpu_triage.daemon.health import CycleStats, HealthBook
from gpu_triage.daemon.observe import Observer, process_scope
from gpu_triage.daemon.record import Recorder
from gpu_triage.daemon.reload import reread
from gpu_triage.daemon.sdnotify import SdNotifier
from gpu_triage.daemon.state_lock import StateLock
from gpu_triage.journal.eventstore import EventStore, StoreError
from gpu_triage.journal.logs import configure as configure_logging
from gpu_triage.model.clock import Clock, ClockStep, Timeline
from gpu_triage.model.health import UNKNOWN_HEALTH, HealthLevel, NodeHealth
from gpu_triage.model.samples import GpuSample, TelemetrySource
from gpu_triage.model.snapshot import GpuStatus, JobStatus, Snapshot
from gpu_triage.model.states import Mode
from gpu_triage.serving.control import QueuedControl
from gpu_triage.serving.publish import SnapshotHolder
from gpu_triage.verdicts.detector import Detector

if TYPE_CHECKING:  # the HTTP stack is imported only when the daemon serves
    from gpu_triage.serving.http_server import HttpServer

log = logging.getLogger("gpu_watchdog")


class Daemon:
    """The loop. Construct, :meth:`start` (opens the store and the HTTP server), then
    :meth:`run_forever` on the main thread; or drive :meth:`cycle` directly in tests.

    It composes the parts that own their state - the :class:`~gpu_triage.daemon.observe.Observer`
    (progress files, processes, the registered signals), the detector, the
    :class:`~gpu_triage.daemon.record.Recorder` (the store and what a restart continues from) and the
    :class:`~gpu_triage.daemon.health.HealthBook` (failed and degraded cycles) - and holds only what
    they share: the config, the timeline, the mode, the latest jobs and the published snapshots."""

    def __init__(
        self,
        config: Config,
        source: TelemetrySource,
        *,
        config_path: Path | None = None,
        clock: Clock | None = None,
        serve_http: bool = True,
        on_cycle: Callable[[Snapshot], None] | None = None,
        actions: Actions | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        """``overrides``: the command-line values applied over the file (re-applied on reload)."""
        self.config = config
        self.config_path = config_path
        self.overrides = dict(overrides or {})
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
        self.started_at = self.clock()
        self.gpus = make_tracker(config)
        self.detector = Detector(detector_config(config))
        # On a simulated source the daemon judges only the simulated job's processes (ValueError
        # when its job_session leads no session).
        self.observer = Observer(
            config, self.gpus, signal_env(config, source, self.clock), process_scope(source)
        )
        self.node_health: NodeHealth = UNKNOWN_HEALTH
        """The node verdict this cycle (the ``health`` signal); in every snapshot as ``node_health``."""
        self.recorder = Recorder(self.timeline)
        self.health = HealthBook()
        self.app: Any = None
        """The HTTP app while serving (its token is replaced on reload)."""
        self.http: HttpServer | None = None
        self.notifier = SdNotifier()
        self.actions = actions
        self.cycle_no = 0
        self._stop = threading.Event()
        self._wake = threading.Lock()
        """Held while the loop may sleep; :meth:`stop` releases it (the loop sleeps in ``acquire``)."""
        self._wake.acquire()
        self._reload = threading.Event()
        self._last_process_s: float | None = None
        self._jobs: tuple[JobStatus, ...] = ()
        self._signal_status: dict[str, Any] | None = None
        """The registered signals' status as the last process period (or health change) left it."""
        self._action_counters: dict[tuple[str, str], int] | None = None
        """The action engine's counters as the last process period left them (Snapshot.actions)."""
        self._last_sample_time: float | None = None
        self._pending: list[tuple[float, list[GpuSample]]] = []
        """The samples read since the last published cycle, each with its time: the running loop
        classifies them together (``daemon.publish_period_s``), each at its own time."""
        self._last_publish_s: float | None = None
        self._slack_s = 1e-6
        """How much earlier than its period a periodic part (publish, process) may run: half a period in
        the running loop, whose cycles wake on a fixed grid a little late (else a cycle woken 0.3 ms
        early against the last one waits a whole cycle more); none for cycles driven by hand."""
        self._wall: float | None = None
        self._sample_duration_s = 0.0
        self._state_lock: StateLock | None = None

    @property
    def store(self) -> EventStore | None:
        """The event store (the recorder's), None before :meth:`start` or without one."""
        return self.recorder.store

    @property
    def stats(self) -> CycleStats:
        return self.health.stats

    @property
    def failed_cycles(self) -> int:
        return self.health.failed_cycles

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
            self.recorder.store = EventStore(
                state_dir,
                self.clock(),
                retention_s=ev.retention_days * 86400,
                max_bytes=ev.max_bytes,
                prune_interval_s=ev.prune_interval_s,
                memory_fallback=True,  # a full disk must not disable alerting and killing
            )
        except (StoreError, OSError) as e:
            log.error("event store unavailable, running without it: %s", e)
            self.recorder.store = None
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
        if self.recorder.restore_timeline():
            self.started_at = self.clock()
        self.recorder.restore_silences(self.control.silences)
        self.recorder.restore_episodes(
            self.observer.progress.tracker, self.detector, scope=self.observer.inspector.scope
        )
        self.observer.signals.start()  # the health signal's kernel log, opened only when serving
        if self.actions is None:
            self.actions = make_actions(self.config, self.store, state_dir, self.node, self.clock)
        if self.serve_http:
            try:
                self.app, self.http = start_http(
                    self.config,
                    snapshots=self.snapshots,
                    events=self.store,
                    gpus=self.gpus,
                    control=self.control,
                    node=self.node,
                    clock=self.clock,
                )
            except BaseException:  # the port is taken: exit 2 without holding the state directory
                if self._state_lock is not None:
                    self._state_lock.release()
                raise

    @property
    def url(self) -> str | None:
        return self.http.url if self.http is not None else None

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(RuntimeError):  # already released: stopped before
            self._wake.release()

    def request_reload(self) -> None:
        self._reload.set()

    def reload(self) -> None:
        """SIGHUP: re-read the config file and apply what can change live (mode, detector, progress,
        every signal's section, the cycle periods, the log lines, the evidence capture's RAS address and
        py-spy, the token); what ``reload.RESTART_ONLY`` names needs a restart (each change logged, the
        running value kept). A config that does not load keeps the running one."""
        self.notifier.reloading()
        try:
            new, token = reread(self.config_path, self.overrides, self.config, serving=self.app is not None)
        except Exception as e:
            log.error("reload failed, keeping the running configuration: %s", e)
            self._event("daemon", {"event": "reload_failed", "error": str(e)})
            self.notifier.ready("reload failed; running configuration kept")
            return
        self.detector.config = detector_config(new)
        self.observer.reload(self.config, new)
        self._signal_status = None  # a reloaded signal reports afresh in the next snapshot
        old_logs = (self.config.daemon.log_level, self.config.daemon.log_format)
        if (new.daemon.log_level, new.daemon.log_format) != old_logs:
            configure_logging(new.daemon.log_level, new.daemon.log_format, stream=sys.stderr)
        if self.actions is not None and (new.ras, new.stacks.py_spy) != (
            self.config.ras,
            self.config.stacks.py_spy,
        ):
            retarget_captures(self.actions, new)  # the bundles to come ask the new RAS address
        if new.actions.mode != self.config.actions.mode:
            self.mode = new.actions.mode
        if self.app is not None:
            from gpu_triage.serving.api import set_token

            set_token(self.app, token)  # a rotated token file takes effect now; the old one stops
            if token_file_absent(new):
                log.warning("%s", missing_token_note(new))
            else:
                log.info("auth token re-read from %s", new.auth.token_file)
        self.config = new
        self._event("daemon", {"event": "reloaded", "config": new.origin})
        self.notifier.ready("configuration reloaded")
        log.info("configuration reloaded from %s", new.origin)

    def clock_step(self, step: ClockStep) -> None:
        """The wall clock jumped: logged and recorded; no duration moves (they are on the timeline)."""
        self.recorder.clock_step(step)

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
        self.observer.close()  # before the source: the health signal's NVML reader uses its workers
        try:
            self.source.close()
        except Exception:
            log.exception("closing the telemetry source")
        if self.store is not None:
            self.store.close()
        if self._state_lock is not None:
            self._state_lock.release()
            self._state_lock = None

    # -- the loop -------------------------------------------------------------------------------
    def run_forever(self) -> None:
        period = self.config.daemon.period_s
        self.notifier.ready(f"watching {len(self.source.gpus())} GPU(s) from {self.source.name}")
        monotonic = self.monotonic  # looked up once: the loop reads it twice a cycle
        build = self.on_cycle is not None
        next_tick = monotonic()
        self._slack_s = period / 2
        while not self._stop.is_set():
            if self._reload.is_set():
                self._reload.clear()
                self.reload()
                period = self.config.daemon.period_s
                self._slack_s = period / 2
            t0 = monotonic()
            self._tick(build=build, batch=True)  # the snapshot is built when first read
            now_m = monotonic()
            stats = self.stats
            stats.last_duration_s = now_m - t0
            if self.notifier.watchdog_due(now_m):
                self.notifier.watchdog(now_m)
            next_tick += period
            lateness = now_m - next_tick
            if lateness > 0:
                missed = int(lateness // period) + 1
                stats.missed += missed
                stats.worst_lateness_s = max(stats.worst_lateness_s, lateness)
                next_tick += missed * period
            # Asleep until the next deadline or stop(): a lock's timed acquire is one call where an
            # Event's wait builds a condition each time (~0.02 % of a core at 10 Hz, issue 30).
            if self._wake.acquire(timeout=max(0.0, next_tick - now_m)):
                self._wake.release()  # stopped: every later sleep returns at once

    def tick(self) -> Snapshot | None:
        """One cycle of the loop at the clock's time: a clock step is noticed (and moves nothing), then
        :meth:`cycle` runs on the timeline; a failed cycle is counted, never raised (None)."""
        return self._tick(build=True)

    def publish_due(self, now: float) -> bool:
        """Whether a cycle at ``now`` classifies what was sampled since the last published cycle and
        publishes (``daemon.publish_period_s`` after it), or only samples."""
        last = self._last_publish_s
        return last is None or now - last >= self.config.daemon.publish_period_s - self._slack_s

    def _tick(self, *, build: bool, batch: bool = False) -> Snapshot | None:
        """:meth:`tick`; ``build`` False: the cycle's snapshot is published unbuilt (None returned).
        ``batch`` (the running loop): a cycle before :meth:`publish_due` only samples (None)."""
        if batch:
            now = self.clock()
            if not self.publish_due(now):
                self._guarded(self._sample_only, now)
                return None
        step = self.timeline.check_step()
        if step is not None:
            self.clock_step(step)
        return self._guarded(self._cycle, self.clock(), self.timeline.wall(), build=build)

    def _guarded(self, run: Callable[..., Snapshot | None], *args: Any, **kwargs: Any) -> Snapshot | None:
        """``run`` a cycle: a failed one is counted, never raised (None); a success after failures ends
        them (the health book has nothing to reset else)."""
        try:
            snap = run(*args, **kwargs)
        except Exception as e:
            self._cycle_failed(e)
            return None
        if self.health.failed_cycles:
            self._cycle_failed(None)
        return snap

    def _sample_only(self, now: float) -> None:
        """A cycle between two publishes: the GPUs read, the samples kept for the next published one."""
        self.cycle_no += 1
        self._pending.append((now, self._sample(now)))
        self.stats.cycles += 1

    def _cycle_failed(self, error: Exception | None) -> None:
        """Count consecutive failed cycles (daemon/health.py): /healthz turns 503 ``failing``."""
        self.health.cycle_failed(
            error,
            cycle_no=self.cycle_no,
            snapshots=self.snapshots,
            first_failing=self._failing_snapshot,
            event=self._event,
        )

    def _failing_snapshot(self, failed_cycles: int) -> Snapshot:
        """What /healthz reads when no cycle ever succeeded: ``failing``, not ``starting`` forever."""
        return Snapshot(
            node=self.node,
            source=self.source.name,
            mode=self.mode,
            armed=self.mode is not Mode.OBSERVE,
            cycle=self.cycle_no,
            time=self.started_at,
            period_s=self.config.daemon.period_s,
            started_at=self.started_at,
            version=__version__,
            failed_cycles=failed_cycles,
        )

    def cycle(self, now: float, *, wall: float | None = None) -> Snapshot:
        """One cycle at ``now`` on the daemon's timeline (gpu_triage.model.clock); ``wall``: the wall clock
        now, to place the times read from progress files (None: the same as ``now``, as in tests that
        drive cycles by hand). Returns (and publishes) the snapshot."""
        snap = self._cycle(now, wall, build=True)
        assert snap is not None
        return snap

    def _cycle(self, now: float, wall: float | None, *, build: bool) -> Snapshot | None:
        """:meth:`cycle`. ``build`` False (the loop without ``on_cycle``): the snapshot is published
        unbuilt, made when first read (serving/publish.py) - 10 cycles a second, a scrape every few
        seconds; None is returned."""
        cfg = self.config
        self._wall = now if wall is None else wall
        self.cycle_no += 1
        for cmd in self.control.drain():
            if cmd.mode is not self.mode:
                self._event("action", {"action": "mode", "from": str(self.mode), "to": str(cmd.mode)}, now)
            self.mode = cmd.mode
        pending, self._pending = self._pending, []
        self._last_publish_s = now
        samples = self._sample(now)
        pending.append((now, samples))
        for at, taken in pending:  # each sample classified at its own time
            for ch in self.gpus.update(at, taken):
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
                    at,
                    gpu=ch.gpu,
                )
        gpu_rows = self.gpus.status_inputs()
        health_before = self.node_health
        self._node_facts(now)
        last_process = self._last_process_s
        due = last_process is None or now - last_process >= cfg.daemon.process_period_s - self._slack_s
        statuses = status_rows(gpu_rows) if due else None  # the rows, made each process period
        if due:
            assert statuses is not None
            self._last_process_s = now
            self._jobs = self.observer.pods.attribute(self._detect(now, samples, statuses))
        if self.actions is not None and statuses is not None:
            try:
                self.actions.on_cycle(
                    Cycle(
                        now,
                        self.mode,
                        jobs=self._jobs,
                        processes=self.observer.processes,
                        gpus=statuses,
                        silences=self.control.silences,
                        progress_dir=cfg.progress.dir,
                        node_health=self.node_health,
                    )
                )
                self.health.actions_ran(None)
            except Exception as e:
                self.health.actions_ran(e)
        action_counters = self._action_counters
        if due or action_counters is None:  # actions run (and count) each process period
            action_counters = {} if self.actions is None else self.actions.counters
            self._action_counters = action_counters
        self.recorder.persist_silences(self.control.silences, now)
        if self.store is not None:
            self.store.maybe_reattach(now)
            self.store.maybe_prune(now)
        self.stats.cycles += 1
        signals = self.observer.signals
        signal_errors, node_errors = signals.errors, signals.node_errors
        if node_errors:  # merged only when there is something to merge (nearly never)
            signal_errors = {**signal_errors, **node_errors} if signal_errors else node_errors
        input_errors = self.health.input_errors(
            progress_errors=self.observer.progress_errors,
            job_errors=self.detector.job_errors,
            persist_errors=self.recorder.persist_errors,
            signal_errors=signal_errors,
            store=self.store,
        )
        if due or self._signal_status is None or self.node_health is not health_before:
            # the signals' status changes with their facts (each process period) or the node's health:
            # asked then, not 10 times a second
            self._signal_status = self.observer.signals.status()
        make = self._snapshot_maker(now, gpu_rows, statuses, action_counters, input_errors)
        if not build:
            self.snapshots.publish_lazy(self.cycle_no, make)
            return None
        snap = make()
        self.snapshots.publish(snap)
        if self.on_cycle is not None:
            self.on_cycle(snap)
        return snap

    def _sample(self, now: float) -> list[GpuSample]:
        """Read the GPUs (each cycle, published or not)."""
        t0 = time.perf_counter()
        samples = self.source.sample(now)
        self._sample_duration_s = time.perf_counter() - t0
        if samples:
            self._last_sample_time = now
        return samples

    def _snapshot_maker(
        self,
        now: float,
        gpu_rows: StatusInputs,
        statuses: tuple[GpuStatus, ...] | None,
        action_counters: dict[tuple[str, str], int],
        input_errors: tuple[dict[str, Any], ...],
    ) -> Callable[[], Snapshot]:
        """What makes this cycle's snapshot: every value it holds taken now (none changes after: the
        objects taken are replaced, never changed, by later cycles), the GPU rows and the Snapshot made
        by whoever calls it first (the loop, or a reader's thread). One partial, 10 times a second; the
        fields are put together by :func:`_make_snapshot` (by keyword: several are floats, and a swap
        would pass every type check)."""
        stats = self.stats
        return partial(
            _make_snapshot,
            self,
            mode=self.mode,
            cycle_no=self.cycle_no,
            now=now,
            period_s=self.config.daemon.period_s,
            jobs=self._jobs,
            sample_duration_s=self._sample_duration_s,
            last_sample_time=self._last_sample_time,
            counts=(stats.cycles, stats.missed, stats.failed, self.health.degraded_cycles),
            action_counters=action_counters,
            untrusted=self.observer.untrusted,
            input_errors=input_errors,
            signal_status=self._signal_status,
            fleet=self.observer.fleet_facts,
            node_health=self.node_health,
            wall=self._wall,
            gpu_rows=gpu_rows,
            statuses=statuses,
        )

    def _node_facts(self, now: float) -> None:
        """Every cycle, jobs or none: the node-level signals' facts (the node verdict); a change of the
        node's or a GPU's health level is an event."""
        facts = self.observer.signals.node_facts(now)
        before, after = self.node_health, facts.get("node_health", UNKNOWN_HEALTH)
        if after is before or not isinstance(after, NodeHealth):
            return  # the same verdict (the health book keeps it while nothing changed)
        self.node_health = after
        was = {g.gpu: g.level for g in before.gpus}
        for g in after.gpus:
            old = was.get(g.gpu, HealthLevel.HEALTHY)
            if g.level is not old:
                payload = {"level": str(g.level), "from": str(old), "pci_bus_id": g.pci_bus_id}
                self._event("health", {**payload, "reasons": list(g.reasons)}, now, gpu=g.gpu)
                log.log(
                    logging.WARNING if g.level is not HealthLevel.HEALTHY else logging.INFO,
                    "health: GPU %s (%s) %s -> %s%s",
                    g.gpu,
                    g.pci_bus_id or "bus unknown",
                    old,
                    g.level,
                    f": {'; '.join(g.reasons[:3])}" if g.reasons else "",
                )
        if after.level is not before.level:
            self._event("health", {"node": str(after.level), "from": str(before.level)}, now)

    def _detect(
        self, now: float, samples: Sequence[GpuSample], statuses: Sequence[GpuStatus]
    ) -> tuple[JobStatus, ...]:
        """Every process period: observe the jobs (daemon/observe.py), judge them, record what changed."""
        gviews, jobs = self.observer.observe(
            now,
            samples,
            statuses,
            wall=self._wall,
            verdicts=self.recorder.verdicts,
            signalled=self.actions.signalled_pids if self.actions is not None else None,
        )
        results = tuple(
            self.detector.update(
                now, gviews, jobs, telemetry_ok=self.source.name != "none", node_health=self.node_health
            )
        )
        self.recorder.persist_episode_state(now, self.observer.progress.tracker, self.detector)
        self.observer.export_facts(now, jobs, results, statuses, self.detector.config)
        self.recorder.verdict_changes(results, now)
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
        self.recorder.event(kind, payload, now, gpu=gpu, job=job)


def _make_snapshot(
    daemon: Daemon,
    *,
    mode: Mode,
    cycle_no: int,
    now: float,
    period_s: float,
    jobs: tuple[JobStatus, ...],
    sample_duration_s: float,
    last_sample_time: float | None,
    counts: tuple[int, int, int, int],
    action_counters: dict[tuple[str, str], int],
    untrusted: Any,
    input_errors: tuple[dict[str, Any], ...],
    signal_status: dict[str, Any] | None,
    fleet: Any,
    node_health: NodeHealth,
    wall: float | None,
    gpu_rows: StatusInputs,
    statuses: tuple[GpuStatus, ...] | None,
) -> Snapshot:
    """One cycle's snapshot from the values :meth:`Daemon._snapshot_maker` took at its end (the
    daemon's node, source and start time do not change while it runs)."""
    cycles, missed, failed, degraded = counts
    signals = dict(signal_status or {})
    return Snapshot(
        gpus=statuses if statuses is not None else status_rows(gpu_rows),
        node=daemon.node,
        source=daemon.source.name,
        mode=mode,
        armed=mode is not Mode.OBSERVE,
        cycle=cycle_no,
        time=now,
        period_s=period_s,
        jobs=jobs,
        sample_duration_s=sample_duration_s,
        last_sample_time=last_sample_time,
        started_at=daemon.started_at,
        counters={
            "cycles_total": float(cycles),
            "missed_cycles_total": float(missed),
            "failed_cycles_total": float(failed),
            "degraded_cycles_total": float(degraded + failed),
        },
        actions=action_counters,
        version=__version__,
        untrusted_progress_files=untrusted,
        input_errors=input_errors,
        stacks=signals.pop("stacks", {}),
        fleet=fleet,
        cluster=signals.pop("cluster", {}),
        signals=signals,
        node_health=node_health,
        clock_offset_s=(wall if wall is not None else now) - now,
    )


__all__ = ["Daemon"]
