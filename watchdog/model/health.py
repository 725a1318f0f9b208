"""The node-health vocabulary: hardware faults, GPU and node health, and whom a hang blames.

Pure values shared by the health signal (``signals/health/``: NVML reads and events, the kernel log,
the Xid catalog), the detector (``blame`` on every job verdict), the action engine (drain and requeue
by blame, the deterministic-hang breaker that never counts a hardware hang against a job), REST
(``/status`` ``node_health``), metrics and the reports. Nothing here reads hardware: the readers fill
these values and everyone else reads them.

Times are points on the daemon's monotonic timeline (``model.clock``), like every other duration here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class Blame(StrEnum):
    """Whom a verdict (or a hardware fault) blames: who should act on it."""

    JOB = "job"
    """The job's own code or data (a software deadlock on a healthy node): today's behaviour."""
    NODE = "node"
    """This node's hardware or driver: a sick GPU, a GPU lost, a node of the job lost. Drain it."""
    NETWORK = "network"
    """The fabric between nodes (NVLink/NVSwitch, InfiniBand): links down, fabric errors."""
    UNKNOWN = "unknown"
    """Nothing proves either side (an Xid code not in the catalog, say)."""


class HealthLevel(StrEnum):
    """A GPU's or the node's health, worst wins."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    """Working, but a signal is off (correctable ECC burst, thermal throttle, PCIe width drop): alert."""
    UNHEALTHY = "unhealthy"
    """Not fit to run a job (Xid that needs a reset, uncorrectable ECC, row-remap failure, GPU lost)."""


#: Worst first when combining levels.
HEALTH_ORDER: tuple[HealthLevel, ...] = (HealthLevel.HEALTHY, HealthLevel.DEGRADED, HealthLevel.UNHEALTHY)


def worst(levels: tuple[HealthLevel, ...] | list[HealthLevel]) -> HealthLevel:
    """The worst of ``levels`` (healthy when empty)."""
    return max(levels, key=HEALTH_ORDER.index, default=HealthLevel.HEALTHY)


class OperatorAction(StrEnum):
    """What the operator (or the daemon, armed) should do about a fault; from the Xid catalog."""

    NONE = "none"
    RESTART_JOB = "restart_job"
    RESET_GPU = "reset_gpu"
    DRAIN_NODE = "drain_node"
    """Take the node out of scheduling (Slurm DRAIN, a Kubernetes node condition) until a person looks."""
    CHECK_APPLICATION = "check_application"
    CHECK_FABRIC = "check_fabric"
    UNKNOWN = "unknown"


class FaultKind(StrEnum):
    """Which hardware signal a finding comes from."""

    XID = "xid"
    GPU_LOST = "gpu_lost"
    """NVML answers ``NVML_ERROR_GPU_IS_LOST`` for the GPU."""
    FALLEN_OFF_BUS = "fallen_off_bus"
    """The kernel log says the GPU "has fallen off the bus"."""
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    ECC_CORRECTABLE = "ecc_correctable"
    RETIRED_PAGES_PENDING = "retired_pages_pending"
    ROW_REMAP_PENDING = "row_remap_pending"
    ROW_REMAP_FAILURE = "row_remap_failure"
    NVLINK_ERRORS = "nvlink_errors"
    """CRC, replay or recovery counters rising."""
    NVLINK_DOWN = "nvlink_down"
    THROTTLE_HW_SLOWDOWN = "throttle_hw_slowdown"
    THROTTLE_THERMAL = "throttle_thermal"
    THROTTLE_POWER_BRAKE = "throttle_power_brake"
    PCIE_DEGRADED = "pcie_degraded"
    """PCIe link generation or width below its maximum."""
    FABRIC = "fabric"
    """The NVLink fabric state (NVL systems) is not completed/healthy."""


class FaultSource(StrEnum):
    """Where a finding was read."""

    NVML_EVENT = "nvml_event"
    NVML_POLL = "nvml_poll"
    KERNEL_LOG = "kernel_log"


@dataclass(frozen=True, slots=True)
class HardwareFinding:
    """One hardware signal on one GPU (or the node when ``gpu`` is None), as the readers saw it."""

    kind: FaultKind
    level: HealthLevel
    blame: Blame
    action: OperatorAction
    detail: str
    """Human words: ``"Xid 79: GPU has fallen off the bus"``, ``"PCIe x8 of x16"``."""
    source: FaultSource
    gpu: int | None = None
    pci_bus_id: str | None = None
    xid: int | None = None
    """The Xid code, for ``kind == XID``."""
    count: int = 1
    first_seen: float = 0.0
    """Timeline point of the first sighting (monotonic seconds)."""
    last_seen: float = 0.0

    @property
    def is_fault(self) -> bool:
        """A finding that blames the hardware for a hang on this GPU (unhealthy, not merely degraded)."""
        return self.level is HealthLevel.UNHEALTHY


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's health this cycle: its level and the findings behind it."""

    gpu: int
    pci_bus_id: str | None
    level: HealthLevel
    findings: tuple[HardwareFinding, ...] = ()

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(f.detail for f in self.findings)


