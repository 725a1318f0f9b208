"""Prometheus exposition of the latest :class:`~gpu_triage.model.snapshot.Snapshot`, rendered at scrape time.

The loop updates no metric objects: a custom collector reads the latest published snapshot when
Prometheus scrapes and turns it into metric families. :class:`MetricsExposition` (what ``/metrics``
serves) encodes a snapshot's families once per published snapshot and format and reuses the bytes
until the loop publishes the next one; only the daemon's own ``process_*`` series are read anew (at
most once a second for ``/metrics``). prometheus_client's encoders are slow per sample, and a
snapshot is immutable, so the cached bytes are exactly what a fresh rendering would give. Names
follow the Prometheus conventions (prefix ``gpu_watchdog_``, base units, ``_total`` for counters,
``_timestamp_seconds`` for epoch times, one-hot gauges for enumerations).

Labels are chosen to join with NVIDIA dcgm-exporter's series without ``label_replace``
(docs/dashboards.md, "Beside dcgm-exporter"): per-GPU series carry ``gpu`` (the NVML index, as a
string), ``UUID`` (NVML's ``GPU-...`` string) and ``Hostname`` (the daemon's node name, the host name
by default), spelled and valued as dcgm-exporter spells them. Per-job series carry the training job
in ``training_job``, never in ``job``: that one is Prometheus's scrape job, so the scrape config needs
no ``honor_labels``.
A value the snapshot does not have (``None`` or not finite) is left out rather than exported as a
made-up number, so ``absent()``/staleness work as Prometheus users expect.

prometheus_client appends ``unit`` to a name that does not already end with it; every name here is
spelled out in full *and* ends with its unit, which :func:`_check_unit` enforces, so a series never
becomes ``..._watts_watts``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpu_triage.model.health import HEALTH_ORDER
from gpu_triage.model.snapshot import GpuStatus, Snapshot
from gpu_triage.model.states import GPU_STATES, VERDICTS, GpuState, Mode
from gpu_triage.serving.publish import SnapshotHolder
from gpu_triage.signals.fleet.exposition import METRIC_NAMES as FLEET_METRIC_NAMES
from gpu_triage.signals.fleet.exposition import fleet_metrics

PREFIX = "gpu_watchdog_"
GPU_LABELS = ("gpu", "UUID", "Hostname", "pci_bus_id")
#: The label that names the training job on the per-job series (``job`` is the scrape job's).
JOB_LABEL = "training_job"

#: Every metric family the snapshot collector can emit (name as exposed, type), for docs and tests.
METRIC_NAMES: dict[str, str] = {
    "gpu_watchdog_power_watts": "gauge",
    "gpu_watchdog_power_limit_watts": "gauge",
    "gpu_watchdog_energy_joules_total": "counter",
    "gpu_watchdog_utilization_ratio": "gauge",
    "gpu_watchdog_memory_used_bytes": "gauge",
    "gpu_watchdog_temperature_celsius": "gauge",
    "gpu_watchdog_compute_floor_watts": "gauge",
    "gpu_watchdog_spin_ceiling_watts": "gauge",
    "gpu_watchdog_sm_clock_hertz": "gauge",
    "gpu_watchdog_state": "gauge",
    "gpu_watchdog_state_since_timestamp_seconds": "gauge",
    "gpu_watchdog_read_errors_total": "counter",
    "gpu_watchdog_impossible_power_limit_total": "counter",
    "gpu_watchdog_gpu_held_idle_seconds": "gauge",
    "gpu_watchdog_gpu_health": "gauge",
    "gpu_watchdog_node_health": "gauge",
    "gpu_watchdog_xid_total": "counter",
    "gpu_watchdog_health_findings": "gauge",
    "gpu_watchdog_verdict": "gauge",
    "gpu_watchdog_verdict_onset_timestamp_seconds": "gauge",
    "gpu_watchdog_verdict_raised_timestamp_seconds": "gauge",
    "gpu_watchdog_kill_worthy": "gauge",
    "gpu_watchdog_rank_step": "gauge",
    "gpu_watchdog_rank_lease_until_timestamp_seconds": "gauge",
    "gpu_watchdog_rank_pod_info": "info",
    "gpu_watchdog_rank_stack_phase": "gauge",
    "gpu_watchdog_stack_sampler_available": "gauge",
    "gpu_watchdog_stack_dumps_total": "counter",
    "gpu_watchdog_stack_cpu_seconds_total": "counter",
    "gpu_watchdog_actions_total": "counter",
    "gpu_watchdog_sample_duration_seconds": "gauge",
    "gpu_watchdog_last_sample_timestamp_seconds": "gauge",
    "gpu_watchdog_last_cycle_timestamp_seconds": "gauge",
    "gpu_watchdog_period_seconds": "gauge",
    "gpu_watchdog_start_timestamp_seconds": "gauge",
    "gpu_watchdog_cycles_total": "counter",
    "gpu_watchdog_missed_cycles_total": "counter",
    "gpu_watchdog_clock_offset_seconds": "gauge",
    "gpu_watchdog_failed_cycles_total": "counter",
    "gpu_watchdog_degraded_cycles_total": "counter",
    "gpu_watchdog_input_errors": "gauge",
    "gpu_watchdog_armed": "gauge",
    "gpu_watchdog_mode": "gauge",
    "gpu_watchdog_info": "info",
    **FLEET_METRIC_NAMES,
}


def _finite(value: float | int | None) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _check_unit(name: str, unit: str) -> None:
    if unit and not name.removesuffix("_total").endswith("_" + unit):
        raise ValueError(f"metric {name} must end with its unit {unit!r}")


def _gauge(name: str, documentation: str, labels: Iterable[str], unit: str = "") -> GaugeMetricFamily:
    _check_unit(name, unit)
    return GaugeMetricFamily(name, documentation, labels=list(labels), unit=unit)


def _counter(name: str, documentation: str, labels: Iterable[str], unit: str = "") -> CounterMetricFamily:
    _check_unit(name, unit)
    return CounterMetricFamily(name, documentation, labels=list(labels), unit=unit)


def _gpu_labels(gpu: GpuStatus, hostname: str) -> list[str]:
    return [str(gpu.gpu), gpu.uuid or "", hostname, gpu.pci_bus_id or ""]


def _gpu_metrics(gpus: tuple[GpuStatus, ...], hostname: str) -> Iterator[Metric]:
    per_gpu: list[tuple[GaugeMetricFamily | CounterMetricFamily, str]] = [
        (_gauge(PREFIX + "power_watts", "Board power draw.", GPU_LABELS, "watts"), "power_w"),
        (
            _gauge(PREFIX + "power_limit_watts", "Enforced board power limit.", GPU_LABELS, "watts"),
            "power_limit_w",
        ),
        (
            _counter(
                PREFIX + "energy_joules_total",
                "Energy the GPU consumed since the driver loaded.",
                GPU_LABELS,
                "joules",
            ),
            "energy_j",
        ),
        (
            _gauge(
                PREFIX + "utilization_ratio",
                "Share of the last sample period in which a kernel ran (0..1; a spinning kernel counts).",
                GPU_LABELS,
                "ratio",
            ),
            "utilization_ratio",
        ),
        (
            _gauge(PREFIX + "memory_used_bytes", "GPU memory in use.", GPU_LABELS, "bytes"),
            "memory_used_bytes",
        ),
        (
            _gauge(PREFIX + "temperature_celsius", "GPU temperature.", GPU_LABELS, "celsius"),
            "temperature_c",
        ),
        (
            _gauge(
                PREFIX + "compute_floor_watts",
                "The power table's compute floor for this GPU (band edge; follows the limit).",
                GPU_LABELS,
                "watts",
            ),
            "compute_floor_w",
        ),
        (
            _gauge(
                PREFIX + "spin_ceiling_watts",
                "The power table's checkpoint_or_deadlock (spin band) ceiling for this GPU.",
                GPU_LABELS,
                "watts",
            ),
            "spin_ceiling_w",
        ),
        (
            _gauge(
                PREFIX + "state_since_timestamp_seconds",
                "When the GPU entered its current state (epoch seconds).",
                GPU_LABELS,
                "seconds",
            ),
            "state_since",
        ),
    ]
    sm_clock = _gauge(PREFIX + "sm_clock_hertz", "Streaming-multiprocessor clock.", GPU_LABELS, "hertz")
    state = _gauge(
        PREFIX + "state", "Classified GPU state (one-hot over all states).", [*GPU_LABELS, "state"]
    )
    read_errors = _counter(
        PREFIX + "read_errors_total", "Failed or late telemetry reads of the GPU.", GPU_LABELS
    )
    impossible_limits = _counter(
        PREFIX + "impossible_power_limit_total",
        "Samples whose enforced power limit no GPU has (outside 1-5000 W); classified against the "
        "power table's own limit instead.",
        GPU_LABELS,
    )
    for gpu in gpus:
        labels = _gpu_labels(gpu, hostname)
        for family, attribute in per_gpu:
            value = _finite(getattr(gpu, attribute))
            if value is not None:
                family.add_metric(labels, value)
        clock_mhz = _finite(gpu.sm_clock_mhz)
        if clock_mhz is not None:
            sm_clock.add_metric(labels, clock_mhz * 1e6)
        for candidate in GPU_STATES:
            state.add_metric([*labels, candidate.value], 1.0 if gpu.state == candidate else 0.0)
        read_errors.add_metric(labels, float(gpu.read_errors_total))
        impossible_limits.add_metric(labels, float(gpu.impossible_power_limits_total))
    for family, _attribute in per_gpu:
        yield family
    yield from (sm_clock, state, read_errors, impossible_limits)


HELD_MEMORY_BYTES = 1 << 30
"""A GPU with at least this much memory in use is held by a live process (freed when it exits)."""


def held_idle_s(gpu: GpuStatus, now: float) -> float | None:
    """Seconds the GPU has been ``idle`` while a process holds its memory (None: it is not)."""
    memory = _finite(gpu.memory_used_bytes)
    if gpu.state != GpuState.IDLE or memory is None or memory < HELD_MEMORY_BYTES or gpu.state_since is None:
        return None
    return max(0.0, now - gpu.state_since)


def _held_idle(snapshot: Snapshot) -> Metric:
    """GPUs held idle (issue 19): idle with memory held by a live process - a hung data loader, a
    job paused on purpose, a forgotten notebook. One series per such GPU, labelled with the job whose
    rank the daemon tied to it (empty: no job is tied to it, e.g. a container without host PIDs)."""
    family = _gauge(
        PREFIX + "gpu_held_idle_seconds",
        "Seconds the GPU has been idle with memory held by a live process (absent when it is not).",
        [*GPU_LABELS, JOB_LABEL],
        "seconds",
    )
    holder = {
        r.gpu: j.job for j in snapshot.jobs for r in j.ranks if r.gpu is not None and r.alive is not False
    }
    for gpu in snapshot.gpus:
        held = held_idle_s(gpu, snapshot.time)
        if held is not None:
            family.add_metric([*_gpu_labels(gpu, snapshot.node), holder.get(gpu.gpu, "")], held)
    return family


def _job_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    verdict = _gauge(
        PREFIX + "verdict",
        "Verdict per job on this node (one-hot over all verdicts).",
        [JOB_LABEL, "verdict"],
    )
    onset = _gauge(
        PREFIX + "verdict_onset_timestamp_seconds",
        "When the signature behind the job's verdict began (epoch seconds).",
        [JOB_LABEL],
        "seconds",
    )
    raised = _gauge(
        PREFIX + "verdict_raised_timestamp_seconds",
        "When the job's current verdict was raised (epoch seconds).",
        [JOB_LABEL],
        "seconds",
    )
    kill_worthy = _gauge(
        PREFIX + "kill_worthy",
        "1 when the job's verdict rests on positive evidence of a hang (only then may it reach a kill).",
        [JOB_LABEL],
    )
    step = _gauge(PREFIX + "rank_step", "Optimizer step each rank last reported.", [JOB_LABEL, "rank"])
    lease = _gauge(
        PREFIX + "rank_lease_until_timestamp_seconds",
        "Until when a rank's non-train phase lease runs (epoch seconds).",
        [JOB_LABEL, "rank"],
        "seconds",
    )
    pod_info = InfoMetricFamily(
        PREFIX + "rank_pod",
        "The Kubernetes pod and container a rank runs in (from its cgroup; only ranks in a pod).",
        labels=[JOB_LABEL, "rank"],
    )
    for job in snapshot.jobs:
        for candidate in VERDICTS:
            verdict.add_metric([job.job, candidate.value], 1.0 if job.verdict == candidate else 0.0)
        kill_worthy.add_metric([job.job], 1.0 if job.kill_worthy else 0.0)
        for family, value in ((onset, job.onset), (raised, job.raised)):
            number = _finite(value)
            if number is not None:
                family.add_metric([job.job], number)
        for rank in job.ranks:
            rank_labels = [job.job, str(rank.rank)]
            if rank.step is not None:
                step.add_metric(rank_labels, float(rank.step))
            lease_until = _finite(rank.lease_until)
            if lease_until is not None:
                lease.add_metric(rank_labels, lease_until)
            if rank.pod is not None:
                pod = rank.pod
                values = {"pod_uid": pod.pod_uid, "namespace": pod.namespace or "", "pod": pod.pod or ""}
                pod_info.add_metric(rank_labels, {**values, "container": pod.container or ""})
    yield from (verdict, onset, raised, kill_worthy, step, lease, pod_info)
    yield from _stack_metrics(snapshot)


STACK_PHASES = ("collective", "checkpoint", "eval", "data", "forward", "backward", "optimizer", "other")


def _stack_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    phase = _gauge(
        PREFIX + "rank_stack_phase",
        "Where each rank's latest Python stack is (py-spy; one-hot over the phases).",
        [JOB_LABEL, "rank", "phase"],
    )
    for job in snapshot.jobs:
        by_rank = job.evidence.stack_phase_by_rank if job.evidence is not None else {}
        for rank, where in sorted(by_rank.items(), key=lambda item: str(item[0])):
            for candidate in STACK_PHASES:
                phase.add_metric([job.job, str(rank), candidate], 1.0 if where == candidate else 0.0)
    yield phase
    st = snapshot.stacks or {}
    # always exposed, empty before the sampler reports
    available = _gauge(
        PREFIX + "stack_sampler_available",
        "1 when stack sampling works (py-spy found, ptrace allowed), else 0 (state label says why).",
        ["state"],
    )
    dumps = _counter(PREFIX + "stack_dumps_total", "py-spy dumps taken, by result.", ["result"])
    cpu = _counter(PREFIX + "stack_cpu_seconds_total", "CPU seconds the py-spy dumps used.", [], "seconds")
    if st:
        available.add_metric([str(st.get("state"))], 1.0 if st.get("state") == "available" else 0.0)
        failures = float(st.get("failures_total", 0))
        dumps.add_metric(["ok"], float(st.get("dumps_total", 0)) - failures)
        dumps.add_metric(["failed"], failures)
        cpu.add_metric([], float(st.get("cpu_s_total", 0.0)))
    yield from (available, dumps, cpu)


def _daemon_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    actions = _counter(PREFIX + "actions_total", "Actions taken, by action and result.", ["action", "result"])
    for (action, result), count in sorted(snapshot.actions.items()):
        actions.add_metric([action, result], float(count))
    yield actions

    sample = _gauge(
        PREFIX + "sample_duration_seconds", "Wall time the last telemetry read took.", [], "seconds"
    )
    sample.add_metric([], _finite(snapshot.sample_duration_s) or 0.0)
    yield sample
    if _finite(snapshot.last_sample_time) is not None:
        last = _gauge(
            PREFIX + "last_sample_timestamp_seconds",
            "When the last telemetry sample was taken (epoch seconds).",
            [],
            "seconds",
        )
        last.add_metric([], float(snapshot.last_sample_time or 0.0))
        yield last
    cycle = _gauge(
        PREFIX + "last_cycle_timestamp_seconds",
        "When the last cycle was published (epoch seconds).",
        [],
        "seconds",
    )
    cycle.add_metric([], snapshot.time)
    yield cycle
    period = _gauge(PREFIX + "period_seconds", "Configured cycle period.", [], "seconds")
    period.add_metric([], snapshot.period_s)
    yield period
    if snapshot.started_at:
        started = _gauge(
            PREFIX + "start_timestamp_seconds", "When the daemon started (epoch seconds).", [], "seconds"
        )
        started.add_metric([], snapshot.started_at)
        yield started
    cycles = _counter(PREFIX + "cycles_total", "Cycles completed since start.", [])
    cycles.add_metric([], float(snapshot.counters.get("cycles_total", snapshot.cycle)))
    yield cycles
    missed = _counter(PREFIX + "missed_cycles_total", "Ticks skipped because a cycle overran its period.", [])
    missed.add_metric([], float(snapshot.counters.get("missed_cycles_total", 0.0)))
    yield missed
    offset = _gauge(
        PREFIX + "clock_offset_seconds",
        "Wall clock minus the daemon's monotonic timeline (0 until the wall clock steps).",
        [],
        "seconds",
    )
    offset.add_metric([], snapshot.clock_offset_s)
    yield offset
    armed = _gauge(PREFIX + "armed", "1 when the daemon is armed to act (alert or kill), else 0.", [])
    armed.add_metric([], 1.0 if snapshot.armed else 0.0)
    yield armed
    mode = _gauge(PREFIX + "mode", "Action mode (one-hot over observe, alert, kill).", ["mode"])
    for candidate in Mode:
        mode.add_metric([candidate.value], 1.0 if snapshot.mode == candidate else 0.0)
    yield mode
    info = InfoMetricFamily(PREFIX.removesuffix("_"), "The daemon's version, node and telemetry source.")
    info.add_metric([], {"version": snapshot.version, "node": snapshot.node, "source": snapshot.source})
    yield info


INPUT_ERROR_KINDS = ("progress_file", "job", "persist", "store", "actions")


def _error_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    errors = _gauge(
        PREFIX + "input_errors",
        "Things that failed in the last cycle without stopping it (progress files not read, jobs not "
        "judged, the event store on memory only, the action engine); see input_errors in /status.",
        ["kind"],
    )
    counts = {k: 0 for k in INPUT_ERROR_KINDS}
    for e in snapshot.input_errors:
        counts[str(e.get("kind"))] = counts.get(str(e.get("kind")), 0) + 1
    for kind, n in sorted(counts.items()):
        errors.add_metric([kind], float(n))
    yield errors
    failed = _counter(PREFIX + "failed_cycles_total", "Cycles that raised (nothing published).", [])
    failed.add_metric([], float(snapshot.counters.get("failed_cycles_total", 0.0)))
    yield failed
    degraded = _counter(
        PREFIX + "degraded_cycles_total",
        "Cycles that raised, or in which a job could not be judged or its verdict recorded.",
        [],
    )
    degraded.add_metric([], float(snapshot.counters.get("degraded_cycles_total", 0.0)))
    yield degraded


def _health_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    """The node verdict (signals/health): GPU and node health one-hot, Xid counters per GPU and code,
    findings per GPU, kind and blame."""
    health = snapshot.node_health
    by_gpu = {g.gpu: g for g in snapshot.gpus}
    hostname = snapshot.node

    def labels(gpu: int | None, bus: str | None) -> list[str]:
        status = by_gpu.get(gpu) if gpu is not None else None
        return [
            "" if gpu is None else str(gpu),
            (status.uuid or "") if status is not None else "",
            hostname,
            bus or (status.pci_bus_id if status is not None else None) or "",
        ]

    gpu_health = _gauge(
        PREFIX + "gpu_health",
        "GPU health (one-hot over healthy, degraded, unhealthy): Xid, ECC, row remap, NVLink, throttle, "
        "PCIe, GPU lost; see node_health in /status.",
        [*GPU_LABELS, "level"],
    )
    for g in health.gpus:
        for level in HEALTH_ORDER:
            gpu_health.add_metric(
                [*labels(g.gpu, g.pci_bus_id), level.value], 1.0 if g.level is level else 0.0
            )
    yield gpu_health
    node_health = _gauge(
        PREFIX + "node_health", "The node verdict (one-hot over healthy, degraded, unhealthy).", ["level"]
    )
    for level in HEALTH_ORDER:
        node_health.add_metric([level.value], 1.0 if health.level is level else 0.0)
    yield node_health
    xids = _counter(
        PREFIX + "xid_total",
        "Xid errors seen since the daemon started, per GPU and code (gpu empty: a bus id of no known GPU).",
        [*GPU_LABELS, "xid"],
    )
    for x in health.xid_totals:
        xids.add_metric([*labels(x.gpu, x.pci_bus_id), str(x.xid)], float(x.count))
    yield xids
    findings = _gauge(
        PREFIX + "health_findings",
        "Hardware findings held now, per GPU, kind, level and blame.",
        [*GPU_LABELS, "kind", "level", "blame"],
    )
    counts: dict[tuple[str, ...], int] = {}
    for f in (*(f for g in health.gpus for f in g.findings), *health.findings):
        key = (*labels(f.gpu, f.pci_bus_id), f.kind.value, f.level.value, f.blame.value)
        counts[key] = counts.get(key, 0) + 1
    for key, n in sorted(counts.items()):
        findings.add_metric(list(key), float(n))
    yield findings


def snapshot_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    """All metric families for one snapshot (pure: the snapshot in, families out)."""
    yield from _gpu_metrics(snapshot.gpus, snapshot.node)
    yield from _health_metrics(snapshot)
    yield _held_idle(snapshot)
    yield from _job_metrics(snapshot)
    yield from _daemon_metrics(snapshot)
    yield from _error_metrics(snapshot)
    yield from fleet_metrics(snapshot.fleet)


class SnapshotCollector(Collector):
    """Renders the latest published snapshot at scrape time; emits nothing before the first cycle."""

    def __init__(self, snapshots: SnapshotHolder) -> None:
        self._snapshots = snapshots

    def collect(self) -> Iterable[Metric]:
        snapshot = self._snapshots.latest()
        if snapshot is None:
            return []
        return list(snapshot_metrics(snapshot))

    def describe(self) -> Iterable[Metric]:
        # Declaring no metrics up front keeps registration from calling collect() (the names are
        # dynamic in their labels only; METRIC_NAMES lists them).
        return []


def make_registry(snapshots: SnapshotHolder, *, process_metrics: bool = True) -> CollectorRegistry:
    """A private registry (never the global one) with the snapshot collector and, by default, the
    standard ``process_*`` metrics of this daemon (CPU seconds, resident memory, open files)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshots))
    if process_metrics:
        ProcessCollector(registry=registry)
    return registry


