"""``[health]``: the node health signal - the kernel log, NVML health polls and events - producing one
:class:`~gpu_triage.model.health.NodeHealth` per cycle.

:meth:`HealthMonitor.sample` never blocks the cycle and never raises: the kernel log is read
non-blocking (at most :data:`~gpu_triage.signals.health.kernel_log.MAX_LINES_PER_POLL` lines a cycle),
NVML health reads run under the telemetry deadline (the reader given, ``telemetry/nvml_health``), the
NVML event set waits on its own thread. A reader that fails is named in ``read_errors`` and the
verdict rests on the others.

The kernel log source (``kernel_log``):

- ``auto`` - ``/dev/kmsg``; where it cannot be opened, ``journalctl -k -f``; where neither, none
  (said in :meth:`HealthMonitor.status`);
- ``kmsg``, ``journal`` - that one only; ``off`` - none.

``kernel_log_file`` names a log FILE read besides (from its start, followed as it grows): the kernel
log of a replayed recording, or lines fed to a simulation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from gpu_triage.model.config_checks import boolean, choice, integer, number, optional_path
from gpu_triage.model.config_schema import setting
from gpu_triage.model.health import (
    UNKNOWN_HEALTH,
    FaultSource,
    HardwareEvent,
    HealthReader,
    NodeHealth,
)
from gpu_triage.model.names import printable
from gpu_triage.signals.health.book import BookSettings, HealthBook
from gpu_triage.signals.health.catalog import CatalogError, load_catalog
from gpu_triage.signals.health.kernel_log import (
    MAX_LINES_PER_POLL,
    FileReader,
    JournalReader,
    KmsgReader,
    parse_line,
)

log = logging.getLogger("gpu_watchdog")

KERNEL_LOG_CHOICES = ("auto", "kmsg", "journal", "off")


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """The node's hardware health: Xid and ECC events, NVML health polls, the kernel log."""

    enabled: bool = setting(True, parse=boolean, doc="read the node's hardware health (Xid, ECC, NVLink...)")
    kernel_log: str = setting(
        "auto",
        parse=choice(*KERNEL_LOG_CHOICES),
        doc="kernel log source: auto (/dev/kmsg, else journalctl -k), kmsg, journal or off",
    )
    kernel_log_file: Path | None = setting(
        None, parse=optional_path, doc="a kernel log file read besides (sim and replay sources)"
    )
    poll_interval_s: float = setting(5.0, parse=number(0.5, 3600), doc="NVML health poll interval")
    event_hold_s: float = setting(
        3600.0, parse=number(1, 30 * 86400), doc="an Xid or counter rise counts this long after last seen"
    )
    ecc_correctable_burst: int = setting(
        100, parse=integer(1, 10**9), doc="correctable ECC errors in one poll that degrade a GPU"
    )
    nvlink_error_burst: int = setting(
        100, parse=integer(1, 10**9), doc="NVLink CRC or replay errors in one poll that degrade a GPU"
    )
    xid_catalog: Path | None = setting(
        None, parse=optional_path, doc="a site's Xid catalog replacing the built-in one (the same format)"
    )


class LineSource(Protocol):
    name: str
    overruns: int
    lines_read: int
    last_error: str | None

    def poll(self, max_lines: int = ...) -> list[str]: ...

    def close(self) -> None: ...


def open_kernel_log(choice_: str) -> tuple[LineSource | None, str | None]:
    """The kernel log reader ``choice_`` names, or (None, why not)."""
    if choice_ == "off":
        return None, "off"
    problems: list[str] = []
    if choice_ in ("auto", "kmsg"):
        try:
            return KmsgReader(), None
        except OSError as e:
            problems.append(f"/dev/kmsg: {e.strerror or e}")
    if choice_ in ("auto", "journal"):
        try:
            return JournalReader(), None
        except OSError as e:
            problems.append(f"journalctl: {e.strerror or e}")
    return None, "; ".join(problems)


