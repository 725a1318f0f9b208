"""A scripted simulation of N GPUs: the telemetry source for machines without GPUs, demos and tests.

A :class:`Scenario` is data (TOML under ``watchdog/telemetry/scenarios/``, or built in code with
:meth:`Scenario.from_phases`): a GPU model, a GPU count, the enforced power limit, and a list of
:class:`Phase` s - each with a duration, the trainer phase the job would report, the optimizer step
rate, and a per-GPU :class:`GpuBehaviour` (power as a fraction of the limit, utilisation, memory,
jitter, traffic), with optional overrides for some GPUs (the checkpoint writer on GPU 0, ranks that
reached ``epoch_end`` while others are still in ``train``). Transitions are abrupt; jitter is not
smooth either - both are what the classifier's hysteresis has to cope with anyway.

Determinism: every value is a pure function of (scenario, seed, GPU, time). The noise comes from a
counter-based hash of (seed, GPU, sample tick, channel), not from a stateful generator, so the same
time always reads the same, whatever was sampled before, and a 15-minute recording can be rendered
in one vectorised call (:meth:`Scenario.render`, used by :mod:`gpu_triage.telemetry.recording_writer`).

Ground truth: :meth:`SimSource.truth` says, for a time, which phase the script is in, what each rank
would report as its trainer phase, and the simulated optimizer step - what a simulated job needs to
write real progress files, and what a test needs to score a verdict.

Units follow :class:`~gpu_triage.model.samples.GpuSample`. Counters (``energy_j``, ``nvlink_*_bytes``)
integrate each phase's *mean* rate, so they are smooth and monotonic; instantaneous power carries
the jitter. ``temperature_c`` is a crude estimate (30 C + 40 C x mean power fraction), not a model.
"""

from __future__ import annotations

import bisect
import math
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpu_triage.model.samples import GpuInfo, GpuSample, TelemetryUnavailable
from gpu_triage.telemetry.bus_ids import sim_bus_id
from gpu_triage.telemetry.scenarios import DEFAULT_SCENARIO, find

__all__ = [
    "GpuBehaviour",
    "Phase",
    "PhaseSpan",
    "Scenario",
    "ScenarioError",
    "SimFrame",
    "SimSource",
    "SimTruth",
]

MIB = 1024 * 1024
JOB_PHASES = ("init", "train", "eval", "checkpoint", "epoch_end", "done")
"""Trainer phases of the progress-file contract (DESIGN)."""


class ScenarioError(ValueError):
    """A scenario is malformed; the message names the file (or 'from_phases') and the key."""


# -- the data model ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuBehaviour:
    """What one GPU does during a phase. Fractions are of the enforced power limit; jitters are one
    standard deviation of bounded noise (at most 3 sigma either side)."""

    power_fraction: float
    utilization_ratio: float
    power_jitter_fraction: float = 0.0
    util_jitter: float = 0.0
    memory_used_fraction: float = 0.5
    """Default 0.5: a process holds memory (a hang with no memory held would look idle)."""
    nvlink_bytes_per_s: float = 0.0
    """Each direction (tx and rx alike)."""
    pcie_tx_bytes_per_s: float = 0.0
    pcie_rx_bytes_per_s: float = 0.0
    sm_clock_mhz: float | None = None
    """None: the scenario's maximum SM clock."""
    job_phase: str | None = None
    """The trainer phase this GPU's rank reports, when it differs from the phase's ``job_phase``."""
    note: str = ""


_BEHAVIOUR_KEYS = {f.name for f in fields(GpuBehaviour)}


@dataclass(frozen=True, slots=True)
class Phase:
    """One stretch of the script. ``overrides`` pairs GPU index sets with their behaviour (the last
    override naming a GPU wins)."""

    name: str
    duration_s: float
    default: GpuBehaviour
    job_phase: str = "train"
    step_rate_per_s: float = 0.0
    """Optimizer steps per second; 0 = frozen."""
    overrides: tuple[tuple[frozenset[int], GpuBehaviour], ...] = ()
    note: str = ""

    def behaviour(self, gpu: int) -> GpuBehaviour:
        for gpus, behaviour in reversed(self.overrides):
            if gpu in gpus:
                return behaviour
        return self.default

    def job_phase_of(self, gpu: int) -> str:
        return self.behaviour(gpu).job_phase or self.job_phase


