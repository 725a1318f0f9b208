"""Write simulated telemetry as the nvidia-smi CSV that people really record.

``nvidia-smi --query-gpu=timestamp,power.draw,utilization.gpu,memory.used --format=csv -lms 100``
prints a header, then one row per GPU in board order every ~100 ms::

    timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]
    2025/07/27 00:34:45.155, 72.36 W, 0 %, 131 MiB

:func:`write_nvsmi_csv` writes exactly that form from a :class:`~gpu_triage.telemetry.sim.Scenario` (or
a :class:`~gpu_triage.telemetry.sim.SimSource`, or a scenario name): units in the header always, in the
cells unless ``units_in_cells=False`` (``--format=csv,nounits``), and optionally the
``index, name, power.limit`` columns. Rows of one snapshot carry timestamps a millisecond or two apart,
as nvidia-smi's do. Timestamps are wall-clock (UTC) from ``start_epoch_s``.

It is vectorised end to end: the scenario renders all samples at once
(:meth:`~gpu_triage.telemetry.sim.Scenario.render`), and the text is assembled as a byte matrix - each
cell's digits computed with integer arithmetic, padding masked out - so a day of 16 GPUs at 10 Hz
(~14 M rows) takes seconds, not minutes. Memory stays bounded by writing in chunks.

Run as a script to write a recording::

    python -m gpu_triage.telemetry.recording_writer out.csv --scenario reference-b300 --duration 600
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpu_triage.telemetry.sim import PhaseSpan, Scenario, SimSource

__all__ = ["DEFAULT_START_EPOCH_S", "RecordingInfo", "write_nvsmi_csv"]

DEFAULT_START_EPOCH_S = 1_767_225_600.0
"""2026/01/01 00:00:00 UTC: a fixed start so recordings are byte-for-byte reproducible."""

_DIGIT0 = 48


@dataclass(frozen=True, slots=True)
class RecordingInfo:
    """What was written, and the ground truth behind it (phase spans in seconds from the first row)."""

    path: Path
    rows: int
    gpus: int
    snapshots: int
    rate_hz: float
    duration_s: float
    start_epoch_s: float
    model: str
    device_name: str
    power_limit_w: float
    phases: tuple[PhaseSpan, ...]


# -- byte-matrix formatting ------------------------------------------------------------------------


class _Cells:
    """Columns of one chunk as (bytes [N, W], keep-mask [N, W]) blocks, joined row-major at the end."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.blocks: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []

    def literal(self, text: bytes) -> None:
        block = np.broadcast_to(np.frombuffer(text, dtype=np.uint8), (self.rows, len(text)))
        self.blocks.append(block)
        self.masks.append(np.ones((self.rows, len(text)), dtype=bool))

    def integer(self, values: np.ndarray, width: int | None = None) -> None:
        """Non-negative integers: left-aligned with no padding, or zero-padded to ``width``.

        Digits come from division by scalar powers of ten, one column at a time (numpy's fast path
        for a scalar divisor); the block is only as wide as the largest value needs.
        """
        v = np.asarray(values).astype(np.uint64)
        largest = int(v.max()) if v.size else 0
        digits_needed = len(str(largest))
        pad = width is not None
        w = max(width or 1, digits_needed)
        block = np.empty((self.rows, w), dtype=np.uint8)
        rest = v.copy()
        for col in range(w - 1, -1, -1):
            block[:, col] = rest % np.uint64(10)
            rest //= np.uint64(10)
        block += _DIGIT0
        self.blocks.append(block)
        if pad or (digits_needed == 1 and w == 1):
            self.masks.append(np.ones((self.rows, w), dtype=bool))
        else:
            powers = 10 ** np.arange(w, dtype=np.uint64)  # 1, 10, ..., 10^(w-1)
            ndigits = np.maximum(1, np.searchsorted(powers, v, side="right"))
            self.masks.append(np.arange(w)[None, :] >= (w - ndigits)[:, None])

    def fixed2(self, values: np.ndarray) -> None:
        """Non-negative decimals with two places (``72.36``), as nvidia-smi prints watts."""
        hundredths = np.round(np.asarray(values, dtype=np.float64) * 100.0).astype(np.int64)
        self.integer(hundredths // 100)
        self.literal(b".")
        self.integer(hundredths % 100, 2)

    def text(self) -> bytes:
        block = np.concatenate(self.blocks, axis=1)
        mask = np.concatenate(self.masks, axis=1)
        if mask.all():  # every cell at full width: no padding to squeeze out
            return block.tobytes()
        return block[mask].tobytes()


def _timestamps(cells: _Cells, epoch_ms: np.ndarray) -> None:
    """``YYYY/MM/DD HH:MM:SS.mmm`` (UTC): the date per distinct day, the time by integer arithmetic."""
    days = epoch_ms // 86_400_000
    ms_of_day = epoch_ms - days * 86_400_000
    unique_days, inverse = np.unique(days, return_inverse=True)
    dates = np.array(
        [
            np.datetime_as_string(np.datetime64(int(d), "D")).replace("-", "/").encode() + b" "
            for d in unique_days
        ]
    )
    date_bytes = dates.view(np.uint8).reshape(len(unique_days), -1)[inverse]
    cells.blocks.append(date_bytes)
    cells.masks.append(np.ones(date_bytes.shape, dtype=bool))
    cells.integer(ms_of_day // 3_600_000, 2)
    cells.literal(b":")
    cells.integer(ms_of_day // 60_000 % 60, 2)
    cells.literal(b":")
    cells.integer(ms_of_day // 1000 % 60, 2)
    cells.literal(b".")
    cells.integer(ms_of_day % 1000, 3)


def _row_offsets_s(snapshots: np.ndarray, gpus: int, seed: int) -> np.ndarray:
    """Per-row offsets inside a snapshot: ~1.5 ms per GPU plus up to 1 ms of deterministic jitter,
    increasing in board order, as nvidia-smi's one-GPU-at-a-time query produces."""
    with np.errstate(over="ignore"):
        h = (snapshots.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)) ^ (
            np.arange(gpus, dtype=np.uint64)[None, :] * np.uint64(0xC2B2AE3D27D4EB4F) + np.uint64(seed + 7)
        )
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(32)
    jitter = (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.arange(gpus)[None, :] * 0.0015 + jitter * 0.001


# -- the writer -------------------------------------------------------------------------------------


def write_nvsmi_csv(
    path: str | Path,
    source_or_scenario: SimSource | Scenario | str | Path,
    duration_s: float,
    rate_hz: float = 10.0,
    *,
    with_index: bool = False,
    units_in_cells: bool = True,
    seed: int = 0,
    gpus: int | None = None,
    start_epoch_s: float = DEFAULT_START_EPOCH_S,
    chunk_rows: int = 1_000_000,
) -> RecordingInfo:
    """Write ``duration_s`` of ``rate_hz`` snapshots (every GPU each time) as nvidia-smi CSV.

    ``source_or_scenario``: a :class:`SimSource` (its scenario, GPU count and seed are used), a
    :class:`Scenario`, or a scenario name/path. ``gpus`` and ``seed`` apply to the latter two.
    ``with_index`` adds ``index, name, power.limit`` (query order
    ``timestamp,index,name,power.draw,power.limit,utilization.gpu,memory.used``).
    Returns what was written, with the scenario's phase spans as ground truth.
    """
    if isinstance(source_or_scenario, SimSource):
        scenario = source_or_scenario.scenario
        n_gpus = source_or_scenario.gpu_count
        seed = source_or_scenario.seed
    elif isinstance(source_or_scenario, Scenario):
        scenario, n_gpus = source_or_scenario, source_or_scenario.gpus
    elif isinstance(source_or_scenario, str | Path):
        scenario = Scenario.load(source_or_scenario)
        n_gpus = scenario.gpus
    else:
        raise TypeError(
            "write_nvsmi_csv needs a SimSource, a Scenario or a scenario name/path, "
            f"got {type(source_or_scenario)!r}"
        )
    if gpus is not None and not isinstance(source_or_scenario, SimSource):
        n_gpus = int(gpus)
    if duration_s <= 0 or rate_hz <= 0:
        raise ValueError(f"duration_s and rate_hz must be > 0, got {duration_s} and {rate_hz}")
    snapshots = round(duration_s * rate_hz)
    path = Path(path)
    per_chunk = max(1, chunk_rows // n_gpus)
    name = scenario.device_name.encode()
    limit = scenario.power_limit_w
    w, pct, mib = (b" W", b" %", b" MiB") if units_in_cells else (b"", b"", b"")

    columns = ["timestamp"]
    if with_index:
        columns += ["index", "name"]
    columns.append("power.draw [W]")
    if with_index:
        columns.append("power.limit [W]")
    columns += ["utilization.gpu [%]", "memory.used [MiB]"]

    with path.open("wb") as out:
        out.write((", ".join(columns) + "\n").encode())
        for first in range(0, snapshots, per_chunk):
            k = np.arange(first, min(snapshots, first + per_chunk), dtype=np.int64)
            t = k / rate_hz
            frame = scenario.render(t, gpus=n_gpus, seed=seed)
            rows = len(k) * n_gpus
            epoch_s = start_epoch_s + t[:, None] + _row_offsets_s(k, n_gpus, seed)
            cells = _Cells(rows)
            _timestamps(cells, np.floor(epoch_s.ravel() * 1000.0 + 1e-6).astype(np.int64))
            if with_index:
                cells.literal(b", ")
                cells.integer(np.tile(np.arange(n_gpus), len(k)))
                cells.literal(b", " + name)
            cells.literal(b", ")
            cells.fixed2(frame.power_w.ravel())
            cells.literal(w)
            if with_index:
                cells.literal(b", ")
                cells.fixed2(np.full(rows, limit))
                cells.literal(w)
            cells.literal(b", ")
            cells.integer(np.round(frame.utilization_ratio.ravel() * 100.0))
            cells.literal(pct + b", ")
            cells.integer(np.round(frame.memory_used_bytes.ravel() / (1024 * 1024)))
            cells.literal(mib + b"\n")
            out.write(cells.text())

    duration = snapshots / rate_hz
    return RecordingInfo(
        path=path,
        rows=snapshots * n_gpus,
        gpus=n_gpus,
        snapshots=snapshots,
        rate_hz=float(rate_hz),
        duration_s=duration,
        start_epoch_s=float(start_epoch_s),
        model=scenario.model,
        device_name=scenario.device_name,
        power_limit_w=limit,
        phases=tuple(scenario.phase_spans(duration)),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_triage.telemetry.recording_writer",
        description="Write a simulated scenario as an nvidia-smi CSV recording.",
    )
    parser.add_argument("output", type=Path)
    parser.add_argument("--scenario", default="reference-b300", help="built-in name or TOML path")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--rate", type=float, default=10.0, help="snapshots per second (default 10)")
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--with-index", action="store_true", help="add index, name, power.limit columns")
    parser.add_argument(
        "--nounits", action="store_true", help="bare numbers in cells (units stay in the header)"
    )
    args = parser.parse_args(argv)
    info = write_nvsmi_csv(
        args.output,
        args.scenario,
        args.duration,
        args.rate,
        with_index=args.with_index,
        units_in_cells=not args.nounits,
        seed=args.seed,
        gpus=args.gpus,
    )
    print(f"wrote {info.rows} rows ({info.gpus} x {info.device_name}, {info.duration_s:g} s) to {info.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