@dataclass(frozen=True, slots=True)
class XidCount:
    """How often Xid ``xid`` was seen on ``gpu`` (None: a bus id that maps to no GPU) since start."""

    gpu: int | None
    pci_bus_id: str | None
    xid: int
    count: int


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """The node verdict: the worst GPU (or node-wide finding) wins; ``/status`` ``node_health``."""

    level: HealthLevel
    gpus: tuple[GpuHealth, ...] = ()
    findings: tuple[HardwareFinding, ...] = ()
    """Node-wide findings (no GPU index: a kernel line whose bus id maps to no GPU, the fabric)."""
    read_errors: tuple[str, ...] = ()
    """Health reads that failed or ran past their deadline this cycle (the level then rests on the rest)."""
    xid_totals: tuple[XidCount, ...] = ()
    """Every Xid seen since the daemon started, per GPU and code (counters: they never expire, unlike
    the findings, which are held for a while after their last sighting)."""

    def gpu(self, index: int) -> GpuHealth | None:
        for g in self.gpus:
            if g.gpu == index:
                return g
        return None

    def faults_on(self, gpus: tuple[int, ...] | frozenset[int] | list[int]) -> tuple[HardwareFinding, ...]:
        """Unhealthy findings on any of ``gpus`` (a job's GPUs), plus node-wide unhealthy findings."""
        wanted = set(gpus)
        out = [f for g in self.gpus if g.gpu in wanted for f in g.findings if f.is_fault]
        out.extend(f for f in self.findings if f.is_fault)
        return tuple(out)


#: A node with nothing read yet (no health signal configured, or before the first read).
UNKNOWN_HEALTH = NodeHealth(level=HealthLevel.HEALTHY)


# -- additions for the health signal (issue 27 part A) ------------------------------------------------

_HEX = frozenset("0123456789abcdefABCDEF")


def pci_key(text: str | None) -> tuple[int, int, int] | None:
    """``(domain, bus, device)`` of a PCI address in any form NVML or the kernel log writes it.

    NVML's ``busId`` is ``00000000:1B:00.0``, its legacy form ``0000:1B:00.0``; the kernel's Xid lines
    say ``PCI:0000:1b:00`` (no function) or, on old drivers, ``0000:1b:00``. The function is ignored (a
    GPU is function 0), so all of them name the same GPU. None for anything else.
    """
    if text is None:
        return None
    s = text.strip()
    if s[:4].upper() == "PCI:":
        s = s[4:]
    s = s.split(".", 1)[0] if "." in s else s
    parts = s.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return None
    domain, bus, device = parts
    if not (1 <= len(domain) <= 8 and 1 <= len(bus) <= 2 and 1 <= len(device) <= 2):
        return None
    if not all(c in _HEX for c in domain + bus + device):
        return None
    return int(domain, 16), int(bus, 16), int(device, 16)