@dataclass(frozen=True, slots=True)
class SimTruth:
    """Ground truth at one time: where the script is and what the simulated job would report."""

    time_s: float
    """Seconds since the scenario started (not wrapped by loops)."""
    loop: int
    """How many times the scenario has restarted."""
    phase_index: int
    phase_name: str
    job_phase: str
    """The phase's trainer phase (what most ranks report)."""
    job_phases: tuple[str, ...]
    """Per GPU/rank on this node (differs from ``job_phase`` where overridden: epoch_end vs train)."""
    step: int
    """The simulated optimizer step (monotonic across loops, as a job resumed from a checkpoint)."""
    phase_elapsed_s: float
    phase_remaining_s: float
    """Until the phase ends (``inf`` for the last phase of a scenario that does not loop)."""


@dataclass(frozen=True, slots=True)
class PhaseSpan:
    """One phase occurrence on the timeline, in seconds from the scenario start."""

    name: str
    job_phase: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class SimFrame:
    """Rendered telemetry: arrays of shape [T] (per time) or [T, G] (per time and GPU)."""

    time_s: np.ndarray
    phase_index: np.ndarray
    power_w: np.ndarray
    utilization_ratio: np.ndarray
    memory_used_bytes: np.ndarray
    energy_j: np.ndarray
    nvlink_bytes: np.ndarray
    pcie_tx_bytes_per_s: np.ndarray
    pcie_rx_bytes_per_s: np.ndarray
    sm_clock_mhz: np.ndarray
    temperature_c: np.ndarray


# -- deterministic noise ---------------------------------------------------------------------------

_K_SEED = np.uint64(0x9E3779B97F4A7C15)
_K_GPU = np.uint64(0xC2B2AE3D27D4EB4F)
_K_TICK = np.uint64(0x165667B19E3779F9)
_K_CHANNEL = np.uint64(0xD6E8FEB86659FD93)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _noise(seed: int, ticks: np.ndarray, gpus: int, channel: int) -> np.ndarray:
    """Standard noise of shape [T, G]: mean 0, sd 1, bounded to [-3, 3] (Irwin-Hall of 3 uniforms).

    A pure function of (seed, tick, GPU, channel): counter-based, so any time can be rendered alone.
    One 64-bit hash per value yields the three 21-bit uniforms.
    """
    with np.errstate(over="ignore"):
        h = _splitmix64(
            np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _K_SEED
            + ticks.astype(np.uint64)[:, None] * _K_TICK
            + np.arange(gpus, dtype=np.uint64)[None, :] * _K_GPU
            + np.uint64(channel + 1) * _K_CHANNEL
        )
    mask = np.uint64((1 << 21) - 1)
    total = (
        (h & mask).astype(np.float64)
        + ((h >> np.uint64(21)) & mask).astype(np.float64)
        + ((h >> np.uint64(42)) & mask).astype(np.float64)
    ) * (1.0 / (1 << 21))
    return (total - 1.5) / 0.5


# -- parsing ------------------------------------------------------------------------------------------

_TOP_KEYS = {
    "name",
    "description",
    "model",
    "device_name",
    "gpus",
    "power_limit_w",
    "memory_total_mib",
    "sm_clock_max_mhz",
    "sample_rate_hz",
    "loop",
    "notes",
    "behaviours",
    "phases",
}
_PHASE_KEYS = {"name", "duration_s", "job_phase", "step_rate_per_s", "gpu", "overrides", "note"}
_RANGES: dict[str, tuple[float, float]] = {
    "power_fraction": (0.0, 1.5),
    "utilization_ratio": (0.0, 1.0),
    "power_jitter_fraction": (0.0, 0.5),
    "util_jitter": (0.0, 0.5),
    "memory_used_fraction": (0.0, 1.0),
    "nvlink_bytes_per_s": (0.0, math.inf),
    "pcie_tx_bytes_per_s": (0.0, math.inf),
    "pcie_rx_bytes_per_s": (0.0, math.inf),
    "sm_clock_mhz": (0.0, 1e5),
}


