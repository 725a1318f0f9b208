"""The node-health vocabulary: hardware faults, GPU and node health, and whom a hang blames.

Pure values shared by the health signal (``signals/health/``: NVML reads and events, the kernel log,
the Xid catalog), the detector (``blame`` on every job verdict), the action engine (drain and requeue
by blame, the deterministic-hang breaker that never counts a hardware hang against a job), REST
(``/status.node``), metrics and the reports. Nothing here reads hardware: the readers fill these values
and everyone else reads them.

Times are points on the daemon's monotonic timeline (``model.clock``), like every other duration here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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
class NodeHealth:
    """The node verdict: the worst GPU (or node-wide finding) wins; ``/status.node``."""

    level: HealthLevel
    gpus: tuple[GpuHealth, ...] = ()
    findings: tuple[HardwareFinding, ...] = ()
    """Node-wide findings (no GPU index: a kernel line whose bus id maps to no GPU, the fabric)."""
    read_errors: tuple[str, ...] = ()
    """Health reads that failed or ran past their deadline this cycle (the level then rests on the rest)."""

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
