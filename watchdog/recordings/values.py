"""What a reader hands out: the :class:`RecordingHeader` it learnt and the rows as :class:`Chunk` arrays.

Plain values (numpy arrays, no pyarrow), so code that only consumes rows - triage, the replay source -
can be read without the parsing behind them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from gpu_triage.model.limits import MAX_POWER_LIMIT_W, MIN_POWER_LIMIT_W


@dataclass(frozen=True)
class RecordingHeader:
    """What the reader learnt about a recording before handing out rows."""

    path: str
    columns: tuple[str, ...]
    """Every column's field name, lower-cased and without its unit (unknown ones included)."""
    gpus: int
    has_index: bool
    gpu_names: tuple[str, ...] | None
    """Per GPU index, from a ``name`` column (e.g. ``"NVIDIA H100 80GB HBM3"``); None without one."""
    power_limit_w: float | None
    """Median of a ``power.limit`` / ``enforced.power.limit`` column over the first rows, else None."""
    size_bytes: int
    has_timestamp: bool = True
    gpus_from: str = "caller"
    """Where ``gpus`` came from: caller, index, uuid, pci.bus_id, timestamps or values."""
    units: tuple[str | None, ...] = ()
    """Each column's unit as the header wrote it (``"W"`` for ``power.draw [W]``), else None."""


@dataclass(frozen=True)
class Chunk:
    """One block of rows; every array has the same length; NaN marks a missing value.

    A field the recording does not have is all-NaN (one shared read-only array per chunk).
    """

    gpu: np.ndarray
    """int32 board index."""
    time_s: np.ndarray
    """float64 epoch seconds (timestamps read as UTC), or snapshot x interval_s without timestamps."""
    power_w: np.ndarray
    utilization_ratio: np.ndarray
    """0..1."""
    memory_used_bytes: np.ndarray
    power_limit_w: np.ndarray
    memory_total_bytes: np.ndarray
    sm_clock_mhz: np.ndarray
    temperature_c: np.ndarray
    line: np.ndarray
    """int64, the 1-based line of each row in the file."""
    end_offset: int
    """Bytes of the file consumed once this chunk was read (for progress bars)."""

    def __len__(self) -> int:
        return len(self.gpu)


_ARRAY_FIELDS = tuple(f.name for f in fields(Chunk) if f.name != "end_offset")


def empty_chunk(end_offset: int = 0) -> Chunk:
    """A chunk with no rows."""
    arrays = {name: np.zeros(0) for name in _ARRAY_FIELDS}
    arrays["gpu"] = np.zeros(0, dtype=np.int32)
    arrays["line"] = np.zeros(0, dtype=np.int64)
    return Chunk(**arrays, end_offset=end_offset)


def slice_chunk(chunk: Chunk, rows: int) -> Chunk:
    """The first ``rows`` rows of ``chunk`` (same ``end_offset``)."""
    arrays = {name: getattr(chunk, name)[:rows] for name in _ARRAY_FIELDS}
    return Chunk(**arrays, end_offset=chunk.end_offset)


def concat_chunks(chunks: Sequence[Chunk]) -> Chunk:
    """All rows of ``chunks`` as one chunk (``end_offset`` of the last)."""
    if not chunks:
        return empty_chunk()
    if len(chunks) == 1:
        return chunks[0]
    arrays = {name: np.concatenate([getattr(c, name) for c in chunks]) for name in _ARRAY_FIELDS}
    return Chunk(**arrays, end_offset=chunks[-1].end_offset)


def gpu_model_name(header: RecordingHeader) -> str | None:
    """The GPU model the recording names (the most common ``name`` cell, e.g. ``"NVIDIA H100 80GB
    HBM3"``), or None when it has no ``name`` column. The caller maps names to power tables."""
    names = [n for n in header.gpu_names or () if n]
    if not names:
        return None
    return max(set(names), key=lambda n: (names.count(n), n))


def impossible_power_limit(limits_w: np.ndarray) -> float | None:
    """The first recorded power limit no GPU has (outside 1-5000 W), None when every finite one is
    plausible. Such a limit (1e308 W) would scale every band out of reach and hide a deadlock: triage
    and the replay source refuse the recording."""
    finite = limits_w[np.isfinite(limits_w)]
    bad = finite[(finite < MIN_POWER_LIMIT_W) | (finite > MAX_POWER_LIMIT_W)]
    return float(bad[0]) if bad.size else None