def _number(origin: str, where: str, value: Any, lo: float, hi: float, *, strict_lo: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{origin}: {where}: expected a number, got {value!r}")
    v = float(value)
    if not (lo < v if strict_lo else lo <= v) or v > hi or math.isnan(v):
        bound = f"({lo}, {hi}]" if strict_lo else f"[{lo}, {hi}]"
        raise ScenarioError(f"{origin}: {where}: expected a number in {bound}, got {value!r}")
    return v


def _text(origin: str, where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{origin}: {where}: expected a non-empty string, got {value!r}")
    return value


def _job_phase(origin: str, where: str, value: Any) -> str:
    text = _text(origin, where, value)
    if text not in JOB_PHASES:
        raise ScenarioError(f"{origin}: {where}: expected one of {', '.join(JOB_PHASES)}, got {value!r}")
    return text


def _unknown(origin: str, where: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        prefix = f"{where}." if where else ""
        raise ScenarioError(
            f"{origin}: {prefix}{extra[0]}: unknown key (expected one of {', '.join(sorted(allowed))})"
        )


def _behaviour_fields(origin: str, where: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """Validated behaviour keys from a table (partial: only the keys present)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{where}.{key}"
        if key == "note":
            out[key] = value if isinstance(value, str) else _text(origin, path, value)
        elif key == "job_phase":
            out[key] = _job_phase(origin, path, value)
        elif key in _RANGES:
            out[key] = _number(origin, path, value, *_RANGES[key])
        else:
            raise ScenarioError(
                f"{origin}: {path}: unknown key (expected one of {', '.join(sorted(_BEHAVIOUR_KEYS))})"
            )
    return out


def _behaviour(
    origin: str,
    where: str,
    spec: Any,
    named: Mapping[str, GpuBehaviour],
    base: GpuBehaviour | None = None,
) -> GpuBehaviour:
    """A behaviour from a name, a GpuBehaviour, or a table (``behaviour = NAME`` plus keys to change,
    on top of ``base`` when given)."""
    if isinstance(spec, GpuBehaviour):
        return spec
    if isinstance(spec, str):
        if spec not in named:
            known = ", ".join(sorted(named)) or "(none defined)"
            raise ScenarioError(f"{origin}: {where}: unknown behaviour {spec!r} (defined: {known})")
        return named[spec]
    if not isinstance(spec, Mapping):
        raise ScenarioError(f"{origin}: {where}: expected a behaviour name or a table, got {spec!r}")
    table = dict(spec)
    parent = base
    if "behaviour" in table:
        parent = _behaviour(origin, f"{where}.behaviour", table.pop("behaviour"), named)
    values = _behaviour_fields(origin, where, table)
    if parent is not None:
        return replace(parent, **values)
    for required in ("power_fraction", "utilization_ratio"):
        if required not in values:
            raise ScenarioError(f"{origin}: {where}.{required}: missing (a behaviour needs it)")
    return GpuBehaviour(**values)


def _phase(origin: str, where: str, spec: Any, named: Mapping[str, GpuBehaviour]) -> Phase:
    if isinstance(spec, Phase):
        return spec
    if not isinstance(spec, Mapping):
        raise ScenarioError(f"{origin}: {where}: expected a table, got {spec!r}")
    _unknown(origin, where, spec, _PHASE_KEYS)
    for required in ("name", "duration_s", "gpu"):
        if required not in spec:
            raise ScenarioError(f"{origin}: {where}.{required}: missing")
    default = _behaviour(origin, f"{where}.gpu", spec["gpu"], named)
    overrides = []
    raw_overrides = spec.get("overrides", [])
    if not isinstance(raw_overrides, list):
        raise ScenarioError(f"{origin}: {where}.overrides: expected a list of tables")
    for k, item in enumerate(raw_overrides):
        path = f"{where}.overrides[{k}]"
        if not isinstance(item, Mapping):
            raise ScenarioError(f"{origin}: {path}: expected a table, got {item!r}")
        item = dict(item)
        gpus = item.pop("gpus", None)
        if (
            not isinstance(gpus, list)
            or not gpus
            or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)
        ):
            raise ScenarioError(
                f"{origin}: {path}.gpus: expected a non-empty list of GPU indices, got {gpus!r}"
            )
        overrides.append((frozenset(gpus), _behaviour(origin, path, item, named, base=default)))
    return Phase(
        name=_text(origin, f"{where}.name", spec["name"]),
        duration_s=_number(origin, f"{where}.duration_s", spec["duration_s"], 0.0, 1e9, strict_lo=True),
        default=default,
        job_phase=_job_phase(origin, f"{where}.job_phase", spec.get("job_phase", "train")),
        step_rate_per_s=_number(
            origin, f"{where}.step_rate_per_s", spec.get("step_rate_per_s", 0.0), 0.0, 1e6
        ),
        overrides=tuple(overrides),
        note=str(spec.get("note", "")),
    )


# -- the scenario -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """N GPUs of one model following a script of phases. Build with :meth:`load`, :meth:`from_dict`,
    :meth:`from_phases` or :meth:`symmetric_hang`."""

    name: str
    model: str
    device_name: str
    gpus: int
    power_limit_w: float
    phases: tuple[Phase, ...]
    memory_total_bytes: float = 275_040 * MIB
    sm_clock_max_mhz: float = 2000.0
    sample_rate_hz: float = 10.0
    """A hint: the rate the scenario was written for (and noise ticks at)."""
    loop: bool = False
    """Restart after the last phase; otherwise the last phase holds forever."""
    description: str = ""
    notes: Mapping[str, str] = field(default_factory=dict)
    behaviours: Mapping[str, GpuBehaviour] = field(default_factory=dict)
    origin: str = "from_phases"
    """The file it came from, for messages."""

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def load(cls, name_or_path: str | Path = DEFAULT_SCENARIO) -> Scenario:
        """A built-in scenario by name (``reference-b300``) or a TOML file by path."""
        path = find(name_or_path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ScenarioError(f"{path}: {exc}") from exc
        return cls.from_dict(data, origin=str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, origin: str = "<dict>") -> Scenario:
        """Parse the TOML form (see ``watchdog/telemetry/scenarios/reference-b300.toml``)."""
        _unknown(origin, "", data, _TOP_KEYS)
        raw_behaviours = data.get("behaviours", {})
        if not isinstance(raw_behaviours, Mapping):
            raise ScenarioError(f"{origin}: behaviours: expected a table of tables")
        named: dict[str, GpuBehaviour] = {}
        for key, spec in raw_behaviours.items():
            if not isinstance(spec, Mapping):
                raise ScenarioError(f"{origin}: behaviours.{key}: expected a table")
            named[key] = _behaviour(origin, f"behaviours.{key}", spec, named)
        raw_phases = data.get("phases")
        if not isinstance(raw_phases, list) or not raw_phases:
            raise ScenarioError(f"{origin}: phases: expected a non-empty list of [[phases]] tables")
        phases = tuple(_phase(origin, f"phases[{k}]", p, named) for k, p in enumerate(raw_phases))
        for required in ("name", "model", "gpus", "power_limit_w"):
            if required not in data:
                raise ScenarioError(f"{origin}: {required}: missing")
        gpus = data["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 1024:
            raise ScenarioError(f"{origin}: gpus: expected an integer in [1, 1024], got {gpus!r}")
        notes = data.get("notes", {})
        if not isinstance(notes, Mapping) or not all(isinstance(v, str) for v in notes.values()):
            raise ScenarioError(f"{origin}: notes: expected a table of strings")
        loop = data.get("loop", False)
        if not isinstance(loop, bool):
            raise ScenarioError(f"{origin}: loop: expected true or false, got {loop!r}")
        model = _text(origin, "model", data["model"])
        return cls(
            name=_text(origin, "name", data["name"]),
            model=model,
            device_name=_text(origin, "device_name", data.get("device_name", f"NVIDIA {model}")),
            gpus=gpus,
            power_limit_w=_number(origin, "power_limit_w", data["power_limit_w"], 0.0, 1e5, strict_lo=True),
            phases=phases,
            memory_total_bytes=_number(
                origin, "memory_total_mib", data.get("memory_total_mib", 80 * 1024), 0.0, 1e9, strict_lo=True
            )
            * MIB,
            sm_clock_max_mhz=_number(
                origin, "sm_clock_max_mhz", data.get("sm_clock_max_mhz", 2000), 0.0, 1e5
            ),
            sample_rate_hz=_number(
                origin, "sample_rate_hz", data.get("sample_rate_hz", 10.0), 0.0, 1e4, strict_lo=True
            ),
            loop=loop,
            description=str(data.get("description", "")),
            notes=dict(notes),
            behaviours=named,
            origin=origin,
        )

    @classmethod
    def from_phases(
        cls,
        phases: Sequence[Phase | Mapping[str, Any]],
        *,
        name: str = "custom",
        model: str = "B300",
        device_name: str | None = None,
        gpus: int = 8,
        power_limit_w: float = 1100.0,
        memory_total_bytes: float = 275_040 * MIB,
        sm_clock_max_mhz: float = 2000.0,
        sample_rate_hz: float = 10.0,
        loop: bool = False,
        behaviours: Mapping[str, GpuBehaviour | Mapping[str, Any]] | None = None,
        description: str = "",
    ) -> Scenario:
        """A scenario built in code. Phases are :class:`Phase` objects or tables in the TOML form::

        Scenario.from_phases([
            {"name": "train", "duration_s": 600, "step_rate_per_s": 0.2,
             "gpu": {"power_fraction": 0.78, "utilization_ratio": 0.92, "power_jitter_fraction": 0.01}},
            {"name": "hang", "duration_s": 900, "gpu": {"power_fraction": 0.17, "utilization_ratio": 1.0}},
        ], model="H100", power_limit_w=700)
        """
        origin = "from_phases"
        named: dict[str, GpuBehaviour] = {}
        for key, spec in (behaviours or {}).items():
            named[key] = _behaviour(origin, f"behaviours.{key}", spec, named)
        if not phases:
            raise ScenarioError(f"{origin}: phases: expected at least one phase")
        parsed = tuple(_phase(origin, f"phases[{k}]", p, named) for k, p in enumerate(phases))
        if gpus < 1:
            raise ScenarioError(f"{origin}: gpus: expected >= 1, got {gpus}")
        return cls(
            name=name,
            model=model,
            device_name=device_name or f"NVIDIA {model}",
            gpus=gpus,
            power_limit_w=float(power_limit_w),
            phases=parsed,
            memory_total_bytes=float(memory_total_bytes),
            sm_clock_max_mhz=float(sm_clock_max_mhz),
            sample_rate_hz=float(sample_rate_hz),
            loop=loop,
            description=description,
            behaviours=named,
        )

    @classmethod
    def symmetric_hang(
        cls,
        train_s: float = 600.0,
        hang_s: float = 900.0,
        *,
        model: str = "B300",
        gpus: int = 8,
        power_limit_w: float = 1100.0,
        train_fraction: float = 0.775,
        spin_fraction: float = 0.17,
        sample_rate_hz: float = 10.0,
    ) -> Scenario:
        """``train_s`` of training then a hang of ``hang_s`` on every GPU (100 % utilisation at spin
        power, steps frozen); the default numbers are the built-in reference scenario's."""
        return cls.from_phases(
            [
                {
                    "name": "train",
                    "duration_s": train_s,
                    "step_rate_per_s": 0.2,
                    "gpu": {
                        "power_fraction": train_fraction,
                        "power_jitter_fraction": 0.008,
                        "utilization_ratio": 0.91,
                        "util_jitter": 0.02,
                        "memory_used_fraction": 0.4,
                        "nvlink_bytes_per_s": 4.0e10,
                    },
                },
                {
                    "name": "hang",
                    "duration_s": hang_s,
                    "gpu": {
                        "power_fraction": spin_fraction,
                        "power_jitter_fraction": 0.003,
                        "utilization_ratio": 1.0,
                        "memory_used_fraction": 0.4,
                    },
                },
            ],
            name=f"symmetric-hang-{model.lower()}",
            model=model,
            gpus=gpus,
            power_limit_w=power_limit_w,
            sample_rate_hz=sample_rate_hz,
            description=f"{train_s:g} s of training then a {hang_s:g} s symmetric hang on all {gpus} GPUs",
        )

    # -- the timeline -----------------------------------------------------------------------------

    @property
    def duration_s(self) -> float:
        """One pass through the phases."""
        return float(sum(p.duration_s for p in self.phases))

    def _starts(self) -> np.ndarray:
        starts = self.__dict__.get("_starts_cache")
        if starts is None:
            starts = np.concatenate([[0.0], np.cumsum([p.duration_s for p in self.phases])[:-1]])
            self.__dict__["_starts_cache"] = starts
        return starts

    def locate(self, t_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(phase index, loop count, seconds into the phase) for scenario times ``t_s`` (clamped at 0)."""
        t = np.maximum(np.asarray(t_s, dtype=np.float64), 0.0)
        starts = self._starts()
        if self.loop:
            loops = np.floor(t / self.duration_s)
            local = t - loops * self.duration_s
        else:
            loops = np.zeros_like(t)
            local = t
        idx = np.clip(np.searchsorted(starts, local, side="right") - 1, 0, len(self.phases) - 1)
        return idx, loops.astype(np.int64), local - starts[idx]

    def steps(self, t_s: np.ndarray) -> np.ndarray:
        """The simulated optimizer step at scenario times ``t_s`` (monotonic, across loops too)."""
        idx, loops, elapsed = self.locate(t_s)
        rates = np.array([p.step_rate_per_s for p in self.phases])
        durations = np.array([p.duration_s for p in self.phases])
        before = np.concatenate([[0.0], np.cumsum(rates * durations)[:-1]])
        per_loop = float(np.sum(rates * durations))
        return np.floor(loops * per_loop + before[idx] + rates[idx] * elapsed + 1e-9).astype(np.int64)

    def truth(self, t_s: float, gpus: int | None = None) -> SimTruth:
        """Ground truth at scenario time ``t_s``."""
        n = self.gpus if gpus is None else gpus
        idx_a, loops_a, elapsed_a = self.locate(np.array([t_s]))
        idx, elapsed = int(idx_a[0]), float(elapsed_a[0])
        phase = self.phases[idx]
        last_forever = not self.loop and idx == len(self.phases) - 1
        return SimTruth(
            time_s=float(t_s),
            loop=int(loops_a[0]),
            phase_index=idx,
            phase_name=phase.name,
            job_phase=phase.job_phase,
            job_phases=tuple(phase.job_phase_of(g) for g in range(n)),
            step=int(self.steps(np.array([t_s]))[0]),
            phase_elapsed_s=elapsed,
            phase_remaining_s=math.inf if last_forever else max(0.0, phase.duration_s - elapsed),
        )

    def phase_spans(self, until_s: float) -> list[PhaseSpan]:
        """Phase occurrences from 0 to ``until_s`` (loops unrolled; the last span is cut at ``until_s``)."""
        spans: list[PhaseSpan] = []
        start = 0.0
        while start < until_s:
            for k, phase in enumerate(self.phases):
                last_forever = not self.loop and k == len(self.phases) - 1
                end = until_s if last_forever else min(start + phase.duration_s, until_s)
                spans.append(PhaseSpan(phase.name, phase.job_phase, start, end))
                start = end
                if start >= until_s:
                    break
        return spans

    # -- rendering ----------------------------------------------------------------------------------

    def _table(self, gpus: int) -> dict[str, np.ndarray]:
        """Per-phase, per-GPU parameters [P, G] and counter integrals."""
        cache: dict[int, dict[str, np.ndarray]] = self.__dict__.setdefault("_tables", {})
        if gpus in cache:
            return cache[gpus]
        keys = (
            "power_fraction",
            "power_jitter_fraction",
            "utilization_ratio",
            "util_jitter",
            "memory_used_fraction",
            "nvlink_bytes_per_s",
            "pcie_tx_bytes_per_s",
            "pcie_rx_bytes_per_s",
        )
        table = {
            key: np.array(
                [[getattr(p.behaviour(g), key) for g in range(gpus)] for p in self.phases], dtype=float
            )
            for key in keys
        }
        table["sm_clock_mhz"] = np.array(
            [
                [
                    self.sm_clock_max_mhz
                    if p.behaviour(g).sm_clock_mhz is None
                    else p.behaviour(g).sm_clock_mhz
                    for g in range(gpus)
                ]
                for p in self.phases
            ],
            dtype=float,
        )
        durations = np.array([p.duration_s for p in self.phases])[:, None]
        for rate_key, out in (("power_fraction", "energy"), ("nvlink_bytes_per_s", "nvlink")):
            rate = table[rate_key] * (self.power_limit_w if out == "energy" else 1.0)
            table[f"{out}_rate"] = rate
            table[f"{out}_before"] = np.vstack(
                [np.zeros((1, gpus)), np.cumsum(rate * durations, axis=0)[:-1]]
            )
            table[f"{out}_per_loop"] = np.sum(rate * durations, axis=0)
        cache[gpus] = table
        return table

    def render(self, t_s: np.ndarray, *, gpus: int | None = None, seed: int = 0) -> SimFrame:
        """Telemetry of every GPU at scenario times ``t_s`` (vectorised: millions of points per second)."""
        n = self.gpus if gpus is None else gpus
        t = np.atleast_1d(np.asarray(t_s, dtype=np.float64))
        idx, loops, elapsed = self.locate(t)
        tab = self._table(n)
        ticks = np.floor(np.maximum(t, 0.0) * self.sample_rate_hz + 0.5).astype(np.int64)
        frac = tab["power_fraction"][idx] + tab["power_jitter_fraction"][idx] * _noise(seed, ticks, n, 0)
        power_w = np.clip(frac, 0.02, 1.2) * self.power_limit_w
        util = tab["utilization_ratio"][idx] + tab["util_jitter"][idx] * _noise(seed, ticks, n, 1)
        util = np.round(np.clip(util, 0.0, 1.0), 2)  # NVML reports whole percents
        memory = np.round(tab["memory_used_fraction"][idx] * self.memory_total_bytes / MIB) * MIB
        loops_col = loops[:, None].astype(np.float64)
        el = elapsed[:, None]

        def counter(name: str) -> np.ndarray:
            return (
                loops_col * tab[f"{name}_per_loop"]
                + tab[f"{name}_before"][idx]
                + tab[f"{name}_rate"][idx] * el
            )

        return SimFrame(
            time_s=t,
            phase_index=idx,
            power_w=power_w,
            utilization_ratio=util,
            memory_used_bytes=memory,
            energy_j=counter("energy"),
            nvlink_bytes=counter("nvlink"),
            pcie_tx_bytes_per_s=tab["pcie_tx_bytes_per_s"][idx],
            pcie_rx_bytes_per_s=tab["pcie_rx_bytes_per_s"][idx],
            sm_clock_mhz=tab["sm_clock_mhz"][idx],
            temperature_c=np.round(30.0 + 40.0 * tab["power_fraction"][idx]),
        )


def _as_scenario(scenario: Scenario | str | Path) -> Scenario:
    if isinstance(scenario, Scenario):
        return scenario
    try:
        return Scenario.load(scenario)
    except FileNotFoundError as exc:
        raise TelemetryUnavailable(str(exc)) from exc


# -- the source -------------------------------------------------------------------------------------


NOISE_BLOCK = 600
"""Ticks of noise :meth:`SimSource.sample` computes at once (a minute at 10 Hz)."""


class SimSource:
    """The :class:`~gpu_triage.model.samples.TelemetrySource` over a :class:`Scenario`.

    ``gpus`` overrides the scenario's GPU count (16 = two nodes' worth); ``seed`` picks the noise;
    ``start_s`` is the loop-clock time at which the scenario begins (None: the first call to
    :meth:`sample` or :meth:`truth`). A scenario name or path that does not exist raises
    :class:`TelemetryUnavailable`; a malformed one :class:`ScenarioError`.
    """

    name = "sim"

    def __init__(
        self,
        scenario: Scenario | str | Path = DEFAULT_SCENARIO,
        *,
        gpus: int | None = None,
        seed: int = 0,
        start_s: float | None = None,
    ) -> None:
        self.scenario = _as_scenario(scenario)
        self.gpu_count = self.scenario.gpus if gpus is None else int(gpus)
        if self.gpu_count < 1:
            raise ValueError(f"gpus must be >= 1, got {gpus}")
        self.seed = int(seed)
        self.start_s = start_s
        self._fixed: dict[int, tuple[list[float], ...]] = {}
        self._starts: tuple[list[float], float] | None = None
        self._noise_blocks: dict[int, tuple[int, np.ndarray]] = {}
        """Per phase index: the columns of :meth:`sample` that the phase alone sets."""
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
        # operations in the same order (so equal to the last digit), the phase's constant columns
        # cached. render() over a one-element array costs ~4x more at 10 Hz x 16 GPUs.
        sc, n = self.scenario, self.gpu_count
        t = self.elapsed_s(now_s)
        idx, loops, el = self._locate_one(t)
        tab = sc._table(n)
        fixed = self._fixed.get(idx)
        if fixed is None:
            fixed = self._fixed[idx] = (
                (np.round(tab["memory_used_fraction"][idx] * sc.memory_total_bytes / MIB) * MIB).tolist(),
                tab["pcie_tx_bytes_per_s"][idx].tolist(),
                tab["pcie_rx_bytes_per_s"][idx].tolist(),
                tab["sm_clock_mhz"][idx].tolist(),
                np.round(30.0 + 40.0 * tab["power_fraction"][idx]).tolist(),
            )
        memory, pcie_tx, pcie_rx, clock, temp = fixed
        ticks = np.array([math.floor(max(t, 0.0) * sc.sample_rate_hz + 0.5)], dtype=np.int64)
        frac = (
            tab["power_fraction"][idx] + tab["power_jitter_fraction"][idx] * _noise(self.seed, ticks, n, 0)[0]
        )
        power = (np.clip(frac, 0.02, 1.2) * sc.power_limit_w).tolist()
        util_raw = tab["utilization_ratio"][idx] + tab["util_jitter"][idx] * _noise(self.seed, ticks, n, 1)[0]
        util = np.round(np.clip(util_raw, 0.0, 1.0), 2).tolist()
        energy = (
            loops * tab["energy_per_loop"] + tab["energy_before"][idx] + tab["energy_rate"][idx] * el
        ).tolist()
        nvlink = (
            loops * tab["nvlink_per_loop"] + tab["nvlink_before"][idx] + tab["nvlink_rate"][idx] * el
        ).tolist()
        return [
            GpuSample(
                gpu=g,
                time_s=now_s,
                power_w=power[g],
                power_instant_w=power[g],
                energy_j=energy[g],
                utilization_ratio=util[g],
                memory_used_bytes=memory[g],
                memory_total_bytes=info.memory_total_bytes,
                sm_clock_mhz=clock[g],
                temperature_c=temp[g],
                power_limit_w=info.power_limit_w,
                nvlink_tx_bytes=nvlink[g],
                nvlink_rx_bytes=nvlink[g],
                pcie_tx_bytes_per_s=pcie_tx[g],
                pcie_rx_bytes_per_s=pcie_rx[g],
                pids=self.pids_by_gpu.get(g, ()),
                uuid=info.uuid,
                name=info.name,
                pci_bus_id=info.pci_bus_id,
            )
            for g, info in enumerate(self._infos)
        ]

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

    def _noise_row(self, tick: int, channel: int) -> np.ndarray:
        """``_noise`` of one tick, from a block of :data:`NOISE_BLOCK` ticks computed at once (the
        noise is a pure function of seed, tick, GPU and channel: a block gives the same values)."""
        block = self._noise_blocks.get(channel)
        if block is None or not block[0] <= tick < block[0] + NOISE_BLOCK:
            ticks = np.arange(tick, tick + NOISE_BLOCK, dtype=np.int64)
            block = (tick, _noise(self.seed, ticks, self.gpu_count, channel))
            self._noise_blocks[channel] = block
        return block[1][tick - block[0]]

    def _sample_by_render(self, now_s: float) -> list[GpuSample]:
        """The reference :meth:`sample` computes to the last digit (tests compare the two)."""
        frame = self.scenario.render(np.array([self.elapsed_s(now_s)]), gpus=self.gpu_count, seed=self.seed)
        power = frame.power_w[0].tolist()
        util = frame.utilization_ratio[0].tolist()
        memory = frame.memory_used_bytes[0].tolist()
        energy = frame.energy_j[0].tolist()
        nvlink = frame.nvlink_bytes[0].tolist()
        pcie_tx = frame.pcie_tx_bytes_per_s[0].tolist()
        pcie_rx = frame.pcie_rx_bytes_per_s[0].tolist()
        clock = frame.sm_clock_mhz[0].tolist()
        temp = frame.temperature_c[0].tolist()
        return [
            GpuSample(
                gpu=g,
                time_s=now_s,
                power_w=power[g],
                power_instant_w=power[g],
                energy_j=energy[g],
                utilization_ratio=util[g],
                memory_used_bytes=memory[g],
                memory_total_bytes=info.memory_total_bytes,
                sm_clock_mhz=clock[g],
                temperature_c=temp[g],
                power_limit_w=info.power_limit_w,
                nvlink_tx_bytes=nvlink[g],
                nvlink_rx_bytes=nvlink[g],
                pcie_tx_bytes_per_s=pcie_tx[g],
                pcie_rx_bytes_per_s=pcie_rx[g],
                pids=self.pids_by_gpu.get(g, ()),
                uuid=info.uuid,
                name=info.name,
                pci_bus_id=info.pci_bus_id,
            )
            for g, info in enumerate(self._infos)
        ]

    def close(self) -> None:
        """Nothing to release."""
