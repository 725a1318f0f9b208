"""What the daemon is built from: the parts its :class:`~gpu_triage.daemon.loop.Daemon` constructs from
the ``Config`` (the GPU tracker, the action engine, the HTTP server, the state-directory lock) and the
checks ``run`` and ``check-config`` make before a first cycle. The signals build themselves from their
sections (:mod:`gpu_triage.signals.registry`)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_triage.classify.tracker import GpuTracker
from gpu_triage.daemon.config import (
    Config,
    ConfigError,
    load_token,
    missing_token_note,
    token_file_absent,
)
from gpu_triage.daemon.state_lock import StateLock
from gpu_triage.journal.eventstore import EventStore
from gpu_triage.model.health import HealthReader
from gpu_triage.model.samples import TelemetrySource
from gpu_triage.serving.control import QueuedControl
from gpu_triage.serving.publish import SnapshotHolder
from gpu_triage.signals.signal import SignalEnv

if TYPE_CHECKING:
    from gpu_triage.actions.interface import Actions
    from gpu_triage.serving.http_server import HttpServer

log = logging.getLogger("gpu_watchdog")


def check_token(config: Config) -> None:
    """The token file, as :meth:`Daemon.start` loads it (ConfigError naming ``auth.token_file``)."""
    try:
        load_token(config)
    except ConfigError as e:
        raise ConfigError([f"auth.token_file: {p}" for p in e.problems]) from None


def start_checks() -> tuple[Callable[[Config], None], ...]:
    """Every check ``run`` makes of a configuration before its first cycle (each raises ConfigError);
    ``check-config`` runs the same list, so it never approves what ``run`` refuses."""
    return (validate_classifier, check_token, validate_health)


def validate_health(config: Config) -> None:
    """A site's Xid catalog (``health.xid_catalog``) must load whole now (ConfigError naming the key)."""
    from gpu_triage.signals.health.monitor import check_catalog

    problem = check_catalog(config.health)
    if problem is not None:
        raise ConfigError([f"{config.origin}: health.xid_catalog: {problem}"])


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


def make_hardware_reader(config: Config, source: TelemetrySource) -> HealthReader | None:
    """NVML health reads and events for the ``health`` signal when the source is NVML (on the same
    per-GPU workers and deadlines as its telemetry reads); None for the other sources."""
    if not config.health.enabled or source.name != "nvml":
        return None
    from gpu_triage.telemetry.nvml import NvmlSource
    from gpu_triage.telemetry.nvml_health import NvmlHealthReader

    return NvmlHealthReader(source) if isinstance(source, NvmlSource) else None


def signal_env(config: Config, source: TelemetrySource, clock: Callable[[], float]) -> SignalEnv:
    """What the registered signals know of the daemon: the node, the timeline, the GPUs (with their
    PCI bus ids) and the hardware reads the telemetry source offers."""
    return SignalEnv(
        config.daemon.node,
        clock,
        gpus=tuple((g.gpu, g.pci_bus_id) for g in source.gpus()),
        hardware=make_hardware_reader(config, source),
        simulated=source.name.split(":", 1)[0] in ("sim", "replay"),
    )


def make_tracker(config: Config) -> GpuTracker:
    c = config.classifier
    return GpuTracker(model=c.model, table_path=c.table, dwell_s=dict(c.dwell_s))


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


def make_actions(
    config: Config, store: EventStore | None, state_dir: Path, node: str, clock: Callable[[], float]
) -> Actions | None:
    """The action engine (alerts, kill ladder), or None without a store (its outbox and kill budget
    live there)."""
    from gpu_triage.actions.config import EngineConfig
    from gpu_triage.actions.engine import ActionEngine
    from gpu_triage.actions.ports import EnginePorts

    if store is None:
        return None
    return ActionEngine(
        EngineConfig(
            node=node,
            state_dir=state_dir,
            actions=config.actions,
            evidence=config.evidence,
            alerts=config.alerts,
            ras=config.ras,
            stacks=config.stacks,
            generator_url=f"http://{config.daemon.listen}/status",
        ),
        store,
        EnginePorts(clock=clock),
    )


def retarget_captures(actions: Any, config: Config) -> None:
    """A reload's ``[ras]`` host and port and ``[stacks] py_spy`` for the evidence bundles to come."""
    from gpu_triage.signals.stacks.sampler import find_py_spy

    capture = actions.evidence_capture
    capture.ras_address = (config.ras.host, config.ras.port)
    capture.py_spy = find_py_spy(config.stacks.py_spy)  # as the engine resolves it at start


def start_http(
    config: Config,
    *,
    snapshots: SnapshotHolder,
    events: EventStore | None,
    gpus: GpuTracker,
    control: QueuedControl,
    node: str,
    clock: Callable[[], float],
) -> tuple[Any, HttpServer]:
    """The REST API and /metrics on ``daemon.listen``, serving the daemon's published snapshots: the
    app (its token changes on reload) and the started server."""
    from gpu_triage.serving.api import create_app
    from gpu_triage.serving.http_server import HttpServer

    host, _, port = config.daemon.listen.rpartition(":")
    token = load_token(config)
    if token_file_absent(config):
        log.warning("%s", missing_token_note(config))
    app = create_app(
        snapshots=snapshots,
        events=events,
        table=lambda: table_doc(gpus),
        control=control,
        token=token,
        # /healthz judges the published snapshot's age: one is published every period, or every
        # publish period where that is longer
        period_s=max(config.daemon.period_s, config.daemon.publish_period_s),
        clock=clock,
        allowed_hosts=[
            *config.daemon.allowed_hosts,
            node,
            socket.gethostname(),
            socket.getfqdn(),  # once, at start (/etc/hosts or DNS)
            host.strip("[]"),
        ],
    )
    http = HttpServer(app, host.strip("[]") or "127.0.0.1", int(port))
    http.start()
    return app, http


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
