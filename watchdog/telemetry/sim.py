"""A scripted simulation of N GPUs: the telemetry source for machines without GPUs, demos and tests.

The scenario - data, parsing, deterministic noise and vectorised rendering - lives in
:mod:`gpu_triage.telemetry.sim_scenario` (its public names are re-exported here); this module is the
:class:`SimSource` that a daemon samples, one time point per cycle.

Ground truth: :meth:`SimSource.truth` says, for a time, which phase the script is in, what each rank
would report as its trainer phase, and the simulated optimizer step - what a simulated job needs to
write real progress files, and what a test needs to score a verdict.

Cost (the daemon samples 16 GPUs at 10 Hz): one sample is the row of :meth:`Scenario.render` for one
time, computed on [G] rows with the same operations in the same order (equal to the last digit; tests
compare the two), from per-phase constants cached at the first visit of a phase and noise computed a
minute at a time. Every :class:`~gpu_triage.model.samples.GpuSample` is built in one place,
:meth:`SimSource._samples`.
"""

from __future__ import annotations

import bisect
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpu_triage.model.samples import GpuInfo, GpuSample, TelemetryUnavailable
from gpu_triage.telemetry.bus_ids import sim_bus_id
from gpu_triage.telemetry.scenarios import DEFAULT_SCENARIO
from gpu_triage.telemetry.sim_scenario import (
    JOB_PHASES,
    MIB,
    GpuBehaviour,
    Phase,
    PhaseSpan,
    Scenario,
    ScenarioError,
    SimFrame,
    SimTruth,
    noise,
)

__all__ = [
    "JOB_PHASES",
    "MIB",
    "GpuBehaviour",
    "Phase",
    "PhaseSpan",
    "Scenario",
    "ScenarioError",
    "SimFrame",
    "SimSource",
    "SimTruth",
]


def _as_scenario(scenario: Scenario | str | Path) -> Scenario:
    if isinstance(scenario, Scenario):
        return scenario
    try:
        return Scenario.load(scenario)
    except FileNotFoundError as exc:
        raise TelemetryUnavailable(str(exc)) from exc


NOISE_BLOCK = 600
"""Ticks of noise :meth:`SimSource.sample` computes at once (a minute at 10 Hz)."""
RENDER_CHUNK = 50
"""Ticks of power and utilisation :meth:`SimSource.sample` computes at once within one phase (5 s)."""


@dataclass(frozen=True, slots=True)
class _PhaseRows:
    """What one phase sets for every GPU ([G] rows of the scenario's table), cached per phase."""

    power_fraction: np.ndarray
    power_jitter_fraction: np.ndarray
    utilization_ratio: np.ndarray
    util_jitter: np.ndarray
    counters: list[tuple[float, float, float, float, float, float]]
    """Per GPU: energy per loop, before the phase and its rate, then the same for NVLink bytes (plain
    floats: the counters are computed per GPU in Python each tick - a numpy call costs ~1 us on a
    warm cache and ~10 times that on the cold one the daemon wakes to ten times a second)."""
    memory: list[float]
    pcie_tx: list[float]
    pcie_rx: list[float]
    clock: list[float]
    temperature: list[float]


