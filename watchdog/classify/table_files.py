"""Reading power tables: the built-in TOML files (``classify/tables/``) and operators' own, validated.

Every file is checked whole before it is used: keys, ranges, and that every (power, utilisation)
point falls in some band. Errors name the file and the key (:class:`TableError`).
"""

from __future__ import annotations

import functools
import math
import tomllib
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from gpu_triage.classify.bands import raw_state
from gpu_triage.classify.power_table import (
    BAND_ORDER,
    BUILTIN_MODELS,
    GENERIC,
    Band,
    PowerTable,
    TableError,
)
from gpu_triage.model.config_schema import toml_syntax_problem
from gpu_triage.model.states import GpuState

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
        raise TableError(str(toml_syntax_problem(str(path), e))) from None
    except RecursionError:
        raise TableError(f"{path}: nested too deeply") from None
    return parse_table(data, str(path))


def builtin_table(model: str) -> PowerTable:
    """The built-in table of ``model`` (parsed once per process: a 16-GPU daemon asked for it 96 times
    at its first cycle, 0.3 s of TOML parsing; a PowerTable is frozen and never changed in place)."""
    try:
        return _builtin_table(model.lower())
    except FileNotFoundError:
        raise TableError(
            f"no built-in table for model {model!r}; built-in: {', '.join((*BUILTIN_MODELS, GENERIC))}"
        ) from None


@functools.cache
def _builtin_table(name: str) -> PowerTable:
    text = resources.files("gpu_triage.classify").joinpath("tables", f"{name}.toml").read_text()
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