class HealthMonitor:
    """The health signal: build, :meth:`sample` once per cycle, :meth:`close`.

    ``gpus``: (index, PCI bus id) of the node's GPUs. ``reader``: NVML health reads and events (None
    for the sim, replay and none sources: the kernel log is then the only source).
    ``kernel_log``: a reader to use instead of the one ``config.kernel_log`` names (tests).
    """

    def __init__(
        self,
        config: HealthConfig = HealthConfig(),
        gpus: Iterable[tuple[int, str | None]] = (),
        *,
        reader: HealthReader | None = None,
        kernel_log: LineSource | None = None,
        open_log: Callable[[str], tuple[LineSource | None, str | None]] = open_kernel_log,
    ) -> None:
        self.config = config
        self.reader = reader
        self.book = HealthBook(gpus, _settings(config))
        self._sources: list[LineSource] = []
        self._given_log = kernel_log
        self._open_log = open_log
        self.kernel_log_problem: str | None = None
        self.opened = False
        self._last_poll: float | None = None
        self.events_total = 0
        self.latest: NodeHealth = UNKNOWN_HEALTH

    def open(self) -> None:
        """Open the kernel log sources (the daemon's start; a cycle before it reads NVML only)."""
        if self.opened or not self.config.enabled:
            return
        self.opened = True
        if self._given_log is not None:
            self._sources.append(self._given_log)
        else:
            source, problem = self._open_log(self.config.kernel_log)
            if source is not None:
                self._sources.append(source)
            elif problem != "off":
                self.kernel_log_problem = problem
                log.warning("health: no kernel log (%s): Xids only from NVML events", problem)
        if self.config.kernel_log_file is not None:
            self._sources.append(FileReader(self.config.kernel_log_file))

    def set_gpus(self, gpus: Iterable[tuple[int, str | None]]) -> None:
        self.book.set_gpus(gpus)

    def reconfigure(self, config: HealthConfig) -> None:
        """SIGHUP: the thresholds and hold time change live; the sources need a restart."""
        self.config = config
        self.book.settings = _settings(config)

    def sample(self, now: float) -> NodeHealth:
        """This cycle's node verdict. Never raises: a failing reader becomes a read error."""
        if not self.config.enabled:
            self.latest = UNKNOWN_HEALTH
            return self.latest
        errors: list[str] = []
        for source in self._sources:
            try:
                lines = source.poll(MAX_LINES_PER_POLL)
            except Exception as e:  # one reader never blinds the others
                errors.append(f"kernel log ({source.name}): {printable(e)}")
                continue
            if source.last_error:
                errors.append(f"kernel log ({source.name}): {source.last_error}")
            for line in lines:
                self._line(line, now)
        if self.reader is not None:
            try:
                for event in self.reader.events():
                    self.book.add_event(replace(event, at=now))  # onto the daemon's timeline
                    self.events_total += 1
                due = self._last_poll is None or now - self._last_poll >= self.config.poll_interval_s - 1e-6
                if due:
                    self._last_poll = now
                    self.book.add_readings(self.reader.read(now), now)
            except Exception as e:
                errors.append(f"nvml health: {printable(e)}")
        if self.kernel_log_problem:
            errors.append(f"kernel log: {self.kernel_log_problem}")
        self.latest = self.book.node_health(now, tuple(errors))
        return self.latest

    def _line(self, line: str, now: float) -> None:
        parsed = parse_line(line)
        if parsed is None:
            return
        self.events_total += 1
        self.book.add_event(
            HardwareEvent(
                kind=parsed.kind,
                source=FaultSource.KERNEL_LOG,
                at=now,
                pci_bus_id=parsed.pci_bus_id,
                xid=parsed.xid,
                text=parsed.text,
            )
        )

    def status(self) -> dict[str, Any]:
        return {
            "enabled": self.config.enabled,
            "level": str(self.latest.level),
            "kernel_log": [
                {
                    "source": s.name,
                    "lines_read": s.lines_read,
                    "overruns": s.overruns,
                    "last_error": s.last_error,
                }
                for s in self._sources
            ],
            "kernel_log_problem": self.kernel_log_problem,
            "nvml": self.reader.status() if self.reader is not None else None,
            "events_total": self.events_total,
            "held_dropped_total": self.book.dropped,
        }

    def close(self) -> None:
        self.opened = True  # a closed monitor opens nothing more
        for source in self._sources:
            try:
                source.close()
            except Exception:
                log.exception("closing the kernel log reader")
        self._sources = []
        if self.reader is not None:
            try:
                self.reader.close()
            except Exception:
                log.exception("closing the NVML health reader")


def _settings(config: HealthConfig) -> BookSettings:
    try:
        entries = load_catalog(config.xid_catalog) if config.xid_catalog is not None else None
    except (CatalogError, OSError) as e:  # the start check refuses it first (daemon/build.py)
        log.error("health.xid_catalog: %s; using the built-in catalog", e)
        entries = None
    return BookSettings(
        event_hold_s=config.event_hold_s,
        ecc_correctable_burst=config.ecc_correctable_burst,
        nvlink_error_burst=config.nvlink_error_burst,
        catalog=entries,
    )


def check_catalog(config: HealthConfig) -> str | None:
    """Why ``xid_catalog`` cannot be used (None: unset, or it loads)."""
    if config.xid_catalog is None:
        return None
    try:
        load_catalog(config.xid_catalog)
    except CatalogError as e:
        return str(e)
    except OSError as e:
        return f"{config.xid_catalog}: {e.strerror or e}"
    return None


__all__ = ["KERNEL_LOG_CHOICES", "HealthConfig", "HealthMonitor", "check_catalog", "open_kernel_log"]
