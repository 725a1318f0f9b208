"""From hardware readings and events to findings, and from findings to the node verdict.

Pure logic (time passed in, no I/O): :class:`HealthBook` keeps what the readers reported - Xid and
fallen-off-the-bus events, the last NVML health poll of each GPU and its counters - and answers
:meth:`HealthBook.node_health` each cycle.

- An event (an Xid, a GPU fallen off the bus) is judged by the Xid catalog and held for
  ``event_hold_s`` after its last sighting; the same code on the same GPU counts up, it does not
  repeat.
- A poll's states (GPU lost, pending retirements and remaps, a remap failure, throttling, a PCIe
  width below its maximum, links down, the fabric state) hold while the poll says so.
- A poll's counters (volatile ECC, NVLink CRC/replay/recovery) count from the first poll: a rise is a
  finding held like an event (an uncorrectable ECC error at once, correctable ones and link errors
  from a burst of ``ecc_correctable_burst`` / ``nvlink_error_burst`` within one poll).

PCIe *generation* below its maximum is not judged: boards drop the link speed when idle to save
power; the width does not change by itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpu_triage.model.health import (
    HEALTH_ORDER,
    Blame,
    FaultKind,
    FaultSource,
    GpuHealth,
    GpuHealthReading,
    HardwareEvent,
    HardwareFinding,
    HealthLevel,
    NodeHealth,
    OperatorAction,
    XidCount,
    pci_key,
    worst,
)
from gpu_triage.signals.health.catalog import XidEntry, judge

#: NVML clock event (throttle) reason bits (``nvmlClocksEventReason*``).
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
#: ``nvmlGpuFabricState_t``: completed is the healthy end state.
FABRIC_NOT_SUPPORTED = 0
FABRIC_COMPLETED = 3
#: Distinct held findings kept at most (a flood of distinct codes on distinct GPUs stays bounded).
MAX_HELD = 4096


@dataclass(frozen=True, slots=True)
class BookSettings:
    event_hold_s: float = 3600.0
    ecc_correctable_burst: int = 100
    nvlink_error_burst: int = 100
    catalog: dict[int, XidEntry] | None = None
    """A site's Xid catalog (``[health] xid_catalog``); None: the built-in one."""


@dataclass(slots=True)
class _Counters:
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    nvlink: dict[str, int] = field(default_factory=dict)


