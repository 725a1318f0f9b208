"""What the daemon is built from: the parts its :class:`~gpu_triage.daemon.loop.Daemon` constructs from
the ``Config`` (stack sampler, NCCL RAS poller, fleet poller, detector settings, action engine, HTTP
server, the state-directory lock) and the checks ``run`` and ``check-config`` make before a first cycle."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_triage.classify.tracker import GpuTracker
from gpu_triage.daemon.config import (
    Config,
    ConfigError,
    detector_config,
    load_token,
    missing_token_note,
    token_file_absent,
)
from gpu_triage.daemon.state_lock import StateLock
from gpu_triage.model.samples import TelemetrySource
from gpu_triage.signals.fleet.poller import FleetPoller, PollerConfig
from gpu_triage.signals.health.monitor import HealthMonitor
from gpu_triage.signals.nccl_ras.poller import RasPoller
from gpu_triage.signals.progress import ProgressReader
from gpu_triage.signals.stacks.sampler import SamplerConfig, StackSampler
from gpu_triage.verdicts.detector import DetectorConfig

if TYPE_CHECKING:
    from gpu_triage.daemon.loop import Daemon

log = logging.getLogger("gpu_watchdog")


def boot_id() -> str | None:
    """The kernel's boot id (the monotonic clock restarts with it), None where unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read(64).strip() or None
    except OSError:
        return None


def check_token(config: Config) -> None:
    """The token file, as :meth:`Daemon.start` loads it (ConfigError naming ``auth.token_file``)."""
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


def make_tracker(config: Config) -> GpuTracker:
    c = config.classifier
    return GpuTracker(model=c.model, table_path=c.table, dwell_s=dict(c.dwell_s))


def make_reader(config: Config) -> ProgressReader:
    p = config.progress
    return ProgressReader(p.dir, stale_after_s=p.stale_after_s, host=socket.gethostname())


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


def make_ras(config: Config, clock: Callable[[], float] = time.time) -> RasPoller:
    return RasPoller(config.ras, clock=clock)


def make_health(config: Config, source: TelemetrySource) -> HealthMonitor:
    """The node health signal (``[health]``): NVML health reads and events when the source is NVML
    (under the same deadlines as its telemetry reads), the kernel log always (opened at start)."""
    reader = None
    if config.health.enabled and source.name == "nvml":
        from gpu_triage.telemetry.nvml import NvmlSource
        from gpu_triage.telemetry.nvml_health import NvmlHealthReader

        if isinstance(source, NvmlSource):
            reader = NvmlHealthReader(source)
    return HealthMonitor(config.health, [(g.gpu, g.pci_bus_id) for g in source.gpus()], reader=reader)


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


def take_state_lock(state_dir: Path) -> StateLock | None:
    """One daemon per state directory (daemon/state_lock.py): a second exits 2 naming the first."""
    from gpu_triage.daemon.state_lock import StateDirInUse, acquire

    if not state_dir.is_dir():
        return None  # a full disk kept it from being made: nothing to share yet
    try:
        lock = acquire(state_dir)
    except StateDirInUse as e:
        raise ConfigError([str(e)]) from None
    except OSError as e:
        raise ConfigError(
            [f"daemon.state_dir: cannot open the lock file in {state_dir}: {e.strerror}"]
        ) from None
    if lock is None:
        log.error("state directory %s: no room for the lock file (a full disk); running unlocked", state_dir)
    return lock


def make_actions(d: Daemon, state_dir: Path) -> Any:
    """The action engine (alerts, kill ladder), or None without a store (its outbox and kill budget
    live there)."""
    from gpu_triage.actions.engine import ActionEngine

    if d.store is None:
        return None
    return ActionEngine(
        actions=d.config.actions,
        alerts=d.config.alerts,
        store=d.store,
        state_dir=state_dir,
        node=d.node,
        generator_url=f"http://{d.config.daemon.listen}/status",
        max_bundles=d.config.evidence.max_bundles,
        evidence_retention_s=d.config.evidence.retention_days * 86400.0,
        clock=d.clock,
    )


def start_http(d: Daemon) -> None:
    """The REST API and /metrics on ``daemon.listen``, serving the daemon's published snapshots."""
    from gpu_triage.serving.api import create_app
    from gpu_triage.serving.http_server import HttpServer

    config = d.config
    host, _, port = config.daemon.listen.rpartition(":")
    token = load_token(config)
    if token_file_absent(config):
        log.warning("%s", missing_token_note(config))
    app = create_app(
        snapshots=d.snapshots,
        events=d.store,
        table=lambda: table_doc(d.gpus),
        control=d.control,
        token=token,
        period_s=config.daemon.period_s,
        clock=d.clock,
        allowed_hosts=[
            *config.daemon.allowed_hosts,
            d.node,
            socket.gethostname(),
            socket.getfqdn(),  # once, at start (/etc/hosts or DNS)
            host.strip("[]"),
        ],
    )
    d._app = app
    d.http = HttpServer(app, host.strip("[]") or "127.0.0.1", int(port))
    d.http.start()


def table_doc(gpus: GpuTracker) -> dict[str, Any]:
    """The power tables in use (GET /table)."""
    tables = gpus.tables()
    if not tables:
        return {"tables": []}
    distinct = {t.model: t for t in tables.values()}
    first = next(iter(distinct.values()))
    doc = first.to_dict()
    doc["gpus"] = {str(g): t.model for g, t in tables.items()}
    if len(distinct) > 1:
        doc["others"] = [t.to_dict() for t in list(distinct.values())[1:]]
    return doc
