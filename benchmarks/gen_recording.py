"""Write a realistic ``nvidia-smi --query-gpu=... --format=csv -lms 100`` recording, fast.

The text looks like the real traces in ``../shared/traces`` (see its README)::

    timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]
    2025/07/27 00:34:45.155, 72.36 W, 0 %, 131 MiB

one row per GPU in board order per snapshot, a few milliseconds between the rows of one snapshot and
``interval_s`` between snapshots. The run goes through the phases a training job shows: idle before
start, then compute (~550 W, 85-97 %) interrupted by checkpoint waits (the writer's GPU at ~147 W and a
few %, the others spinning in a collective at ~155 W and 100 %), then idle again.

Everything is vectorised with numpy and pyarrow.compute (several million rows in a few seconds): the
text is assembled column by column as Arrow string arrays whose data buffer, once every row ends in a
newline, *is* the file body.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Phase codes of the generated run.
IDLE, COMPUTE, WAIT = 0, 1, 2

#: First timestamp of generated recordings (2025-07-27 00:34:45.155 UTC), in milliseconds.
START_MS = 1_753_576_485_155


def phases(snapshots: int, interval_s: float = 0.1) -> np.ndarray:
    """Phase code per snapshot: 30 s idle, then cycles of 60 s compute + 20 s checkpoint wait, with
    the last 5 % of the run idle again (a job that finished but still holds memory)."""
    t_s = np.arange(snapshots) * interval_s
    cycle_s = np.mod(t_s - 30.0, 80.0)
    code = np.where(cycle_s < 60.0, COMPUTE, WAIT).astype(np.int8)
    code[t_s < 30.0] = IDLE
    code[int(snapshots * 0.95) :] = IDLE
    return code


def _fixed2(values: np.ndarray, suffix: str) -> pa.Array:
    """Format non-negative floats as ``"%.2f" + suffix`` (vectorised)."""
    centi = np.rint(np.maximum(values, 0.0) * 100.0).astype(np.int64)
    whole = pc.cast(pa.array(centi // 100), pa.string())
    frac = pc.utf8_lpad(pc.cast(pa.array(centi % 100), pa.string()), 2, "0")
    return pc.binary_join_element_wise(whole, ".", frac, suffix, "")


def _integer(values: np.ndarray, suffix: str) -> pa.Array:
    return pc.binary_join_element_wise(pc.cast(pa.array(values.astype(np.int64)), pa.string()), suffix, "")


def _timestamps(time_ms: np.ndarray) -> pa.Array:
    """``YYYY/MM/DD HH:MM:SS.mmm`` per row. strftime is slow per element, so only the distinct seconds
    are formatted and the milliseconds are appended."""
    seconds = time_ms // 1000
    unique_s, inverse = np.unique(seconds, return_inverse=True)
    text = pc.strftime(pa.array(unique_s, pa.timestamp("s")), format="%Y/%m/%d %H:%M:%S")
    per_row = pc.take(text, pa.array(inverse.astype(np.int64)))
    millis = pc.utf8_lpad(pc.cast(pa.array(time_ms % 1000), pa.string()), 3, "0")
    return pc.binary_join_element_wise(per_row, ".", millis, "")


def generate(
    path: str | Path,
    rows: int,
    gpus: int = 8,
    units_in_cells: bool = True,
    seed: int = 0,
    *,
    interval_s: float = 0.1,
    with_index: bool = False,
    header: bool = True,
) -> Path:
    """Write ``rows`` rows (complete snapshots of ``gpus`` rows, the last one possibly cut short) to
    ``path`` and return it. ``units_in_cells=False`` writes bare numbers (``--format=csv,nounits``;
    the header keeps its ``[W]`` units as nvidia-smi does). ``with_index`` adds an ``index`` column."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    snapshots = -(-rows // gpus)
    phase_all = phases(snapshots, interval_s)
    names = [
        "timestamp",
        *(["index"] if with_index else []),
        "power.draw [W]",
        "utilization.gpu [%]",
        "memory.used [MiB]",
    ]
    block = max(1, _BLOCK_ROWS // gpus)  # Arrow string arrays hold < 2 GiB: write in blocks
    with path.open("wb") as out:
        if header:
            out.write((", ".join(names) + "\n").encode())
        for first in range(0, snapshots, block):
            count = min(block, snapshots - first)
            n = min(count * gpus, rows - first * gpus)
            out.write(
                _block(
                    rng,
                    phase_all[first : first + count],
                    first,
                    n,
                    gpus,
                    units_in_cells,
                    interval_s,
                    with_index,
                )
            )
    return path


#: Rows formatted at a time (bounds the generator's memory to a few hundred MB).
_BLOCK_ROWS = 1 << 20


def _block(
    rng: np.random.Generator,
    phase_snap: np.ndarray,
    first_snapshot: int,
    rows: int,
    gpus: int,
    units_in_cells: bool,
    interval_s: float,
    with_index: bool,
) -> memoryview:
    """The text of ``rows`` rows starting at snapshot ``first_snapshot``."""
    phase = np.repeat(phase_snap, gpus)[:rows]
    gpu = np.tile(np.arange(gpus), len(phase_snap))[:rows]
    writer = gpu == 0

    idle_w = 72.0 + rng.normal(0.0, 0.6, rows) + 0.4 * gpu
    compute_w = 555.0 + rng.normal(0.0, 15.0, rows)
    wait_w = np.where(writer, 147.0, 155.0) + rng.normal(0.0, 3.0, rows)
    power_w = np.select([phase == COMPUTE, phase == WAIT], [compute_w, wait_w], idle_w)
    util_pct = np.select(
        [phase == COMPUTE, phase == WAIT],
        [rng.integers(85, 98, rows), np.where(writer, rng.integers(0, 11, rows), 100)],
        0,
    )
    memory_mib = np.where(phase == IDLE, np.where(writer, 131, 17), 61_000 + 37 * gpu)

    # Snapshots every interval_s; the rows of one snapshot 0-3 ms apart.
    snapshot = first_snapshot + np.arange(len(phase_snap))
    snapshot_ms = START_MS + np.rint(snapshot * interval_s * 1000.0).astype(np.int64)
    time_ms = np.repeat(snapshot_ms, gpus)[:rows] + np.minimum(gpu, 3)

    w, pct, mib = (" W", " %", " MiB") if units_in_cells else ("", "", "")
    columns = [_timestamps(time_ms)]
    if with_index:
        columns.append(_integer(gpu, ""))
    columns += [_fixed2(power_w, w), _integer(util_pct, pct), _integer(memory_mib, mib + "\n")]
    body = pc.binary_join_element_wise(*columns, ", ")
    offsets = np.frombuffer(body.buffers()[1], dtype=np.int32, count=len(body) + 1, offset=body.offset * 4)
    return memoryview(body.buffers()[2])[offsets[0] : offsets[-1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--nounits", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    generate(args.path, args.rows, args.gpus, units_in_cells=not args.nounits, seed=args.seed)


if __name__ == "__main__":
    main()