class HealthBook:
    """What the readers reported, and the node verdict from it. Not thread-safe: the loop owns it."""

    def __init__(
        self, gpus: Iterable[tuple[int, str | None]] = (), settings: BookSettings = BookSettings()
    ) -> None:
        self.settings = settings
        self._version = 0
        """Bumped by every change of what :meth:`node_health` reads (the daemon asks 10 times a second)."""
        self._gpus: dict[int, str | None] = {}
        self._by_bus: dict[tuple[int, int, int], int] = {}
        self.set_gpus(gpus)
        self._held: dict[tuple[int | None, str | None, FaultKind, int | None], HardwareFinding] = {}
        self._polled: dict[int, tuple[HardwareFinding, ...]] = {}
        self._counters: dict[int, _Counters] = {}
        self._xid_totals: dict[tuple[int | None, str | None, int], int] = {}
        self._xid_by_source: dict[tuple[int | None, str | None, int], dict[FaultSource, int]] = {}
        """Sightings per source: NVML's event and the kernel log report the same Xid, so an
        occurrence counts once - the count is the most any one source saw."""
        self._held_by_source: dict[
            tuple[int | None, str | None, FaultKind, int | None], dict[FaultSource, int]
        ] = {}
        self.read_errors: tuple[str, ...] = ()
        self.dropped = 0
        """Held findings refused because :data:`MAX_HELD` were held."""
        self._verdict: tuple[tuple[int, BookSettings, tuple[str, ...]], float, NodeHealth] | None = None
        """The last verdict: (version, settings, extra errors) it was made from, and until when it holds
        (the first held finding's expiry)."""

    def set_gpus(self, gpus: Iterable[tuple[int, str | None]]) -> None:
        """The node's GPUs: index and PCI bus id (the kernel log names a GPU by its bus id)."""
        self._gpus = {int(g): bus for g, bus in gpus}
        self._by_bus = {}
        self._version += 1
        for g, bus in self._gpus.items():
            key = pci_key(bus)
            if key is not None:
                self._by_bus[key] = g

    def gpu_of(self, pci_bus_id: str | None) -> int | None:
        key = pci_key(pci_bus_id)
        return None if key is None else self._by_bus.get(key)

    # -- events -------------------------------------------------------------------------------------

    def add_event(self, event: HardwareEvent) -> HardwareFinding:
        """Judge one event (the catalog for an Xid) and hold it; returns the finding as held now."""
        self._version += 1
        gpu = event.gpu if event.gpu is not None else self.gpu_of(event.pci_bus_id)
        bus = event.pci_bus_id or (self._gpus.get(gpu) if gpu is not None else None)
        if event.kind is FaultKind.XID and event.xid is not None:
            entry = judge(event.xid, event.text, self.settings.catalog)
            finding = _xid_finding(entry, event, gpu, bus)
            tkey = (gpu, bus if gpu is None else None, event.xid)
            seen = self._xid_by_source.setdefault(tkey, {})
            seen[event.source] = seen.get(event.source, 0) + 1
            self._xid_totals[tkey] = max(seen.values())
        elif event.kind is FaultKind.FALLEN_OFF_BUS:
            finding = HardwareFinding(
                kind=FaultKind.FALLEN_OFF_BUS,
                level=HealthLevel.UNHEALTHY,
                blame=Blame.NODE,
                action=OperatorAction.DRAIN_NODE,
                detail="GPU has fallen off the bus (kernel log)",
                source=event.source,
                gpu=gpu,
                pci_bus_id=bus,
            )
        else:
            finding = HardwareFinding(
                kind=event.kind,
                level=HealthLevel.DEGRADED,
                blame=Blame.UNKNOWN,
                action=OperatorAction.UNKNOWN,
                detail=event.text or str(event.kind),
                source=event.source,
                gpu=gpu,
                pci_bus_id=bus,
            )
        return self._hold(finding, event.at)

    def _hold(self, finding: HardwareFinding, at: float) -> HardwareFinding:
        key = (finding.gpu, finding.pci_bus_id if finding.gpu is None else None, finding.kind, finding.xid)
        old = self._held.get(key)
        if old is None and len(self._held) >= MAX_HELD:
            self.dropped += 1
            return finding
        seen = self._held_by_source.setdefault(key, {})
        seen[finding.source] = seen.get(finding.source, 0) + 1
        if old is not None:
            held = replace(
                old, count=max(seen.values()), last_seen=at, level=finding.level, action=finding.action
            )
        else:
            held = replace(finding, first_seen=at, last_seen=at)
        self._held[key] = held
        return held

    # -- polls --------------------------------------------------------------------------------------

    def add_readings(self, readings: Iterable[GpuHealthReading], now: float) -> None:
        """One NVML health poll: replaces each polled GPU's state findings, counts its counters."""
        self._version += 1
        errors: list[str] = []
        for r in readings:
            self._polled[r.gpu] = tuple(self._states(r))
            for f in self._counter_findings(r):
                self._hold(f, now)
            errors.extend(f"gpu {r.gpu}: {e}" for e in r.errors)
        self.read_errors = tuple(errors)

    def _finding(
        self,
        r: GpuHealthReading,
        kind: FaultKind,
        level: HealthLevel,
        action: OperatorAction,
        detail: str,
        blame: Blame = Blame.NODE,
    ) -> HardwareFinding:
        return HardwareFinding(
            kind=kind,
            level=level,
            blame=blame,
            action=action,
            detail=detail,
            source=FaultSource.NVML_POLL,
            gpu=r.gpu,
            pci_bus_id=r.pci_bus_id or self._gpus.get(r.gpu),
        )

    def _states(self, r: GpuHealthReading) -> list[HardwareFinding]:
        """The states one poll reads: a lost GPU alone, else memory, throttling, PCIe and links."""
        if r.lost:
            return [self._finding(r, *_LOST)]
        out = [self._finding(r, *judged) for judged in _memory_states(r) + _throttle_states(r)]
        if r.pcie_width is not None and r.pcie_width_max and r.pcie_width < r.pcie_width_max:
            gen = (
                f", gen {r.pcie_gen} of {r.pcie_gen_max}" if r.pcie_gen is not None and r.pcie_gen_max else ""
            )
            detail = f"PCIe x{r.pcie_width} of x{r.pcie_width_max}{gen}"
            out.append(
                self._finding(r, FaultKind.PCIE_DEGRADED, HealthLevel.DEGRADED, OperatorAction.NONE, detail)
            )
        out.extend(self._finding(r, *judged, Blame.NETWORK) for judged in _fabric_states(r))
        return out

    def _counter_findings(self, r: GpuHealthReading) -> list[HardwareFinding]:
        out: list[HardwareFinding] = []
        c = self._counters.setdefault(r.gpu, _Counters())
        s = self.settings
        rise = _rise(c.ecc_uncorrected, r.ecc_volatile_uncorrected)
        if rise > 0:
            out.append(
                self._finding(
                    r,
                    FaultKind.ECC_UNCORRECTABLE,
                    HealthLevel.UNHEALTHY,
                    OperatorAction.DRAIN_NODE,
                    f"{rise} uncorrectable ECC error(s)",
                )
            )
        rise = _rise(c.ecc_corrected, r.ecc_volatile_corrected)
        if rise >= s.ecc_correctable_burst:
            out.append(
                self._finding(
                    r,
                    FaultKind.ECC_CORRECTABLE,
                    HealthLevel.DEGRADED,
                    OperatorAction.NONE,
                    f"{rise} correctable ECC errors in one poll",
                )
            )
        if r.ecc_volatile_uncorrected is not None:
            c.ecc_uncorrected = r.ecc_volatile_uncorrected
        if r.ecc_volatile_corrected is not None:
            c.ecc_corrected = r.ecc_volatile_corrected
        for name, value in (
            ("CRC", r.nvlink_crc_errors),
            ("replay", r.nvlink_replay_errors),
            ("recovery", r.nvlink_recovery_errors),
        ):
            rise = _rise(c.nvlink.get(name), value)
            if rise >= (1 if name == "recovery" else s.nvlink_error_burst):
                out.append(
                    self._finding(
                        r,
                        FaultKind.NVLINK_ERRORS,
                        HealthLevel.DEGRADED,
                        OperatorAction.CHECK_FABRIC,
                        f"NVLink {name} errors +{rise}",
                        Blame.NETWORK,
                    )
                )
            if value is not None:
                c.nvlink[name] = value
        return out

    # -- the verdict --------------------------------------------------------------------------------

    def node_health(self, now: float, extra_errors: tuple[str, ...] = ()) -> NodeHealth:
        """The node verdict at ``now``: held findings younger than ``event_hold_s`` plus the polled
        states; each GPU's level is its worst finding, the node's the worst of all. Made again only
        when something it reads changed or a held finding expired; else the last one is returned."""
        key = (self._version, self.settings, extra_errors)
        memo = self._verdict
        if memo is not None and memo[0] == key and now <= memo[1]:
            return memo[2]
        verdict = self._node_health(now, extra_errors)
        hold_s = self.settings.event_hold_s
        holds_until = min((f.last_seen + hold_s for f in self._held.values()), default=math.inf)
        self._verdict = (key, holds_until, verdict)
        return verdict

    def _node_health(self, now: float, extra_errors: tuple[str, ...]) -> NodeHealth:
        hold_s = self.settings.event_hold_s
        for key in [k for k, f in self._held.items() if now - f.last_seen > hold_s]:
            del self._held[key]
            self._held_by_source.pop(key, None)
        per_gpu: dict[int, list[HardwareFinding]] = {g: [] for g in self._gpus}
        node_wide: list[HardwareFinding] = []
        for finding in (*self._held.values(), *(f for fs in self._polled.values() for f in fs)):
            if finding.gpu is None:
                node_wide.append(finding)
            else:
                per_gpu.setdefault(finding.gpu, []).append(finding)
        gpus = tuple(
            GpuHealth(
                gpu=g,
                pci_bus_id=self._gpus.get(g),
                level=worst([f.level for f in fs]),
                findings=tuple(sorted(fs, key=_order)),
            )
            for g, fs in sorted(per_gpu.items())
        )
        levels = [g.level for g in gpus] + [f.level for f in node_wide]
        return NodeHealth(
            level=worst(levels),
            gpus=gpus,
            findings=tuple(sorted(node_wide, key=_order)),
            read_errors=(*self.read_errors, *extra_errors),
            xid_totals=tuple(
                XidCount(gpu=g, pci_bus_id=bus if g is None else self._gpus.get(g), xid=x, count=n)
                for (g, bus, x), n in sorted(
                    self._xid_totals.items(),
                    key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1] or "", kv[0][2]),
                )
            ),
        )