class _Families:
    """The one method of a registry the encoders call (``collect``), over families already built."""

    __slots__ = ("_families",)

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


_OPENMETRICS_EOF = b"# EOF\n"


class MetricsExposition:
    """What ``/metrics`` serves: the latest snapshot's families, encoded once per published snapshot
    and content type (the cache holds the latest snapshot's bodies only), then the daemon's
    ``process_*`` series, read at each scrape or reused up to ``process_max_age_s``. The output is byte
    for byte what :func:`render` gives over :func:`make_registry` for the same snapshot and the moment
    the process series were read."""

    def __init__(
        self,
        snapshots: SnapshotHolder,
        *,
        process_metrics: bool = True,
        process_max_age_s: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``process_max_age_s``: reuse the encoded ``process_*`` series this long (0: read them at
        every scrape)."""
        self._snapshots = snapshots
        self._process = ProcessCollector(registry=None) if process_metrics else None
        self._process_max_age_s = process_max_age_s
        self._monotonic = monotonic
        self._process_bodies: dict[str, tuple[float, bytes]] = {}
        self._cached_snapshot: Snapshot | None = None
        self._bodies: dict[str, bytes] = {}
        self.renders = 0
        """Snapshot encodings so far (a test reads it to see the cache work)."""

    def render(self, accept_header: str | None = None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept_header or "")
        snapshot = self._snapshots.latest()
        if snapshot is not self._cached_snapshot:
            self._cached_snapshot, self._bodies = snapshot, {}
        body = self._bodies.get(content_type)
        if body is None:
            families = [] if snapshot is None else list(snapshot_metrics(snapshot))
            body = encoder(_Families(families))
            self.renders += 1
            self._bodies = {**self._bodies, content_type: body}  # a new dict: readers never see a half
        if self._process is None:
            return body, content_type
        now_m = self._monotonic()
        hit = self._process_bodies.get(content_type)
        if hit is not None and now_m - hit[0] < self._process_max_age_s:
            process = hit[1]
        else:
            process = encoder(_Families(self._process.collect()))
            self._process_bodies = {**self._process_bodies, content_type: (now_m, process)}
        if body.endswith(_OPENMETRICS_EOF):  # OpenMetrics: one "# EOF" at the very end
            body = body[: -len(_OPENMETRICS_EOF)]
        return body + process, content_type


def render(registry: CollectorRegistry, accept_header: str | None = None) -> tuple[bytes, str]:
    """The exposition in the format the scraper asked for (text 0.0.4 by default, OpenMetrics when
    the ``Accept`` header prefers it): ``(body, content_type)``."""
    encoder, content_type = choose_encoder(accept_header or "")
    return encoder(registry), content_type
