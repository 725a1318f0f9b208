"""Per-GPU classification in the daemon: the right table for each GPU, its classifier, its counters.

Pure apart from the samples handed in: a :class:`GpuTracker` turns one cycle's
:class:`~gpu_triage.model.samples.GpuSample` list into state changes and the
:class:`~gpu_triage.model.snapshot.GpuStatus` rows of the snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpu_triage.classify.hysteresis import GpuClassifier
from gpu_triage.classify.power_table import PowerTable
from gpu_triage.classify.table_files import resolve_table
from gpu_triage.model.limits import MAX_POWER_LIMIT_W, MIN_POWER_LIMIT_W
from gpu_triage.model.samples import GpuSample
from gpu_triage.model.snapshot import GpuStatus
from gpu_triage.model.states import GpuState


def _edge(table: PowerTable, state: GpuState, key: str, limit_w: float | None) -> float | None:
    """A band edge in watts (None without a limit or for an open edge)."""
    fraction = float(getattr(table.bands[state], key))
    if not limit_w or not math.isfinite(fraction):
        return None
    return fraction * limit_w


@dataclass(frozen=True, slots=True)
class StateChange:
    gpu: int
    uuid: str | None
    old: GpuState
    new: GpuState
    since: float
    power_w: float | None
    utilization_ratio: float | None


GpuFacts = tuple[str, "float | None", GpuState, "float | None", int, int, "float | None", "float | None"]
"""What one GPU's status row holds besides its last sample: the table's model, the power limit, the
state and since when, the read errors, the impossible limits, the compute floor and the spin ceiling.
They change with a state change, a failed read or a new limit, not with each sample."""

StatusInputs = tuple[tuple[GpuSample, ...], tuple[GpuFacts, ...]]
"""The GPUs' status rows before they are made (:meth:`GpuTracker.status_inputs`): each GPU's last
sample and its :data:`GpuFacts`, in GPU order (plain tuples: taken 10 times a second)."""


def status_rows(inputs: StatusInputs) -> tuple[GpuStatus, ...]:
    """The snapshot's GPU rows. Pure: any thread may make them from the values the loop took; the loop
    makes them once per process period, a reader when it builds a snapshot (not 10 times a second)."""
    out = []
    samples, facts = inputs
    for s, (model, limit_w, state, since_s, read_errors, impossible, floor_w, ceiling_w) in zip(
        samples, facts, strict=True
    ):
        ok = s.error is None
        out.append(
            GpuStatus(
                gpu=s.gpu,
                uuid=s.uuid,
                name=s.name,
                model=model,
                power_w=s.power_w if ok else None,
                power_limit_w=limit_w,
                utilization_ratio=s.utilization_ratio if ok else None,
                memory_used_bytes=s.memory_used_bytes if ok else None,
                state=state,
                state_since=since_s,
                energy_j=s.energy_j if ok else None,
                temperature_c=s.temperature_c if ok else None,
                sm_clock_mhz=s.sm_clock_mhz if ok else None,
                read_errors_total=read_errors,
                impossible_power_limits_total=impossible,
                compute_floor_w=floor_w,
                spin_ceiling_w=ceiling_w,
                pci_bus_id=s.pci_bus_id,
            )
        )
    return tuple(out)


@dataclass(slots=True)
class _Gpu:
    table: PowerTable
    classifier: GpuClassifier
    last: GpuSample | None = None
    read_errors_total: int = 0
    impossible_limits_total: int = 0
    """Samples whose power limit no GPU has (0 W, 1e308 W: a glitch or a hostile recording); each is
    classified against its table's own limit, never against the impossible one (which would scale
    every band out of reach and hide a deadlock)."""
    last_good_s: float | None = None
    edges: tuple[float | None, float | None, float | None] | None = None
    """(limit, compute floor, spin ceiling) in watts, recomputed only when the limit changes."""


@dataclass
class GpuTracker:
    model: str | None = None
    """Force this table model for every GPU (config classifier.model)."""
    table_path: Path | None = None
    dwell_s: Mapping[str, float] = field(default_factory=dict)
    _gpus: dict[int, _Gpu] = field(default_factory=dict)
    _order: tuple[_Gpu, ...] = field(default=(), init=False, repr=False, compare=False)
    """The GPUs in GPU order (remade when one is added)."""
    _facts: tuple[GpuFacts, ...] | None = field(default=None, init=False, repr=False, compare=False)
    """Every GPU's :data:`GpuFacts` as :meth:`status_inputs` last made them; None when a GPU's may
    have changed since (:meth:`update` clears it on a state change, a failed read, an impossible or
    a new power limit, a new GPU or table)."""

    def _table_for(self, sample: GpuSample) -> PowerTable:
        table = resolve_table(
            model=self.model,
            device_name=sample.name,
            path=self.table_path,
            power_limit_w=sample.power_limit_w,
        )
        if self.dwell_s:
            bands = {
                s: replace(b, dwell_s=float(self.dwell_s.get(str(s), b.dwell_s)))
                for s, b in table.bands.items()
            }
            table = replace(table, bands=bands)
        return table

    def tables(self) -> dict[int, PowerTable]:
        return {g: t.table for g, t in self._gpus.items()}

    def update(self, now: float, samples: Sequence[GpuSample]) -> list[StateChange]:
        changes: list[StateChange] = []
        for s in samples:
            limit_w = s.power_limit_w  # power_limit_problem's range, inline: 16 GPUs 10 times a second
            impossible = limit_w is not None and not MIN_POWER_LIMIT_W <= limit_w <= MAX_POWER_LIMIT_W
            if impossible:
                s = replace(s, power_limit_w=None)
            gpu = self._gpus.get(s.gpu)
            if gpu is None or (
                s.name and gpu.last is not None and gpu.last.name != s.name and s.error is None
            ):
                table = self._table_for(s)
                gpu = _Gpu(table, GpuClassifier(table))
                self._gpus[s.gpu] = gpu
                self._order = tuple(self._gpus[g] for g in sorted(self._gpus))
                self._facts = None
            if impossible:
                gpu.impossible_limits_total += 1
                self._facts = None
            limit = s.power_limit_w or gpu.table.power_limit_w
            if s.error is not None or s.power_w is None or not limit:
                frac = math.nan
                if s.error is not None:
                    gpu.read_errors_total += 1
            else:
                frac = s.power_w / limit
                gpu.last_good_s = now
            util = math.nan if s.utilization_ratio is None or s.error is not None else s.utilization_ratio
            c = gpu.classifier
            if c.update(now, frac, util):
                changes.append(
                    StateChange(
                        s.gpu, s.uuid, c.previous, c.state, c.since_s or now, s.power_w, s.utilization_ratio
                    )
                )
                self._facts = None
            last = gpu.last
            if s.error is None or last is None:
                if last is None or last.power_limit_w != s.power_limit_w:
                    self._facts = None  # the row's limit and band edges follow the sample's limit
                gpu.last = s
            else:  # keep the last good static facts (name, uuid, limit) but report the failure
                self._facts = None  # one more read error
                gpu.last = replace(
                    s,
                    name=last.name,
                    uuid=last.uuid,
                    power_limit_w=last.power_limit_w,
                    pci_bus_id=s.pci_bus_id or last.pci_bus_id,
                )
        return changes

    def status_inputs(self) -> StatusInputs:
        """What each GPU's status row is made of now, as values that no longer change: the loop takes
        them each cycle (the last samples; the facts made again only after :meth:`update` changed
        one), :func:`status_rows` makes the rows when a reader wants them."""
        order = self._order
        facts = self._facts
        if facts is None:
            facts = self._facts = tuple(self._facts_of(t) for t in order)
        return tuple([t.last for t in order]), facts  # type: ignore[misc]  # every GPU has a sample

    @staticmethod
    def _facts_of(t: _Gpu) -> GpuFacts:
        s = t.last
        assert s is not None
        limit = s.power_limit_w or t.table.power_limit_w
        if t.edges is None or t.edges[0] != limit:
            t.edges = (
                limit,
                _edge(t.table, GpuState.COMPUTE, "power_min", limit),
                _edge(t.table, GpuState.CHECKPOINT_OR_DEADLOCK, "power_max", limit),
            )
        c, (_, floor_w, ceiling_w) = t.classifier, t.edges
        return (
            t.table.model,
            limit,
            c.state,
            c.since_s,
            t.read_errors_total,
            t.impossible_limits_total,
            floor_w,
            ceiling_w,
        )

    def statuses(self) -> tuple[GpuStatus, ...]:
        return status_rows(self.status_inputs())

    def nvlink_bytes(self, gpu: int) -> float | None:
        t = self._gpus.get(gpu)
        if t is None or t.last is None or t.last.error is not None:
            return None
        tx, rx = t.last.nvlink_tx_bytes, t.last.nvlink_rx_bytes
        if tx is None and rx is None:
            return None
        return (tx or 0.0) + (rx or 0.0)
