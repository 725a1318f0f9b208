"""``gpu-watchdog calibrate``: fit a power table from recordings labelled by phase.

Labels are CSV rows ``start_s,end_s,label`` (seconds from the recording's first sample; extra columns
ignored), the label a GPU state or ``checkpoint_wait`` (= checkpoint_or_deadlock). The fit keeps the
base table's structure, dwell and margins, and moves the power edges to the data:

- ``checkpoint_or_deadlock`` describes the *waiting* GPUs: samples under 50 % utilisation inside its
  intervals are the checkpoint writer's and are left out. Its power ceiling goes a third of the way
  from the band's 98th percentile to the lowest 2nd percentile of the busier states above it; its
  utilisation floor to the 5th percentile minus 0.05 (at most 0.90).
- ``compute``'s floor goes halfway between the 98th percentile of every lower state and compute's own
  2nd percentile; ``communication`` fills the gap between the spin ceiling and the compute floor, and
  ``data_starvation``/``idle`` reach up to the compute floor (so every point keeps a state).
- ``idle`` (if labelled) sets the power-only idle ceiling.
- ``--unlabelled compute`` takes samples outside every interval as compute when they are at least 50 %
  utilised (idle stretches at the ends of a run are left out); ``ignore`` drops them.

A state without labelled samples keeps the base table's numbers. The written TOML notes, per number,
the samples it came from; it loads with ``--table`` or ``[classifier] table`` in the daemon config.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from gpu_triage.classify.power_table import BAND_ORDER, PowerTable, TableError
from gpu_triage.classify.table_files import parse_table, resolve_table
from gpu_triage.model.states import GpuState
from gpu_triage.recordings.nvsmi_csv import RecordingError, read_recording

ALIASES = {
    "checkpoint_wait": GpuState.CHECKPOINT_OR_DEADLOCK,
    "checkpoint": GpuState.CHECKPOINT_OR_DEADLOCK,
    "deadlock": GpuState.CHECKPOINT_OR_DEADLOCK,
    "training": GpuState.COMPUTE,
    "train": GpuState.COMPUTE,
}


class CalibrationError(ValueError):
    pass


def read_labels(path: str | Path) -> list[tuple[float, float, GpuState]]:
    """Rows of a labels CSV: columns ``start_s``, ``end_s`` and ``label`` (in any order; others ignored)."""
    out = []
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise CalibrationError(f"{path}: {e.strerror or e}") from None
    header = [c.strip() for c in rows[0]] if rows else []
    missing = [c for c in ("start_s", "end_s", "label") if c not in header]
    if missing:
        raise CalibrationError(
            f"{path}:1: the header needs columns start_s, end_s and label; missing {missing}"
        )
    i_a, i_b, i_l = header.index("start_s"), header.index("end_s"), header.index("label")
    for n, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            a, b = float(row[i_a]), float(row[i_b])
        except (ValueError, IndexError):
            raise CalibrationError(f"{path}:{n}: start_s and end_s must be numbers, got {row}") from None
        name = row[i_l].strip() if len(row) > i_l else ""
        state = ALIASES.get(name)
        if state is None:
            try:
                state = GpuState(name)
            except ValueError:
                raise CalibrationError(
                    f"{path}:{n}:{i_l + 1}: unknown label {name!r}; use a GPU state "
                    f"({', '.join(map(str, BAND_ORDER))}) or checkpoint_wait"
                ) from None
        if b <= a:
            raise CalibrationError(f"{path}:{n}: end_s {b} must be after start_s {a}")
        out.append((a, b, state))
    return out


def _collect(
    files: Sequence[str],
    labels: Sequence[str],
    gpus: int | None,
    limit_w: float | None,
    table: PowerTable | None,
    model: str | None,
    unlabelled: str,
) -> tuple[PowerTable, float, dict[GpuState, tuple[np.ndarray, np.ndarray]]]:
    if len(files) != len(labels):
        raise CalibrationError(
            f"{len(files)} recording(s) but {len(labels)} --labels file(s): give one per recording"
        )
    if unlabelled != "ignore":
        try:
            unl_state: GpuState | None = ALIASES.get(unlabelled) or GpuState(unlabelled)
        except ValueError:
            raise CalibrationError(
                f"--unlabelled: expected a GPU state or 'ignore', got {unlabelled!r}"
            ) from None
    else:
        unl_state = None
    pf_by: dict[GpuState, list[np.ndarray]] = {}
    u_by: dict[GpuState, list[np.ndarray]] = {}
    used_limit = limit_w
    for path, lab in zip(files, labels, strict=True):
        try:
            header, chunk = read_recording(path, gpus=gpus)
        except RecordingError as e:
            raise CalibrationError(str(e)) from None
        if table is None:
            try:
                table = resolve_table(model=model, device_name=(header.gpu_names or [None])[0])
            except TableError as e:
                raise CalibrationError(str(e)) from None
        lim = limit_w or header.power_limit_w or table.power_limit_w
        if not lim:
            raise CalibrationError(f"{path}: no power limit in the file or the table: pass --power-limit")
        used_limit = used_limit or lim
        t = chunk.time_s - np.nanmin(chunk.time_s)
        pf = chunk.power_w / lim
        u = chunk.utilization_ratio
        assigned = np.full(len(t), -1, dtype=np.int16)
        for a, b, state in read_labels(lab):
            assigned[(t >= a) & (t < b)] = BAND_ORDER.index(state)
        for i, state in enumerate(BAND_ORDER):
            m = (assigned == i) & np.isfinite(pf) & np.isfinite(u)
            if state is GpuState.CHECKPOINT_OR_DEADLOCK:
                m &= u >= 0.5
            pf_by.setdefault(state, []).append(pf[m])
            u_by.setdefault(state, []).append(u[m])
        if unl_state is not None:
            m = (assigned < 0) & np.isfinite(pf) & np.isfinite(u) & (u >= 0.5)
            pf_by.setdefault(unl_state, []).append(pf[m])
            u_by.setdefault(unl_state, []).append(u[m])
    assert table is not None and used_limit is not None
    data = {s: (np.concatenate(pf_by[s]), np.concatenate(u_by[s])) for s in pf_by}
    return table, float(used_limit), {s: v for s, v in data.items() if len(v[0])}


def calibrate_files(
    files: Sequence[str],
    labels: Sequence[str],
    *,
    model: str | None = None,
    gpus: int | None = None,
    power_limit_w: float | None = None,
    unlabelled: str = "ignore",
    name: str | None = None,
) -> tuple[str, str]:
    """Return (TOML text of the fitted table, a human summary)."""
    table, limit, data = _collect(files, labels, gpus, power_limit_w, None, model, unlabelled)
    if not data:
        raise CalibrationError(
            "no labelled samples with both power and utilisation: check the label times "
            "(seconds from the first sample)"
        )
    bands = {s: dict(_band_dict(table, s)) for s in BAND_ORDER}
    notes: list[str] = []
    src = ", ".join(Path(f).name for f in files)

    def q(state: GpuState, which: int, pct: float) -> float:
        return float(np.percentile(data[state][which], pct))

    lower = [
        s
        for s in (
            GpuState.CHECKPOINT_OR_DEADLOCK,
            GpuState.COMMUNICATION,
            GpuState.DATA_STARVATION,
            GpuState.IDLE,
        )
        if s in data
    ]
    compute_min = bands[GpuState.COMPUTE]["power_min"]
    if GpuState.COMPUTE in data and lower:
        lo = q(GpuState.COMPUTE, 0, 2)
        hi = max(q(s, 0, 98) for s in lower)
        if lo <= hi:
            raise CalibrationError(
                f"compute samples (2nd percentile {lo:.3f} of the limit) overlap lower states "
                f"(98th percentile {hi:.3f}): power cannot separate them; check the labels"
            )
        compute_min = round((lo + hi) / 2, 3)
        bands[GpuState.COMPUTE]["note"] = (
            f"fitted from {src}: halfway between lower states' p98 {hi:.3f} and "
            f"compute p2 {lo:.3f} ({len(data[GpuState.COMPUTE][0]):,} samples)"
        )
        bands[GpuState.COMPUTE]["estimate"] = False
        bands[GpuState.COMPUTE]["power_min"] = compute_min
    spin_max = min(bands[GpuState.CHECKPOINT_OR_DEADLOCK]["power_max"], compute_min)
    if GpuState.CHECKPOINT_OR_DEADLOCK in data:
        s = GpuState.CHECKPOINT_OR_DEADLOCK
        hi = q(s, 0, 98)
        above = [q(x, 0, 2) for x in (GpuState.COMMUNICATION, GpuState.COMPUTE) if x in data]
        nxt = min(above) if above else compute_min
        spin_max = round(min(hi + (nxt - hi) / 3, compute_min), 3)
        util_min = round(min(0.90, max(0.5, q(s, 1, 5) - 0.05)), 3)
        bands[s].update(
            power_max=spin_max,
            util_min=util_min,
            estimate=False,
            note=f"fitted from {src}: p98 {hi:.3f}, a third of the way to {nxt:.3f}; utilisation p5 "
            f"{q(s, 1, 5):.2f} - 0.05 ({len(data[s][0]):,} waiting-GPU samples)",
        )
    bands[GpuState.COMMUNICATION].update(power_min=spin_max, power_max=compute_min)
    for s in (GpuState.DATA_STARVATION, GpuState.IDLE):
        bands[s]["power_max"] = compute_min
    idle_max = table.idle_power_max
    if GpuState.IDLE in data:
        idle_max = round(min(q(GpuState.IDLE, 0, 98) + 0.01, spin_max), 3)
        notes.append(f"power-only idle ceiling from idle p98 {q(GpuState.IDLE, 0, 98):.3f}")
    doc: dict[str, Any] = {
        "model": name or table.model,
        "description": f"{table.description}, calibrated from {src}",
        "match": list(table.match),
        "power_limit_w": limit,
        "power_limit_note": f"limit used for the fit ({src})",
        "source": f"gpu-watchdog calibrate on {src}",
        "unknown_dwell_s": table.unknown_dwell_s,
        "power_only": {
            "idle_power_max": idle_max,
            "note": "; ".join(notes) or table.notes.get("power_only", ""),
        },
        "bands": {str(s): {k: v for k, v in bands[s].items() if v is not None} for s in BAND_ORDER},
    }
    text = (
        "# Written by gpu-watchdog calibrate. Bands are fractions of the enforced power limit.\n"
        + tomli_w.dumps(doc)
    )
    try:
        import tomllib

        parse_table(tomllib.loads(text), "calibrated table")
    except TableError as e:
        raise CalibrationError(f"the fitted table is not usable: {e}") from None
    lines = [f"calibrated {doc['model']} from {src} (limit {limit:.0f} W):"]
    for s in BAND_ORDER:
        if s in data:
            pf, u = data[s]
            lines.append(
                f"  {s!s:<24} {len(pf):>9,} samples  power p2..p98 {np.percentile(pf, 2):.3f}..."
                f"{np.percentile(pf, 98):.3f}  util p5..p95 {np.percentile(u, 5):.2f}.."
                f"{np.percentile(u, 95):.2f}"
            )
    lines.append(
        f"  compute floor {table.bands[GpuState.COMPUTE].power_min:.3f} -> {compute_min:.3f}; spin ceiling "
        f"{table.bands[GpuState.CHECKPOINT_OR_DEADLOCK].power_max:.3f} -> {spin_max:.3f}"
    )
    return text, "\n".join(lines)


def _band_dict(table: PowerTable, state: GpuState) -> dict[str, Any]:
    b = table.bands[state]
    d: dict[str, Any] = {}
    for k in ("power_min", "power_max", "util_min", "util_max"):
        v = getattr(b, k)
        if np.isfinite(v) and not (k.endswith("_min") and v == 0):
            d[k] = v
    d.update(
        margin_power=b.margin_power,
        margin_util=b.margin_util,
        dwell_s=b.dwell_s,
        estimate=b.estimate,
        note=b.note,
    )
    return d
