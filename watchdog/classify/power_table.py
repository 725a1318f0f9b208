"""Calibrated power tables: one TOML per GPU model, looked up by the NVML device name.

A table holds, for each GPU state, a *band*: a box in (power as a fraction of the enforced power
limit, utilisation ratio) space, plus the margins that widen the box once the GPU is in that state
(hysteresis: separate enter and exit thresholds) and the dwell a new state must persist before it is
taken. Bands are tried in a fixed priority order (:data:`BAND_ORDER`); the first whose *enter* box
contains a sample names its raw state.

This module is pure (tomllib only): no NVML, no I/O beyond reading the TOML files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_triage.model.states import GpuState

#: Priority order: the first band whose enter box holds a sample wins.
BAND_ORDER: tuple[GpuState, ...] = (
    GpuState.COMPUTE,
    GpuState.CHECKPOINT_OR_DEADLOCK,
    GpuState.COMMUNICATION,
    GpuState.DATA_STARVATION,
    GpuState.IDLE,
)
BUILTIN_MODELS: tuple[str, ...] = ("B300", "B200", "H200", "H100", "A100")
GENERIC = "generic"
Box = tuple[float, float, float, float]
"""(power_min, power_max, util_min, util_max): power as a fraction of the limit, utilisation 0..1."""


class TableError(ValueError):
    """A table file is malformed; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class Band:
    """Enter box ``[power_min, power_max) x [util_min, util_max)`` (fractions of the limit, ratios).

    Once in this state the GPU stays while the sample lies in the exit box, the enter box widened on
    every finite side by ``margin_power`` / ``margin_util``.
    """

    state: GpuState
    power_min: float = 0.0
    power_max: float = math.inf
    util_min: float = 0.0
    util_max: float = math.inf
    margin_power: float = 0.0
    margin_util: float = 0.0
    dwell_s: float = 0.0
    note: str = ""
    estimate: bool = False
    also: tuple[Box, ...] = ()
    """Further enter boxes of the same state (a band need not be one rectangle)."""

    def enter_boxes(self) -> tuple[Box, ...]:
        return ((self.power_min, self.power_max, self.util_min, self.util_max), *self.also)

    def exit_boxes(self) -> tuple[Box, ...]:
        """The enter boxes widened on every finite side by the margins."""
        return tuple(
            (
                pmin - self.margin_power if pmin > 0 else -math.inf,
                pmax + self.margin_power,
                umin - self.margin_util if umin > 0 else -math.inf,
                umax + self.margin_util,
            )
            for pmin, pmax, umin, umax in self.enter_boxes()
        )


@dataclass(frozen=True, slots=True)
class PowerTable:
    model: str
    description: str
    match: tuple[str, ...]
    power_limit_w: float | None
    bands: dict[GpuState, Band]
    idle_power_max: float
    """Power-only fallback (no utilisation): below this fraction a GPU is idle, above it and below the
    checkpoint band's power_max it is checkpoint_or_deadlock."""
    unknown_dwell_s: float = 2.0
    vote_share: float = 0.8
    """A new state needs this share of the samples in its last dwell (1.0: all of them)."""
    notes: dict[str, str] = field(default_factory=dict)
    path: str = ""

    def band(self, state: GpuState) -> Band:
        return self.bands[state]

    def dwell_s(self, state: GpuState) -> float:
        if state is GpuState.UNKNOWN:
            return self.unknown_dwell_s
        return self.bands[state].dwell_s

    def with_limit(self, power_limit_w: float) -> PowerTable:
        return replace(self, power_limit_w=power_limit_w)

    def at_limit(self, power_limit_w: float) -> PowerTable:
        """This table for a GPU whose enforced limit is ``power_limit_w`` (a capped node, or a board
        with another default limit than the table's reference).

        Bands are fractions of the enforced limit, but waiting and idling draw about the same *watts*
        whatever the cap (a spin is a resident kernel doing nothing; idle is the board's floor): an
        H100 capped at 400 W still spins at ~155 W, which as a plain fraction (0.39) reads as
        communication, and a GPU that was computing would never leave compute. So every power edge at
        or below the spin band's ceiling is anchored in watts at the table's reference limit and
        rescaled; the compute floor stays a fraction of the enforced limit but is kept above the
        rescaled spin ceiling by compute's own margin (so a hung capped GPU leaves compute); edges in
        between are spread over the new gap and edges above shift with the floor. The mapping is
        monotonic, so the bands still cover every point. Without a reference limit (the generic
        table) only the limit changes.
        """
        ref = self.power_limit_w
        if ref is None or ref <= 0 or power_limit_w <= 0 or abs(power_limit_w - ref) < 1e-6:
            return self.with_limit(power_limit_w)
        scale = ref / power_limit_w
        spin = self.bands[GpuState.CHECKPOINT_OR_DEADLOCK]
        compute = self.bands[GpuState.COMPUTE]
        low, floor = spin.power_max, compute.power_min
        if not (math.isfinite(low) and low < floor):
            return self.with_limit(power_limit_w)
        new_low = low * scale
        new_floor = max(floor, new_low + compute.margin_power + 0.02)

        def edge(x: float) -> float:
            if not math.isfinite(x):
                return x
            if x <= low:
                return x * scale
            if x < floor:
                return new_low + (x - low) / (floor - low) * (new_floor - new_low)
            return x + (new_floor - floor)

        def band(b: Band) -> Band:
            also = tuple((edge(p0), edge(p1), u0, u1) for p0, p1, u0, u1 in b.also)
            return replace(b, power_min=edge(b.power_min), power_max=edge(b.power_max), also=also)

        return replace(
            self,
            power_limit_w=power_limit_w,
            bands={s: band(b) for s, b in self.bands.items()},
            idle_power_max=edge(self.idle_power_max),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``GET /tables/current``, ``tables --json``)."""
        return {
            "model": self.model,
            "description": self.description,
            "match": list(self.match),
            "power_limit_w": self.power_limit_w,
            "power_only": {"idle_power_max": self.idle_power_max},
            "unknown_dwell_s": self.unknown_dwell_s,
            "vote_share": self.vote_share,
            "bands": {
                str(s): {
                    k: (None if isinstance(v, float) and math.isinf(v) else v)
                    for k, v in (
                        ("power_min", b.power_min),
                        ("power_max", b.power_max),
                        ("util_min", b.util_min),
                        ("util_max", b.util_max),
                        ("margin_power", b.margin_power),
                        ("margin_util", b.margin_util),
                        ("dwell_s", b.dwell_s),
                        ("estimate", b.estimate),
                        ("note", b.note),
                    )
                }
                | (
                    {"also": [[None if math.isinf(v) else v for v in box] for box in b.also]}
                    if b.also
                    else {}
                )
                for s, b in self.bands.items()
            },
            "notes": dict(self.notes),
            "path": self.path,
        }
