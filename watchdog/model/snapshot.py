"""The immutable picture the loop publishes once per cycle; REST and metrics read only this.

Readers never call into the loop: they take the latest :class:`Snapshot` (an atomic reference swap)
and render it. All times are epoch seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_triage.model.evidence import JobEvidence, evidence_dict
from gpu_triage.model.findings import Finding
from gpu_triage.model.health import UNKNOWN_HEALTH, Blame, NodeHealth
from gpu_triage.model.samples import quick_init
from gpu_triage.model.states import GpuState, Mode, Verdict


@quick_init  # built 16 at a time (model/samples.quick_init)
@dataclass(frozen=True, slots=True)
class GpuStatus:
    gpu: int
    uuid: str | None
    name: str | None
    model: str
    """Table model the GPU was matched to (e.g. 'B300', or 'generic')."""
    power_w: float | None
    power_limit_w: float | None
    utilization_ratio: float | None
    memory_used_bytes: float | None
    state: GpuState
    state_since: float | None
    energy_j: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    read_errors_total: int = 0
    impossible_power_limits_total: int = 0
    """Samples whose enforced power limit no GPU has (classified against the table's own limit)."""
    compute_floor_w: float | None = None
    """The table's compute floor for this GPU in watts (its band edges follow the enforced limit)."""
    spin_ceiling_w: float | None = None
    """The table's checkpoint_or_deadlock power ceiling in watts."""
    pci_bus_id: str | None = None
    """NVML's ``busId`` (``00000000:1B:00.0``), as dcgm-exporter's ``pci_bus_id`` label."""


@quick_init  # built once a rank (or a GPU) every process period
@dataclass(frozen=True, slots=True)
class RankStatus:
    rank: int
    pid: int | None
    gpu: int | None
    step: int | None
    phase: str | None
    lease_until: float | None
    alive: bool | None
    process_status: str | None
    """psutil status ('running', 'sleeping', 'disk-sleep' = D-state...)."""
    step_since: float | None = None
    """When the rank took ``step`` (the progress file's ``step_time`` on the daemon's timeline, else when
    the daemon first saw it): the clock of the verdict's onset, so a picture of the steps and the onset
    agree (issue 28)."""
    pod: Any = None
    """The Kubernetes pod the rank runs in (:class:`gpu_triage.signals.pods.PodRef`), None outside one."""


@dataclass(frozen=True, slots=True)
class JobStatus:
    job: str
    ranks: tuple[RankStatus, ...]
    verdict: Verdict
    onset: float | None
    """When the signature behind the verdict began."""
    raised: float | None
    """When the verdict was raised."""
    evidence: JobEvidence | None = None
    """What the detector recorded (None: not judged; JSON via :meth:`evidence_dict`)."""
    cause: str | None = None
    """What explains the verdict: for data_starvation 'storage_wait', 'cpu_contention' or 'loader';
    for stalled/slow e.g. 'waiting_on_other_nodes', 'lease_expired:eval', 'asymmetric:gpu 3'."""
    kill_worthy: bool = False
    """True only for a hung verdict resting on positive evidence of a hang (docs/detector.md): the
    action engine never signals a job whose status does not say so."""
    findings: tuple[Finding, ...] = ()
    """Every signal's statement this cycle (stored here only; the evidence's JSON lists them)."""
    detector_error: str | None = None
    """Why the detector could not judge the job this cycle (its verdict is the last one kept)."""
    blame: Blame = Blame.JOB
    """Whom the verdict blames (docs/detector.md "Blame"): ``node`` when a hardware fault sits on one of
    the job's GPUs (or a node of the job is lost), ``network`` for a fabric fault, ``unknown`` for an
    Xid nobody catalogued, else ``job``. The findings behind it are ``evidence.hardware``."""

    def evidence_dict(self) -> dict[str, Any]:
        """The evidence as JSON (REST ``/status``, alerts, logs, the event store): keys in
        docs/detector.md ("Evidence"), values JSON-safe."""
        return evidence_dict(
            self.evidence,
            findings=self.findings,
            kill_worthy=self.kill_worthy,
            cause=self.cause,
            detector_error=self.detector_error,
            blame=self.blame,
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    node: str
    source: str
    mode: Mode
    armed: bool
    cycle: int
    time: float
    period_s: float
    gpus: tuple[GpuStatus, ...] = ()
    jobs: tuple[JobStatus, ...] = ()
    sample_duration_s: float = 0.0
    """Wall time the last telemetry read took."""
    last_sample_time: float | None = None
    started_at: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)
    """Monotonic counters for metrics, e.g. 'actions_total{action=alert,result=ok}' style keys
    are kept structured in ``actions``; this holds daemon-level ones (cycles_total, read_errors_total)."""
    actions: dict[tuple[str, str], int] = field(default_factory=dict)
    """(action, result) -> count since start."""
    version: str = ""
    untrusted_progress_files: tuple[dict[str, Any], ...] = ()
    """Progress files not believed this cycle: never a verdict input, never a kill target."""
    input_errors: tuple[dict[str, Any], ...] = ()
    """What failed this cycle without stopping it, each ``{"kind", "where", "error"}``: kind
    ``progress_file`` (a file not read; ``where`` its path), ``job`` (a job the detector could not
    judge), ``store`` (the event store on memory only), ``actions`` (the action engine raised)."""
    failed_cycles: int = 0
    """Consecutive cycles that raised before publishing (this snapshot is the last good one)."""
    clock_offset_s: float = 0.0
    """The wall clock minus the daemon's monotonic timeline (0 until the wall clock steps): add it to a
    time shown here to read it on the wall clock as it is now (``gpu_triage.model.clock``)."""
    stacks: dict[str, Any] = field(default_factory=dict)
    """The stack sampler's status: state (available, py_spy_missing, ptrace_denied, disabled), its
    CPU spend over the last minute against its budget, dump counters."""
    fleet: tuple[Any, ...] = ()
    """This node's facts about each job's ranks, for the other nodes (gpu_watchdog_fleet_* series):
    :class:`gpu_triage.signals.fleet.facts.NodeJobFacts` values (typed there: the model layer is below it)."""
    cluster: dict[str, Any] = field(default_factory=dict)
    """The reader of other nodes' facts ([cluster]): Prometheus URL, queries, last error."""
    signals: dict[str, Any] = field(default_factory=dict)
    """The status of every other registered signal, by name (gpu_triage.signals.registry)."""
    node_health: NodeHealth = UNKNOWN_HEALTH
    """The node verdict this cycle (the ``health`` signal, ``signals/health``): healthy, degraded or
    unhealthy, per GPU with the findings behind it (REST ``/status`` ``node_health``). The detector and
    the action engine read it from here (or from ``Daemon.node_health`` within the cycle)."""