_Judged = tuple[FaultKind, HealthLevel, OperatorAction, str]
_LOST: _Judged = (FaultKind.GPU_LOST, HealthLevel.UNHEALTHY, OperatorAction.DRAIN_NODE, "GPU is lost (NVML)")


def _memory_states(r: GpuHealthReading) -> list[_Judged]:
    out: list[_Judged] = []
    if r.remap_failure:
        out.append(
            (
                FaultKind.ROW_REMAP_FAILURE,
                HealthLevel.UNHEALTHY,
                OperatorAction.DRAIN_NODE,
                "row remapping failed",
            )
        )
    if r.remap_pending:
        detail = "row remap pending (reset the GPU to apply)"
        out.append((FaultKind.ROW_REMAP_PENDING, HealthLevel.DEGRADED, OperatorAction.RESET_GPU, detail))
    if r.retired_pages_pending:
        detail = "retired pages pending (reset the GPU to apply)"
        out.append((FaultKind.RETIRED_PAGES_PENDING, HealthLevel.DEGRADED, OperatorAction.RESET_GPU, detail))
    return out


def _throttle_states(r: GpuHealthReading) -> list[_Judged]:
    reasons = r.throttle_reasons or 0
    judged = (
        (THROTTLE_HW_SLOWDOWN, FaultKind.THROTTLE_HW_SLOWDOWN, "clocks throttled: hardware slowdown"),
        (THROTTLE_HW_THERMAL | THROTTLE_SW_THERMAL, FaultKind.THROTTLE_THERMAL, "clocks throttled: thermal"),
        (THROTTLE_HW_POWER_BRAKE, FaultKind.THROTTLE_POWER_BRAKE, "clocks throttled: power brake"),
    )
    return [
        (kind, HealthLevel.DEGRADED, OperatorAction.NONE, detail)
        for bits, kind, detail in judged
        if reasons & bits
    ]


