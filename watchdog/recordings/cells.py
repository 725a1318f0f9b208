"""One column of cells -> one numpy array: numbers with units, timestamps, GPU indices.

Each function takes one Arrow string column of a block (as ``pyarrow.csv`` read it) and returns a
writable numpy array, or raises :class:`~gpu_triage.recordings.errors.RecordingError` naming the
line (from ``line``, the block's per-row file lines) and the field (``pos + 1``) of the first bad cell.
No Python code runs per cell: ``pyarrow.compute`` strips whitespace and the unit suffix and casts,
:mod:`gpu_triage.recordings.timestamps` decodes timestamps with numpy; only a failed cast looks for the
cell to blame (:func:`first_uncastable`).

* ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ``[GPU is lost]``, ``N/A`` and empty cells
  are missing values (NaN), not errors; a written NaN or infinity is an error;
* a unit may follow the number (``72.36 W``) or not, mixed within a column;
* timestamps before 2000 or after 2100 are a clock that was never set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_triage.model.limits import MAX_GPUS
from gpu_triage.recordings.errors import RecordingError, short
from gpu_triage.recordings.timestamps import parse_timestamps

#: Cell texts that mean "no value" besides anything in brackets (``[N/A]``, ``[Not Supported]``...).
MISSING_TOKENS = ("", "N/A", "n/a", "NA", "ERR!", "Unknown Error", "Not Supported")
_MISSING = pa.array([t.encode() for t in MISSING_TOKENS], pa.binary())
EARLIEST_TIME_S = 946684800.0
"""2000-01-01 UTC: an earlier timestamp is a clock that was never set (a 1970 row would otherwise be
reported as a 487104-hour state)."""
LATEST_TIME_S = 4102444800.0
"""2100-01-01 UTC."""


def timestamps(path: str | Path, cells: pa.ChunkedArray, pos: int, line: np.ndarray) -> np.ndarray:
    """Epoch seconds (read as UTC) of ``YYYY/MM/DD HH:MM:SS[.fff]`` cells."""
    time_s, bad = parse_timestamps(cells)  # as written: the timestamp is usually the first field
    if bad.any():
        trimmed = pc.ascii_trim_whitespace(cells)
        time_s, bad = parse_timestamps(trimmed)
    if bad.any():
        row = int(np.argmax(bad))
        raise RecordingError(
            path,
            int(line[row]),
            pos + 1,
            f"timestamp: {short(trimmed[row].as_py())} is not YYYY/MM/DD HH:MM:SS[.fff]",
        )
    implausible = (time_s < EARLIEST_TIME_S) | (time_s > LATEST_TIME_S)
    if implausible.any():
        row = int(np.argmax(implausible))
        raise RecordingError(
            path,
            int(line[row]),
            pos + 1,
            f"timestamp: {short(cells[row].as_py().strip())} is before 2000 or after 2100 "
            "(a clock that was not set?)",
        )
    return time_s


def numbers(
    path: str | Path, cells: pa.ChunkedArray, suffix: str, scale: float, name: str, pos: int, line: np.ndarray
) -> np.ndarray:
    """Float64 values of one column: whitespace and the unit suffix stripped, missing -> NaN.

    The cells are viewed as binary (a free cast): binary slicing skips the UTF-8 decoding that
    string slicing does, and Arrow casts binary to float64 directly. The usual column - every
    cell ``" 72.36 W"``, or every cell ``" 72.36"`` - is sliced and cast in one go; anything else
    (missing markers, no space after the comma, stray blanks) takes the general path, which gives
    the same values for these cells and handles the rest.
    """
    raw = cells.cast(pa.binary())
    if len(raw) and pc.all(pc.starts_with(raw, " ")).as_py():
        with_unit = pc.sum(pc.ends_with(raw, suffix)).as_py() or 0
        if with_unit in (0, len(raw)):
            try:
                sliced = pc.binary_slice(raw, 1, -len(suffix) if with_unit else None)
                return _finish(path, pc.cast(sliced, pa.float64()), cells, scale, name, pos, line)
            except pa.ArrowInvalid:
                pass
    text = pc.ascii_trim_whitespace(cells).cast(pa.binary())
    with_unit = pc.ends_with(text, suffix)
    count = pc.sum(with_unit).as_py() or 0
    if count:
        stripped = pc.binary_slice(text, 0, -len(suffix))
        text = stripped if count == len(text) else pc.if_else(with_unit, stripped, text)
    try:
        values = pc.cast(text, pa.float64())
    except pa.ArrowInvalid:
        missing = pc.or_(pc.starts_with(text, "["), pc.is_in(text, value_set=_MISSING))
        text = pc.if_else(missing, pa.scalar(None, pa.binary()), text)
        try:
            values = pc.cast(text, pa.float64())
        except pa.ArrowInvalid:
            row = first_uncastable(text, pa.float64())
            raise RecordingError(
                path,
                int(line[row]),
                pos + 1,
                f"{name}: {short(cells[row].as_py().strip())} is not a number"
                f"{' in ' + suffix.strip() if suffix.strip() else ''}",
            ) from None
    return _finish(path, values, cells, scale, name, pos, line)


def _finish(
    path: str | Path,
    values: pa.ChunkedArray,
    cells: pa.ChunkedArray,
    scale: float,
    name: str,
    pos: int,
    line: np.ndarray,
) -> np.ndarray:
    """Parsed float64 cells -> a writable numpy array in the attribute's unit; a written NaN or
    infinity is an error (a missing cell - null - becomes NaN, the "no value" of the arrays)."""
    written_nan = pc.any(pc.is_nan(values)).as_py() if values.null_count < len(values) else False
    array = values.to_numpy()
    if not array.flags.writeable:
        array = array.copy()
    infinite = np.isinf(array)
    if written_nan:
        infinite |= np.asarray(pc.fill_null(pc.is_nan(values), False))
    if infinite.any():
        row = int(np.argmax(infinite))
        raise RecordingError(
            path,
            int(line[row]),
            pos + 1,
            f"{name}: {short(cells[row].as_py().strip())} is not finite",
        )
    return scale_in_place(array, scale)


def scale_in_place(array: np.ndarray, scale: float) -> np.ndarray:
    """``array`` (writable float64, in the cells' unit) in the attribute's unit: multiplied by
    ``scale``, or divided by its inverse when below 1 (57 % -> 57 / 100 = 0.57 exactly, where
    57 * 0.01 is not). The one place both of the reader's paths scale a column."""
    if 0.0 < scale < 1.0:
        array /= round(1.0 / scale)
    elif scale != 1.0:
        array *= scale
    return array


def indices(path: str | Path, cells: pa.ChunkedArray, pos: int, line: np.ndarray) -> np.ndarray:
    """int32 GPU indices, each in ``0 .. MAX_GPUS - 1``."""
    text = pc.ascii_trim_whitespace(cells)
    try:
        values = pc.cast(text, pa.int32()).to_numpy()
    except pa.ArrowInvalid:
        row = first_uncastable(text, pa.int32())
        raise RecordingError(
            path, int(line[row]), pos + 1, f"index: {short(text[row].as_py())} is not a GPU index"
        ) from None
    negative = values < 0
    if negative.any():
        row = int(np.argmax(negative))
        raise RecordingError(path, int(line[row]), pos + 1, f"index: {values[row]} is negative")
    too_big = values >= MAX_GPUS
    if too_big.any():
        row = int(np.argmax(too_big))
        raise RecordingError(
            path,
            int(line[row]),
            pos + 1,
            f"index: {values[row]} is not below {MAX_GPUS} (GPUs per node)",
        )
    return values


def first_uncastable(text: pa.ChunkedArray | pa.Array, to: pa.DataType) -> int:
    """Index of the first cell Arrow cannot cast to ``to`` (binary search over slices; error path)."""
    lo, hi = 0, len(text)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pc.cast(text.slice(lo, mid - lo), to)
            lo = mid
        except pa.ArrowInvalid:
            hi = mid
    return lo