class SimSource:
    """The :class:`~gpu_triage.model.samples.TelemetrySource` over a :class:`Scenario`.

    ``gpus`` overrides the scenario's GPU count (16 = two nodes' worth); ``seed`` picks the noise;
    ``start_s`` is the loop-clock time at which the scenario begins (None: the first call to
    :meth:`sample` or :meth:`truth`). ``job_session``: the session of the simulated job on these GPUs
    (its launcher's pid, a session leader: ``gpu_triage.demo.simjob``); a daemon on this source judges
    that session's processes and no other process of the machine (None: no process at all). A
    scenario name or path that does not exist raises :class:`TelemetryUnavailable`; a malformed one
    :class:`ScenarioError`.
    """

    name = "sim"

    def __init__(
        self,
        scenario: Scenario | str | Path = DEFAULT_SCENARIO,
        *,
        gpus: int | None = None,
        seed: int = 0,
        start_s: float | None = None,
        job_session: int | None = None,
    ) -> None:
        self.scenario = _as_scenario(scenario)
        self.job_session = job_session
        """The simulated job's session (see the class); the daemon checks it once, at its start."""
        self.gpu_count = self.scenario.gpus if gpus is None else int(gpus)
        if self.gpu_count < 1:
            raise ValueError(f"gpus must be >= 1, got {gpus}")
        self.seed = int(seed)
        self.start_s = start_s
        self._rows: dict[int, _PhaseRows] = {}
        """Per phase index: the [G] rows of the scenario's table that :meth:`sample` reads."""
        self._starts: tuple[list[float], float] | None = None
        self._noise_blocks: dict[int, tuple[int, np.ndarray]] = {}
        """Per noise channel: (first tick, noise of :data:`NOISE_BLOCK` ticks from it)."""
        self._chunk: tuple[int, int, list[list[float]], list[list[float]]] | None = None
        """(phase index, first tick, power rows, utilisation rows) of the ticks computed last."""
        self.pids_by_gpu: dict[int, tuple[int, ...]] = {}
        """Processes to report per GPU (a simulated job's ranks), set with :meth:`attach_pids`."""
        sc = self.scenario
        self._infos = [
            GpuInfo(
                gpu=g,
                name=sc.device_name,
                uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpu-triage/sim/{sc.name}/{self.seed}/{g}')}",
                power_limit_w=sc.power_limit_w,
                memory_total_bytes=sc.memory_total_bytes,
                pci_bus_id=sim_bus_id(g),
            )
            for g in range(self.gpu_count)
        ]

    def gpus(self) -> list[GpuInfo]:
        return list(self._infos)

    def elapsed_s(self, now_s: float) -> float:
        """Scenario time for loop-clock time ``now_s`` (anchors ``start_s`` on first use)."""
        if self.start_s is None:
            self.start_s = float(now_s)
        return float(now_s) - self.start_s

    def truth(self, now_s: float) -> SimTruth:
        """Ground truth (phase, per-rank trainer phase, optimizer step) at loop-clock time ``now_s``."""
        return self.scenario.truth(self.elapsed_s(now_s), self.gpu_count)

    def attach_pids(self, pids_by_gpu: Mapping[int, Sequence[int]]) -> None:
        """Report these processes on these GPUs from now on (as NVML's compute PIDs would)."""
        self.pids_by_gpu = {int(g): tuple(int(p) for p in pids) for g, pids in pids_by_gpu.items()}

    def sample(self, now_s: float) -> list[GpuSample]:
        # One time point: the rows of Scenario.render's arrays, computed on [G] rows with the same
        # operations in the same order (so equal to the last digit), the phase's rows cached and the
        # noise read from a block computed a minute at a time.
        sc = self.scenario
        t = self.elapsed_s(now_s)
        idx, loops, el = self._locate_one(t)
        rows = self._phase_rows(idx)
        tick = math.floor(max(t, 0.0) * sc.sample_rate_hz + 0.5)
        power, util = self._power_util(idx, rows, tick)
        # Scenario.render's counters, loops * per_loop + before + rate * el, per GPU in plain floats:
        # the same IEEE operations in the same order as numpy's on the rows, so the same values
        counters = rows.counters
        energy = [loops * e_loop + e_before + e_rate * el for e_loop, e_before, e_rate, _, _, _ in counters]
        nvlink = [loops * n_loop + n_before + n_rate * el for _, _, _, n_loop, n_before, n_rate in counters]
        return self._samples(
            now_s,
            power,
            util,
            rows.memory,
            energy,
            nvlink,
            rows.pcie_tx,
            rows.pcie_rx,
            rows.clock,
            rows.temperature,
        )

    def _samples(
        self,
        now_s: float,
        power: list[float],
        util: list[float],
        memory: list[float],
        energy: list[float],
        nvlink: list[float],
        pcie_tx: list[float],
        pcie_rx: list[float],
        clock: list[float],
        temp: list[float],
    ) -> list[GpuSample]:
        """One time point's per-GPU columns -> the samples (the one place a sim sample is built).
        Positional, in GpuSample's field order (16 of them 10 times a second: keywords cost ~40 %
        more); ``test_sim_source`` checks every field by name against the rendered frame."""
        pids = self.pids_by_gpu
        return [
            GpuSample(
                g,  # gpu
                now_s,  # time_s
                power[g],  # power_w
                power[g],  # power_instant_w
                energy[g],  # energy_j
                util[g],  # utilization_ratio
                memory[g],  # memory_used_bytes
                info.memory_total_bytes,
                clock[g],  # sm_clock_mhz
                temp[g],  # temperature_c
                info.power_limit_w,
                nvlink[g],  # nvlink_tx_bytes
                nvlink[g],  # nvlink_rx_bytes
                pcie_tx[g],  # pcie_tx_bytes_per_s
                pcie_rx[g],  # pcie_rx_bytes_per_s
                pids.get(g, ()),
                info.uuid,
                info.name,
                info.pci_bus_id,
            )
            for g, info in enumerate(self._infos)
        ]

    def _phase_rows(self, idx: int) -> _PhaseRows:
        rows = self._rows.get(idx)
        if rows is None:
            sc = self.scenario
            tab = sc.table(self.gpu_count)
            rows = self._rows[idx] = _PhaseRows(
                power_fraction=tab["power_fraction"][idx],
                power_jitter_fraction=tab["power_jitter_fraction"][idx],
                utilization_ratio=tab["utilization_ratio"][idx],
                util_jitter=tab["util_jitter"][idx],
                counters=list(
                    zip(
                        tab["energy_per_loop"].tolist(),
                        tab["energy_before"][idx].tolist(),
                        tab["energy_rate"][idx].tolist(),
                        tab["nvlink_per_loop"].tolist(),
                        tab["nvlink_before"][idx].tolist(),
                        tab["nvlink_rate"][idx].tolist(),
                        strict=True,
                    )
                ),
                memory=(
                    np.round(tab["memory_used_fraction"][idx] * sc.memory_total_bytes / MIB) * MIB
                ).tolist(),
                pcie_tx=tab["pcie_tx_bytes_per_s"][idx].tolist(),
                pcie_rx=tab["pcie_rx_bytes_per_s"][idx].tolist(),
                clock=tab["sm_clock_mhz"][idx].tolist(),
                temperature=np.round(30.0 + 40.0 * tab["power_fraction"][idx]).tolist(),
            )
        return rows

    def _locate_one(self, t_s: float) -> tuple[int, float, float]:
        """:meth:`Scenario.locate` for one time, in plain floats (the same operations, the same
        results): (phase index, loop count, seconds into the phase)."""
        sc = self.scenario
        if self._starts is None:
            self._starts = (sc._starts().tolist(), sc.duration_s)
        starts, duration_s = self._starts
        t = max(float(t_s), 0.0)
        if sc.loop:
            loops = float(math.floor(t / duration_s))
            local = t - loops * duration_s
        else:
            loops, local = 0.0, t
        idx = min(max(bisect.bisect_right(starts, local) - 1, 0), len(starts) - 1)
        return idx, loops, local - starts[idx]

    def _power_util(self, idx: int, rows: _PhaseRows, tick: int) -> tuple[list[float], list[float]]:
        """Power and utilisation of one tick, from :data:`RENDER_CHUNK` ticks of the same phase
        computed at once (the same operations on [T, G] rows as on [G]: the same values)."""
        chunk = self._chunk
        if chunk is None or chunk[0] != idx or not chunk[1] <= tick < chunk[1] + len(chunk[2]):
            n0, n1 = self._noise_rows(tick, 0), self._noise_rows(tick, 1)
            sc = self.scenario
            frac = rows.power_fraction + rows.power_jitter_fraction * n0
            power = (np.clip(frac, 0.02, 1.2) * sc.power_limit_w).tolist()
            util_raw = rows.utilization_ratio + rows.util_jitter * n1
            util = np.round(np.clip(util_raw, 0.0, 1.0), 2).tolist()
            chunk = self._chunk = (idx, tick, power, util)
        return chunk[2][tick - chunk[1]], chunk[3][tick - chunk[1]]

    def _noise_rows(self, tick: int, channel: int) -> np.ndarray:
        """The noise of up to :data:`RENDER_CHUNK` ticks from ``tick`` (fewer at the end of a block)."""
        self._noise_row(tick, channel)
        start, block = self._noise_blocks[channel]
        return block[tick - start : tick - start + RENDER_CHUNK]

    def _noise_row(self, tick: int, channel: int) -> np.ndarray:
        """``noise`` of one tick, from a block of :data:`NOISE_BLOCK` ticks computed at once (the
        noise is a pure function of seed, tick, GPU and channel: a block gives the same values)."""
        block = self._noise_blocks.get(channel)
        if block is None or not block[0] <= tick < block[0] + NOISE_BLOCK:
            ticks = np.arange(tick, tick + NOISE_BLOCK, dtype=np.int64)
            block = (tick, noise(self.seed, ticks, self.gpu_count, channel))
            self._noise_blocks[channel] = block
        return block[1][tick - block[0]]

    def _sample_by_render(self, now_s: float) -> list[GpuSample]:
        """The reference :meth:`sample` computes to the last digit (tests compare the two)."""
        frame = self.scenario.render(np.array([self.elapsed_s(now_s)]), gpus=self.gpu_count, seed=self.seed)
        return self._samples(
            now_s,
            *(
                getattr(frame, name)[0].tolist()
                for name in (
                    "power_w",
                    "utilization_ratio",
                    "memory_used_bytes",
                    "energy_j",
                    "nvlink_bytes",
                    "pcie_tx_bytes_per_s",
                    "pcie_rx_bytes_per_s",
                    "sm_clock_mhz",
                    "temperature_c",
                )
            ),
        )

    def close(self) -> None:
        """Nothing to release."""
