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
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
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
_BOX_KEYS = {"power_min", "power_max", "util_min", "util_max"}
_BAND_KEYS = _BOX_KEYS | {"margin_power", "margin_util", "dwell_s", "note", "estimate", "also"}
_TOP_KEYS = {
    "model",
    "description",
    "match",
    "power_limit_w",
    "power_limit_note",
    "power_only",
    "bands",
    "unknown_dwell_s",
    "source",
    "vote_share",
}
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


def _num(where: str, key: str, value: Any, lo: float = 0.0, hi: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TableError(f"{where}: {key}: expected a number, got {value!r}")
    v = float(value)
    if not (lo <= v <= hi):
        raise TableError(f"{where}: {key}: expected a number between {lo} and {hi}, got {value!r}")
    return v


def parse_table(data: dict[str, Any], where: str) -> PowerTable:
    """Validate a decoded TOML document into a :class:`PowerTable`; errors name ``where`` and the key."""
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise TableError(f"{where}: unknown key(s) {sorted(unknown)}; expected some of {sorted(_TOP_KEYS)}")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise TableError(f"{where}: model: expected a non-empty string, got {model!r}")
    match = data.get("match", [])
    if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
        raise TableError(f"{where}: match: expected a list of strings, got {match!r}")
    limit = data.get("power_limit_w")
    limit_w = None if limit is None else _num(where, "power_limit_w", limit, 1.0, 10_000.0)
    bands_raw = data.get("bands")
    if not isinstance(bands_raw, dict):
        raise TableError(f"{where}: bands: expected a table of bands, got {bands_raw!r}")
    bands: dict[GpuState, Band] = {}
    for state in BAND_ORDER:
        raw = bands_raw.get(str(state))
        if not isinstance(raw, dict):
            raise TableError(
                f"{where}: bands.{state}: missing (every table needs all of "
                f"{', '.join(map(str, BAND_ORDER))})"
            )
        bad = set(raw) - _BAND_KEYS
        if bad:
            raise TableError(f"{where}: bands.{state}: unknown key(s) {sorted(bad)}")
        k = f"bands.{state}"
        band = Band(
            state=state,
            power_min=_num(where, f"{k}.power_min", raw.get("power_min", 0.0), 0.0, 5.0),
            power_max=_num(where, f"{k}.power_max", raw.get("power_max", math.inf), 0.0, math.inf),
            util_min=_num(where, f"{k}.util_min", raw.get("util_min", 0.0), 0.0, 1.0),
            util_max=_num(where, f"{k}.util_max", raw.get("util_max", math.inf), 0.0, math.inf),
            margin_power=_num(where, f"{k}.margin_power", raw.get("margin_power", 0.0), 0.0, 1.0),
            margin_util=_num(where, f"{k}.margin_util", raw.get("margin_util", 0.0), 0.0, 1.0),
            dwell_s=_num(where, f"{k}.dwell_s", raw.get("dwell_s", 0.0), 0.0, 3600.0),
            note=str(raw.get("note", "")),
            estimate=bool(raw.get("estimate", False)),
        )
        if band.power_min >= band.power_max:
            raise TableError(
                f"{where}: {k}: power_min {band.power_min} must be below power_max {band.power_max}"
            )
        if band.util_min >= band.util_max:
            raise TableError(f"{where}: {k}: util_min {band.util_min} must be below util_max {band.util_max}")
        also = raw.get("also", [])
        if not isinstance(also, list) or not all(isinstance(b, dict) for b in also):
            raise TableError(
                f"{where}: {k}.also: expected a list of boxes ({{power_min=..., util_max=...}}), got {also!r}"
            )
        boxes = []
        for i, box in enumerate(also):
            bad = set(box) - _BOX_KEYS
            if bad:
                raise TableError(f"{where}: {k}.also[{i}]: unknown key(s) {sorted(bad)}")
            kb = f"{k}.also[{i}]"
            boxes.append(
                (
                    _num(where, f"{kb}.power_min", box.get("power_min", 0.0), 0.0, 5.0),
                    _num(where, f"{kb}.power_max", box.get("power_max", math.inf), 0.0, math.inf),
                    _num(where, f"{kb}.util_min", box.get("util_min", 0.0), 0.0, 1.0),
                    _num(where, f"{kb}.util_max", box.get("util_max", math.inf), 0.0, math.inf),
                )
            )
        bands[state] = replace(band, also=tuple(boxes))
    extra = set(bands_raw) - {str(s) for s in BAND_ORDER}
    if extra:
        raise TableError(f"{where}: bands: unknown state(s) {sorted(extra)}")
    po = data.get("power_only", {})
    if not isinstance(po, dict):
        raise TableError(f"{where}: power_only: expected a table, got {po!r}")
    idle_max = _num(where, "power_only.idle_power_max", po.get("idle_power_max", 0.15), 0.0, 1.0)
    table = PowerTable(
        model=model,
        description=str(data.get("description", model)),
        match=tuple(match),
        power_limit_w=limit_w,
        bands=bands,
        idle_power_max=idle_max,
        unknown_dwell_s=_num(where, "unknown_dwell_s", data.get("unknown_dwell_s", 2.0), 0.0, 3600.0),
        vote_share=_num(where, "vote_share", data.get("vote_share", 0.8), 0.5, 1.0),
        notes={
            "power_limit": str(data.get("power_limit_note", "")),
            "power_only": str(po.get("note", "")),
            "source": str(data.get("source", "")),
        },
        path=where,
    )
    _check_coverage(table, where)
    return table


def _check_coverage(table: PowerTable, where: str) -> None:
    """Every (power, utilisation) point must fall in some band: otherwise a sample has no state."""
    from gpu_triage.classify.bands import raw_state  # local: bands imports this module

    for p in (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.2):
        for u in (0.0, 0.05, 0.1, 0.3, 0.5, 0.7, 0.89, 0.9, 0.95, 1.0):
            if raw_state(table, p, u) is GpuState.UNKNOWN:
                raise TableError(
                    f"{where}: bands leave power {p:.2f} x utilisation {u:.2f} without a state; "
                    "widen a band so every point is covered"
                )


def load_table_file(path: str | Path) -> PowerTable:
    """Read and validate a table file: a regular file of at most ``limits.MAX_TABLE_BYTES`` (anything
    else - ``/dev/zero``, a FIFO, a huge file - is refused before it is read). Raises TableError."""
    from gpu_triage.model.limits import MAX_TABLE_BYTES, InputTooLarge, read_regular_file

    path = Path(path)
    try:
        data = tomllib.loads(read_regular_file(path, MAX_TABLE_BYTES, "table file").decode("utf-8"))
    except FileNotFoundError:
        raise TableError(f"{path}: no such table file") from None
    except InputTooLarge as e:
        raise TableError(str(e)) from None
    except OSError as e:
        raise TableError(f"{path}: cannot read the table file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TableError(f"{path}: not UTF-8 text: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise TableError(f"{path}: {e}") from None
    except RecursionError:
        raise TableError(f"{path}: nested too deeply") from None
    return parse_table(data, str(path))


def builtin_table(model: str) -> PowerTable:
    name = model.lower()
    try:
        text = resources.files("gpu_triage.classify").joinpath("tables", f"{name}.toml").read_text()
    except FileNotFoundError:
        raise TableError(
            f"no built-in table for model {model!r}; built-in: {', '.join((*BUILTIN_MODELS, GENERIC))}"
        ) from None
    return parse_table(tomllib.loads(text), f"watchdog/classify/tables/{name}.toml")


def all_tables() -> list[PowerTable]:
    return [builtin_table(m) for m in (*BUILTIN_MODELS, GENERIC)]


def match_model(device_name: str | None) -> str | None:
    """Model of a built-in table whose match strings occur in the NVML device name, else None."""
    if not device_name:
        return None
    upper = device_name.upper()
    best: tuple[int, str] | None = None
    for model in BUILTIN_MODELS:
        for m in builtin_table(model).match:
            # the longest match wins: 'GB300' before 'B300' before 'B30'
            if m.upper() in upper and (best is None or len(m) > best[0]):
                best = (len(m), model)
    return best[1] if best else None


def resolve_table(
    *,
    model: str | None = None,
    device_name: str | None = None,
    path: str | Path | None = None,
    power_limit_w: float | None = None,
) -> PowerTable:
    """The table to use: an explicit file, an explicit model, the model matched from the device name,
    else the generic table. ``power_limit_w`` (from NVML or the user) overrides the table's default."""
    if path is not None:
        table = load_table_file(path)
    elif model is not None:
        table = builtin_table(model)
    else:
        matched = match_model(device_name)
        table = builtin_table(matched or GENERIC)
    if power_limit_w is not None:
        table = table.at_limit(power_limit_w)
    return table