def _fabric_states(r: GpuHealthReading) -> list[_Judged]:
    """NVLinks that went down, and the fabric registration (NVL systems): network findings."""
    out: list[_Judged] = []
    if r.nvlink_links_down:
        links = ", ".join(str(link) for link in r.nvlink_links_down[:18])
        out.append(
            (
                FaultKind.NVLINK_DOWN,
                HealthLevel.UNHEALTHY,
                OperatorAction.CHECK_FABRIC,
                f"NVLink down: link {links}",
            )
        )
    if r.fabric_state is None or r.fabric_state == FABRIC_NOT_SUPPORTED:
        return out
    if r.fabric_state != FABRIC_COMPLETED:
        detail = f"fabric registration not completed (state {r.fabric_state})"
        out.append((FaultKind.FABRIC, HealthLevel.DEGRADED, OperatorAction.CHECK_FABRIC, detail))
    elif r.fabric_status not in (None, 0):
        detail = f"fabric registration failed (status {r.fabric_status})"
        out.append((FaultKind.FABRIC, HealthLevel.UNHEALTHY, OperatorAction.CHECK_FABRIC, detail))
    return out


def _rise(before: int | None, now: int | None) -> int:
    """How much a counter rose (0 on the first reading, or when it went down: a driver reload)."""
    if before is None or now is None or now < before:
        return 0
    return now - before


def _total_order(item: tuple[tuple[int | None, str | None, int], int]) -> tuple[bool, int, str, int]:
    (gpu, bus, xid), _ = item
    return (gpu is None, gpu or 0, bus or "", xid)


def _order(f: HardwareFinding) -> tuple[int, str]:
    return (-HEALTH_ORDER.index(f.level), f.detail)


def _xid_finding(entry: XidEntry, event: HardwareEvent, gpu: int | None, bus: str | None) -> HardwareFinding:
    detail = entry.describe() if entry.known else f"Xid {entry.code} (not in the catalog)"
    return HardwareFinding(
        kind=FaultKind.XID,
        level=entry.level,
        blame=entry.blame,
        action=entry.action,
        detail=detail,
        source=event.source,
        gpu=gpu,
        pci_bus_id=bus,
        xid=entry.code,
    )


__all__ = ["BookSettings", "HealthBook"]