def canonical_bus_id(text: str | None) -> str | None:
    """NVML's spelling, ``00000000:1B:00.0``, of any form :func:`pci_key` reads (None if unreadable)."""
    key = pci_key(text)
    if key is None:
        return None
    domain, bus, device = key
    function = 0
    if text is not None and "." in text:
        tail = text.rsplit(".", 1)[1].strip()
        if len(tail) == 1 and tail in _HEX:
            function = int(tail, 16)
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


@dataclass(frozen=True, slots=True)
class HardwareEvent:
    """One event as a reader saw it (an Xid from NVML's event API or the kernel log, a GPU fallen off
    the bus), before the catalog judges it. ``gpu`` is None when the bus id maps to no GPU we know."""

    kind: FaultKind
    source: FaultSource
    at: float
    """Timeline point at which the reader saw it (monotonic seconds)."""
    gpu: int | None = None
    pci_bus_id: str | None = None
    xid: int | None = None
    text: str = ""
    """The rest of the line (bounded, printable), for the reasons shown to people."""


@dataclass(frozen=True, slots=True)
class GpuHealthReading:
    """One poll of one GPU's health counters and states (NVML units; None = not read or unsupported).

    Counters are cumulative since the driver loaded (volatile ECC) or the board's life (NVLink);
    the health signal compares them with the previous reading.
    """

    gpu: int
    pci_bus_id: str | None = None
    lost: bool = False
    """NVML answered ``NVML_ERROR_GPU_IS_LOST``."""
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    nvlink_crc_errors: int | None = None
    """Flit + data CRC errors, summed over links."""
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    nvlink_links_down: tuple[int, ...] = ()
    """Links NVML reports inactive that were active at the first reading (a link that never came up
    is a board without it, not a fault)."""
    throttle_reasons: int | None = None
    """``nvmlDeviceGetCurrentClocksEventReasons`` bit mask."""
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    fabric_state: int | None = None
    """``nvmlGpuFabricInfo_t.state`` (NVL systems; None where the driver does not report it)."""
    fabric_status: int | None = None
    """``nvmlGpuFabricInfo_t.status`` (an ``nvmlReturn_t``: 0 is success)."""
    errors: tuple[str, ...] = ()
    """Reads that failed or overran their deadline (``"ecc: timeout"``)."""


class HealthReader(Protocol):
    """Where the health signal reads hardware (``telemetry/nvml_health.NvmlHealthReader``): each call
    returns within its deadline and never raises for one GPU's failure."""

    def read(self, now: float) -> list[GpuHealthReading]:
        """One poll of every GPU."""
        ...

    def events(self) -> list[HardwareEvent]:
        """Events seen since the last call (drained; bounded)."""
        ...

    def status(self) -> dict[str, object]: ...

    def close(self) -> None: ...


def finding_dict(f: HardwareFinding) -> dict[str, object]:
    """One finding as JSON (REST ``/status.node_health``, the status command, events)."""
    return {
        "kind": str(f.kind),
        "level": str(f.level),
        "blame": str(f.blame),
        "action": str(f.action),
        "detail": f.detail,
        "source": str(f.source),
        "gpu": f.gpu,
        "pci_bus_id": f.pci_bus_id,
        "xid": f.xid,
        "count": f.count,
        "first_seen": f.first_seen,
        "last_seen": f.last_seen,
    }


def node_health_dict(health: NodeHealth) -> dict[str, object]:
    """The node verdict as JSON: ``level``, per GPU its level, reasons and findings, node-wide
    findings, read errors and the Xid counts since start."""
    return {
        "level": str(health.level),
        "gpus": [
            {
                "gpu": g.gpu,
                "pci_bus_id": g.pci_bus_id,
                "level": str(g.level),
                "reasons": list(g.reasons),
                "findings": [finding_dict(f) for f in g.findings],
            }
            for g in health.gpus
        ],
        "findings": [finding_dict(f) for f in health.findings],
        "read_errors": list(health.read_errors),
        "xid_totals": [
            {"gpu": x.gpu, "pci_bus_id": x.pci_bus_id, "xid": x.xid, "count": x.count}
            for x in health.xid_totals
        ],
    }
