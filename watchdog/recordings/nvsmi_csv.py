"""Read ``nvidia-smi --query-gpu=... --format=csv`` recordings as people really record them.

What a recording looks like (see ``../shared/traces/README.md`` for real ones)::

    timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]
    2025/07/27 00:34:45.155, 72.36 W, 0 %, 131 MiB

* one row per GPU per query, GPUs in board order; an ``index`` column may say which GPU a row is,
  otherwise the row's position in its snapshot does (``gpu = position % gpus``, see
  :mod:`gpu_triage.recordings.gpu_count` for how ``gpus`` is found when nobody says);
* units in the header (``[W]``), in the cells (``72.36 W``), both, or neither (``nounits``), mixed
  within one file; no header at all with ``noheader`` (then the caller passes ``columns=``);
* ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ``[GPU is lost]``, ``N/A`` and empty cells
  are missing values (NaN), not errors;
* blank lines are skipped; a last line cut short by a killed logger (no newline, fewer fields or a cut
  final field) is skipped with a warning; a repeated header line (a logger restarted with ``>>``) is
  skipped with a warning; anything else malformed is a :class:`RecordingError`
  ``"{path}:{line}:{column}: {message}"`` where ``line`` is the 1-based line in the file and
  ``column`` the 1-based **field number** (0 when the message is about the whole file).

How it is fast: the file is read in blocks of about ``chunk_bytes`` cut at line boundaries, into one
reused buffer; each block goes through ``pyarrow.csv`` with every column as a string (multi-threaded
C++), then ``pyarrow.compute`` strips whitespace and the unit suffix and casts to float64, and
:mod:`gpu_triage.recordings.timestamps` decodes timestamps with numpy - the columns on a small thread
pool, since both release the GIL. No Python code runs per row or per cell. Blank lines, which Arrow
skips, are located with numpy from the newline positions. Only when something is wrong - Arrow
refuses a line, a value does not parse, a lone carriage return - does a slow path look at the lines
one by one, to name the exact line and field, or to drop lines Arrow cannot know to skip (``"   "``,
a repeated header). Of several bad cells in a block, the one earliest in the file is reported.

Line numbers stay exact across blocks: each block knows the line number of its first line and the
file position of its first row, so ``line`` and the GPU position carry over chunk boundaries.
"""

from __future__ import annotations

import os
import re
import threading
import warnings as _warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from gpu_triage.model.limits import MAX_GPUS, MAX_LINE_BYTES
from gpu_triage.recordings import gpu_count
from gpu_triage.recordings.timestamps import parse_timestamps


class RecordingError(ValueError):
    """A recording that cannot be read; ``str()`` is ``"{path}:{line}:{column}: {message}"``.

    ``line`` is 1-based in the file; ``column`` is the 1-based field number (comma-separated), or 0
    when the problem is not one field's (e.g. the GPU count cannot be inferred).
    """

    def __init__(self, path: str | Path, line: int, column: int, message: str) -> None:
        self.path = str(path)
        self.line = int(line)
        self.column = int(column)
        self.message = message
        super().__init__(f"{self.path}:{self.line}:{self.column}: {message}")

    def __reduce__(self) -> tuple[type, tuple[str, int, int, str]]:
        return (type(self), (self.path, self.line, self.column, self.message))


class RecordingWarning(UserWarning):
    """Something in a recording was skipped (truncated last line, repeated header, no timestamps)."""


@dataclass(frozen=True)
class _Numeric:
    """How one numeric nvidia-smi field becomes one :class:`Chunk` array."""

    attribute: str
    names: tuple[str, ...]
    """nvidia-smi field names accepted, the preferred one first."""
    default_unit: str
    scales: dict[str, float]
    """Unit (as written in the header's brackets or after the number) -> factor to the attribute's unit
    (factors below 1 are applied as a division by their inverse: 57 % -> 57 / 100, exactly 0.57)."""


_WATTS = {"W": 1.0, "mW": 1e-3, "kW": 1e3}
_BYTES = {"MiB": float(1 << 20), "KiB": float(1 << 10), "GiB": float(1 << 30), "B": 1.0}
NUMERIC_FIELDS: tuple[_Numeric, ...] = (
    _Numeric("power_w", ("power.draw", "power.draw.average", "power.draw.instant"), "W", _WATTS),
    _Numeric("utilization_ratio", ("utilization.gpu",), "%", {"%": 0.01}),
    _Numeric("memory_used_bytes", ("memory.used",), "MiB", _BYTES),
    _Numeric("power_limit_w", ("enforced.power.limit", "power.limit"), "W", _WATTS),
    _Numeric("memory_total_bytes", ("memory.total",), "MiB", _BYTES),
    _Numeric("sm_clock_mhz", ("clocks.sm", "clocks.current.sm"), "MHz", {"MHz": 1.0, "GHz": 1e3}),
    _Numeric("temperature_c", ("temperature.gpu",), "C", {"C": 1.0}),
)
#: Non-numeric fields the reader understands (``gpu_name`` etc. are nvidia-smi's long aliases).
_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}
KNOWN_FIELDS = frozenset(
    {"timestamp", "index", "name", "uuid", "pci.bus_id"} | {n for f in NUMERIC_FIELDS for n in f.names}
)
#: Cell texts that mean "no value" besides anything in brackets (``[N/A]``, ``[Not Supported]``...).
MISSING_TOKENS = ("", "N/A", "n/a", "NA", "ERR!", "Unknown Error", "Not Supported")
_MISSING = pa.array([t.encode() for t in MISSING_TOKENS], pa.binary())
#: Default block size. Measured on the 2-core development machine with a 3M-row H100-style file
#: (benchmarks/bench_reader.py): peak RSS above the imports is about +70 MB with 4 MiB blocks, +130 MB
#: with 8 MiB and +340 MB with 32 MiB - every column's temporaries scale with the block - while
#: 4-8 MiB read at least as fast as 32 MiB (smaller working sets stay in cache).
DEFAULT_CHUNK_BYTES = 8 << 20
#: How much of the file the constructor parses to fill the header (GPU count, names, power limit).
PROBE_BYTES = 1 << 20
#: A header line longer than this is not one (the check reads no further).
_MAX_HEADER_BYTES = 1 << 20
EARLIEST_TIME_S = 946684800.0
"""2000-01-01 UTC: an earlier timestamp is a clock that was never set (a 1970 row would otherwise be
reported as a 487104-hour state)."""
LATEST_TIME_S = 4102444800.0
"""2100-01-01 UTC."""
_HEADER_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)\s*(?:\[([^\]]*)\])?")


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


#: The float64 value arrays of a :class:`Chunk`, in field order.
VALUE_FIELDS = tuple(f.attribute for f in NUMERIC_FIELDS)
_ARRAY_FIELDS = tuple(f.name for f in fields(Chunk) if f.name != "end_offset")


def empty_chunk(end_offset: int = 0) -> Chunk:
    """A chunk with no rows."""
    arrays = {name: np.zeros(0) for name in _ARRAY_FIELDS}
    arrays["gpu"] = np.zeros(0, dtype=np.int32)
    arrays["line"] = np.zeros(0, dtype=np.int64)
    return Chunk(**arrays, end_offset=end_offset)


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


class _Text:
    """The first ``end`` bytes of a (possibly reused) buffer: complete lines, searched in place."""

    __slots__ = ("buffer", "end")

    def __init__(self, buffer: bytes | bytearray, end: int | None = None) -> None:
        self.buffer = buffer
        self.end = len(buffer) if end is None else end

    def count(self, sub: bytes) -> int:
        return self.buffer.count(sub, 0, self.end)

    def contains(self, sub: bytes) -> bool:
        return self.buffer.find(sub, 0, self.end) >= 0

    def startswith(self, prefix: tuple[bytes, ...]) -> bool:
        return self.buffer.startswith(prefix, 0, self.end)

    def array(self) -> np.ndarray:
        return np.frombuffer(self.buffer, dtype=np.uint8, count=self.end)

    def arrow(self) -> pa.Buffer:
        return pa.py_buffer(memoryview(self.buffer)[: self.end])

    def tobytes(self) -> bytes:
        return bytes(memoryview(self.buffer)[: self.end])


class _NeedsScan(Exception):
    """The fast path cannot vouch for its line numbers; look at the lines one by one."""


@dataclass
class _Layout:
    """Which field of a line holds what, and how numeric cells are scaled."""

    names: tuple[str, ...]
    units: tuple[str | None, ...]
    timestamp: int | None
    index: int | None
    label: int | None
    """uuid or pci.bus_id: names a GPU when there is no index."""
    name: int | None
    numeric: dict[str, tuple[int, str, float, str]]
    """attribute -> (field position, unit suffix in cells, scale, field name)."""

    @property
    def ncols(self) -> int:
        return len(self.names)


@dataclass
class _Block:
    """One parsed block before GPU assignment."""

    line: np.ndarray
    values: dict[str, np.ndarray]
    time_s: np.ndarray | None = None
    index: np.ndarray | None = None
    labels: pa.ChunkedArray | None = None
    names: pa.ChunkedArray | None = None

    def __len__(self) -> int:
        return len(self.line)


def _split_fields(text: str) -> list[tuple[str, str | None]] | None:
    """``"power.draw [W]"`` -> ``("power.draw", "W")`` per field, or None if it is not a header."""
    parsed = []
    for raw in text.split(","):
        match = _HEADER_FIELD.fullmatch(raw.strip())
        if match is None:
            return None
        base = match.group(1).lower()
        parsed.append((_ALIASES.get(base, base), match.group(2).strip() if match.group(2) else None))
    if not any(base in KNOWN_FIELDS for base, _ in parsed):
        return None
    return parsed


def _field_of(text: bytes, byte_index: int) -> int:
    """1-based field number of the byte at ``byte_index`` of a line."""
    return text.count(b",", 0, byte_index) + 1


def _short(cell: object) -> str:
    text = str(cell)
    return repr(text if len(text) <= 40 else text[:37] + "...")


class NvsmiCsvReader:
    """Chunked, vectorised reader of one nvidia-smi CSV recording.

    ``gpus``: the GPU count when the file has no ``index`` (else inferred; see
    :mod:`gpu_triage.recordings.gpu_count`). ``columns``: the ``--query-gpu`` fields of a ``noheader``
    file (``"power.draw"`` or ``"power.draw [W]"``). ``chunk_bytes``: the block size read at a time.
    ``interval_s``: seconds between snapshots when the file has no timestamp column.

    The constructor reads the header and the first ~1 MiB (to fill :attr:`header`); it raises
    :class:`RecordingError` for a malformed file and ``OSError`` for an unreadable one. Skipped lines
    are reported in :attr:`warnings` (``"path:line: message"``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        gpus: int | None = None,
        columns: Sequence[str] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        interval_s: float = 1.0,
    ) -> None:
        if gpus is not None and not 1 <= gpus <= MAX_GPUS:
            raise ValueError(f"gpus must be between 1 and {MAX_GPUS}, not {gpus}")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
        self.path = Path(path)
        self.chunk_bytes = int(chunk_bytes)
        self.interval_s = float(interval_s)
        self.warnings: list[str] = []
        self._gpus_arg = gpus
        self._size = self.path.stat().st_size
        self._header_bytes = b""
        self._layout, self._data_start, self._first_line = self._read_header(columns)
        names = tuple(f"c{i}" for i in range(self._layout.ncols))
        self._read_options = pacsv.ReadOptions(column_names=names, use_threads=True, block_size=1 << 20)
        self._parse_options = pacsv.ParseOptions(
            delimiter=",", quote_char=False, double_quote=False, escape_char=False, ignore_empty_lines=True
        )
        self._convert = {extra: self._convert_options(extra) for extra in (False, True)}
        self._labels: pa.Array | None = None
        self.header = self._probe()

    # ------------------------------------------------------------------ header
    def _read_header(self, columns: Sequence[str] | None) -> tuple[_Layout, int, int]:
        """Find the header line (or accept ``columns``); return the layout, the byte offset and the
        line number of the first data line."""
        given = None
        if columns is not None:
            given = _split_fields(", ".join(columns))
            if given is None or len(given) != len(columns):
                raise ValueError(f"columns= must be nvidia-smi field names, got {list(columns)}")
        offset, line_no, bom = 0, 0, 0
        with self.path.open("rb") as f:
            while True:
                raw = f.readline(_MAX_HEADER_BYTES)
                line_no += 1
                if not raw:
                    raise RecordingError(self.path, max(line_no - 1, 1), 0, "the recording is empty")
                bom = 3 if line_no == 1 and raw.startswith(b"\xef\xbb\xbf") else 0
                text = raw[bom:]
                if text.strip():
                    break
                offset += len(raw)
        try:
            parsed = _split_fields(text.decode("utf-8"))
        except UnicodeDecodeError:
            parsed = None
        if parsed is None:
            if given is None:
                raise RecordingError(
                    self.path,
                    line_no,
                    1,
                    "no header line (a --format=csv,noheader recording?): pass the --query-gpu field "
                    "list, e.g. `gpu-watchdog triage --columns timestamp,index,power.draw,utilization.gpu "
                    "FILE` (Python: columns=[...])",
                )
            return self._layout_from(given, line_no), offset + bom, line_no
        if given is not None and [b for b, _ in given] != [b for b, _ in parsed]:
            raise RecordingError(
                self.path,
                line_no,
                1,
                f"the header names {[b for b, _ in parsed]} but columns= gives {[b for b, _ in given]}",
            )
        self._header_bytes = text.strip()
        return self._layout_from(parsed, line_no), offset + len(raw), line_no + 1

    def _layout_from(self, parsed: list[tuple[str, str | None]], header_line: int) -> _Layout:
        names = tuple(base for base, _ in parsed)
        units = tuple(unit for _, unit in parsed)

        def position(*candidates: str) -> int | None:
            for candidate in candidates:
                if candidate in names:
                    return names.index(candidate)
            return None

        numeric: dict[str, tuple[int, str, float, str]] = {}
        for spec in NUMERIC_FIELDS:
            pos = position(*spec.names)
            if pos is None:
                continue
            unit = units[pos] or spec.default_unit
            if unit not in spec.scales:
                raise RecordingError(
                    self.path,
                    header_line,
                    pos + 1,
                    f"unknown unit [{unit}] for {names[pos]} (expected one of {sorted(spec.scales)})",
                )
            numeric[spec.attribute] = (pos, " " + unit, spec.scales[unit], names[pos])
        if "power_w" not in numeric:
            raise RecordingError(
                self.path,
                header_line,
                1,
                "no power.draw column (nor power.draw.average / power.draw.instant): board power is what "
                "triage classifies; record with --query-gpu=timestamp,index,power.draw,utilization.gpu,...",
            )
        label = position("uuid", "pci.bus_id")
        return _Layout(
            names=names,
            units=units,
            timestamp=position("timestamp"),
            index=position("index"),
            label=label,
            name=position("name"),
            numeric=numeric,
        )

    def _convert_options(self, extra: bool) -> pacsv.ConvertOptions:
        layout = self._layout
        wanted = {pos for pos, _, _, _ in layout.numeric.values()}
        wanted |= {p for p in (layout.timestamp, layout.index) if p is not None}
        if layout.label is not None and layout.index is None:
            wanted.add(layout.label)
        if extra:
            wanted |= {p for p in (layout.name, layout.label) if p is not None}
        include = [f"c{p}" for p in sorted(wanted)]
        return pacsv.ConvertOptions(
            column_types=dict.fromkeys(include, pa.string()),
            include_columns=include,
            check_utf8=True,
            null_values=[],
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )

    # ------------------------------------------------------------------ blocks of lines
    def _raw_blocks(self, chunk_bytes: int) -> Iterator[tuple[_Text, int, int, int]]:
        """Yield ``(text, first_line, end_offset, newlines)``: complete lines (ending in ``\\n``) of
        about ``chunk_bytes``, then the last line if it has no newline (``newlines == -1``).

        One buffer is reused for the whole file (``readinto``, the partial last line moved to its
        front), so reading costs no copies beyond what the OS does; the text handed out is only
        valid until the next block is requested.
        """
        line_no = self._first_line
        offset = self._data_start
        buffer = bytearray(chunk_bytes)
        filled = 0  # bytes of a partial line carried to the front of the buffer
        with self.path.open("rb") as f:
            f.seek(self._data_start)
            while True:
                if filled == len(buffer):  # one line longer than the buffer: grow it (bounded)
                    if filled > MAX_LINE_BYTES:
                        raise RecordingError(
                            self.path, line_no, 1, f"line longer than {MAX_LINE_BYTES} bytes (not nvidia-smi)"
                        )
                    buffer = buffer + bytearray(len(buffer))
                with memoryview(buffer) as view:
                    got = f.readinto(view[filled:])
                if not got:
                    break
                end = filled + got
                cut = buffer.rfind(b"\n", 0, end) + 1
                if cut == 0:
                    filled = end
                    continue
                newlines = buffer.count(b"\n", 0, cut)
                offset += cut
                yield _Text(buffer, cut), line_no, offset, newlines
                line_no += newlines
                buffer[: end - cut] = buffer[cut:end]
                filled = end - cut
        if filled:
            tail = bytes(buffer[:filled])
            yield _Text(tail, len(tail)), line_no, offset + filled, -1

    def _blocks(self, chunk_bytes: int, extra: bool) -> Generator[tuple[_Block, int], None, None]:
        """Parsed blocks with their end offsets; applies the truncated-last-line rule."""
        for text, first_line, end_offset, newlines in self._raw_blocks(chunk_bytes):
            if newlines >= 0:
                yield self._parse_block(text, first_line, extra, newlines), end_offset
                continue
            line = text.tobytes()
            line = line[:-1] if line.endswith(b"\r") else line
            if not line.strip():
                continue
            found = line.count(b",") + 1
            expected = self._layout.ncols
            if found == expected and not line.rsplit(b",", 1)[-1].strip() and expected > 1:
                # "..., 3 %, " then EOF: the last value never came (an empty cell is otherwise missing).
                self._warn(
                    f"{self.path}:{first_line}: skipped the truncated last line (its last field is empty)"
                )
                continue
            try:
                block = self._parse_block(_Text(line + b"\n"), first_line, extra, 1)
            except RecordingError as error:
                if found < expected or (found == expected and error.column == expected):
                    self._warn(f"{self.path}:{first_line}: skipped the truncated last line ({error.message})")
                    continue
                raise
            yield block, end_offset

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    # ------------------------------------------------------------------ parsing one block
    def _parse_block(self, text: _Text, first_line: int, extra: bool, newlines: int) -> _Block:
        """Rows of ``text`` (complete lines, ``newlines`` of them, the first being ``first_line``)."""
        try:
            table = self._read_table(text, extra)
            line = self._line_numbers(text, first_line, table.num_rows, newlines)
            return self._convert_table(table, line, extra)
        except (_NeedsScan, pa.ArrowException):
            pass
        except RecordingError:
            if not (self._header_bytes and text.contains(self._header_bytes)):
                raise
        # Slow path: one look at every line, to drop odd blank lines and repeated headers, and to
        # name the exact line and field of a structural error.
        clean, lines = self._scan(text.tobytes(), first_line)
        try:
            table = self._read_table(_Text(clean), extra)
        except pa.ArrowException as error:  # the scan should have caught anything Arrow refuses
            raise RecordingError(self.path, int(lines[0]), 0, f"cannot parse: {error}") from None
        if table.num_rows != len(lines):
            raise RecordingError(self.path, first_line, 0, "cannot parse: the line count does not match")
        return self._convert_table(table, lines, extra)

    def _read_table(self, text: _Text, extra: bool) -> pa.Table:
        if text.end == 0:
            return pa.table(
                {name: pa.array([], pa.string()) for name in self._convert[extra].include_columns}
            )
        return pacsv.read_csv(
            text.arrow(),
            read_options=self._read_options,
            parse_options=self._parse_options,
            convert_options=self._convert[extra],
        )

    def _line_numbers(self, text: _Text, first_line: int, rows: int, lines: int) -> np.ndarray:
        """The file line of each row Arrow produced, if that can be known without a scan.

        Arrow skips empty lines and splits lines at a lone ``\\r`` too; both change the row <-> line
        correspondence, so they are checked with fast byte counts first.
        """
        if text.contains(b"\r") and text.count(b"\r") != text.count(b"\r\n"):
            raise _NeedsScan
        if self._layout.ncols == 1 and (
            text.startswith((b" ", b"\t")) or text.contains(b"\n ") or text.contains(b"\n\t")
        ):
            raise _NeedsScan  # a one-column row of spaces would be a value, not a blank line
        if rows == lines:
            return np.arange(first_line, first_line + rows, dtype=np.int64)
        raw = text.array()
        ends = np.flatnonzero(raw == 10)
        starts = np.concatenate(([0], ends[:-1] + 1))
        length = ends - starts
        blank = (length == 0) | ((length == 1) & (raw[np.minimum(starts, len(raw) - 1)] == 13))
        kept = np.flatnonzero(~blank)
        if len(kept) != rows:
            raise _NeedsScan
        return (first_line + kept).astype(np.int64)

    def _scan(self, data: bytes, first_line: int) -> tuple[bytes, np.ndarray]:
        """Check every line of ``data`` (Python loop: error path only). Returns the kept lines and
        their line numbers; raises :class:`RecordingError` at the first structural error."""
        kept: list[bytes] = []
        numbers: list[int] = []
        expected = self._layout.ncols
        for i, raw in enumerate(data.split(b"\n")[:-1]):
            line_no = first_line + i
            text = raw[:-1] if raw.endswith(b"\r") else raw
            stripped = text.strip()
            if not stripped:
                continue
            if self._header_bytes and stripped == self._header_bytes:
                self._warn(f"{self.path}:{line_no}: skipped a repeated header line")
                continue
            try:
                text.decode("utf-8")
            except UnicodeDecodeError as error:
                raise RecordingError(
                    self.path, line_no, _field_of(text, error.start), "not UTF-8 text"
                ) from None
            if b"\r" in text:
                raise RecordingError(
                    self.path, line_no, _field_of(text, text.index(b"\r")), "stray carriage return"
                )
            found = text.count(b",") + 1
            if found != expected:
                raise RecordingError(
                    self.path,
                    line_no,
                    min(found, expected) + 1,
                    f"expected {expected} fields ({', '.join(self._layout.names)}), found {found}",
                )
            kept.append(text)
            numbers.append(line_no)
        clean = b"\n".join(kept) + b"\n" if kept else b""
        return clean, np.array(numbers, dtype=np.int64)

    def _convert_table(self, table: pa.Table, line: np.ndarray, extra: bool) -> _Block:
        layout = self._layout

        def column(pos: int) -> pa.ChunkedArray:
            return table.column(f"c{pos}")

        # The columns are independent and pyarrow.compute releases the GIL: convert them in parallel.
        # Every column is converted even when one fails, so the error reported is the first one in
        # the file (lowest line, then lowest field), whatever the thread timing.
        tasks: dict[str, Callable[[], object]] = {
            attribute: partial(self._numbers, column(pos), suffix, scale, name, pos, line)
            for attribute, (pos, suffix, scale, name) in layout.numeric.items()
        }
        if layout.timestamp is not None:
            tasks["time_s"] = partial(self._timestamps, column(layout.timestamp), layout.timestamp, line)
        if layout.index is not None:
            tasks["index"] = partial(self._indices, column(layout.index), layout.index, line)
        results = _run_all(tasks)
        errors = [r for r in results.values() if isinstance(r, RecordingError)]
        if errors:
            raise min(errors, key=lambda e: (e.line, e.column))
        block = _Block(
            line=line,
            values={attribute: results[attribute] for attribute in layout.numeric},  # type: ignore[misc]
            time_s=results.get("time_s"),  # type: ignore[arg-type]
            index=results.get("index"),  # type: ignore[arg-type]
        )
        if layout.label is not None and (extra or layout.index is None):
            block.labels = pc.ascii_trim_whitespace(column(layout.label))
        if extra and layout.name is not None:
            block.names = pc.ascii_trim_whitespace(column(layout.name))
        return block

    def _timestamps(self, cells: pa.ChunkedArray, pos: int, line: np.ndarray) -> np.ndarray:
        time_s, bad = parse_timestamps(cells)  # as written: the timestamp is usually the first field
        if bad.any():
            trimmed = pc.ascii_trim_whitespace(cells)
            time_s, bad = parse_timestamps(trimmed)
        if bad.any():
            row = int(np.argmax(bad))
            raise RecordingError(
                self.path,
                int(line[row]),
                pos + 1,
                f"timestamp: {_short(trimmed[row].as_py())} is not YYYY/MM/DD HH:MM:SS[.fff]",
            )
        implausible = (time_s < EARLIEST_TIME_S) | (time_s > LATEST_TIME_S)
        if implausible.any():
            row = int(np.argmax(implausible))
            raise RecordingError(
                self.path,
                int(line[row]),
                pos + 1,
                f"timestamp: {_short(cells[row].as_py().strip())} is before 2000 or after 2100 "
                "(a clock that was not set?)",
            )
        return time_s

    def _numbers(
        self, cells: pa.ChunkedArray, suffix: str, scale: float, name: str, pos: int, line: np.ndarray
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
                    return self._finish(pc.cast(sliced, pa.float64()), cells, scale, name, pos, line)
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
                row = _first_uncastable(text, pa.float64())
                raise RecordingError(
                    self.path,
                    int(line[row]),
                    pos + 1,
                    f"{name}: {_short(cells[row].as_py().strip())} is not a number"
                    f"{' in ' + suffix.strip() if suffix.strip() else ''}",
                ) from None
        return self._finish(values, cells, scale, name, pos, line)

    def _finish(
        self,
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
                self.path,
                int(line[row]),
                pos + 1,
                f"{name}: {_short(cells[row].as_py().strip())} is not finite",
            )
        if 0.0 < scale < 1.0:
            array /= round(1.0 / scale)  # 57 % -> 57 / 100 = 0.57 exactly, where 57 * 0.01 is not
        elif scale != 1.0:
            array *= scale
        return array

    def _indices(self, cells: pa.ChunkedArray, pos: int, line: np.ndarray) -> np.ndarray:
        text = pc.ascii_trim_whitespace(cells)
        try:
            values = pc.cast(text, pa.int32()).to_numpy()
        except pa.ArrowInvalid:
            row = _first_uncastable(text, pa.int32())
            raise RecordingError(
                self.path, int(line[row]), pos + 1, f"index: {_short(text[row].as_py())} is not a GPU index"
            ) from None
        negative = values < 0
        if negative.any():
            row = int(np.argmax(negative))
            raise RecordingError(self.path, int(line[row]), pos + 1, f"index: {values[row]} is negative")
        too_big = values >= MAX_GPUS
        if too_big.any():
            row = int(np.argmax(too_big))
            raise RecordingError(
                self.path,
                int(line[row]),
                pos + 1,
                f"index: {values[row]} is not below {MAX_GPUS} (GPUs per node)",
            )
        return values

    # ------------------------------------------------------------------ header facts from the first rows
    def _probe(self) -> RecordingHeader:
        layout = self._layout
        probe: _Block | None = None
        last_line = self._first_line
        blocks = self._blocks(PROBE_BYTES, extra=True)
        try:
            for block, _ in blocks:
                if len(block):
                    probe = block
                    break
        finally:
            blocks.close()
        if probe is None:
            raise RecordingError(self.path, last_line, 0, "the recording has no data rows")
        gpus, source = self._infer_gpus(probe)
        if layout.timestamp is None:
            self._warn(
                f"{self.path}:{self._first_line}: no timestamp column: snapshots are placed "
                f"interval_s={self.interval_s:g} s apart"
            )
        gpu = self._assign(probe, 0, gpus)
        gpu_names = None
        if probe.names is not None:
            names = probe.names.to_pylist()
            first_row: dict[int, int] = {}
            for row, g in enumerate(gpu[: gpus * 2 + 64].tolist()):
                first_row.setdefault(g, row)
            gpu_names = tuple(names[first_row[g]] if g in first_row else "" for g in range(gpus))
        limit = probe.values.get("power_limit_w")
        power_limit_w = None
        if limit is not None and np.isfinite(limit).any():
            power_limit_w = float(np.nanmedian(limit))
        return RecordingHeader(
            path=str(self.path),
            columns=layout.names,
            gpus=gpus,
            has_index=layout.index is not None,
            gpu_names=gpu_names,
            power_limit_w=power_limit_w,
            size_bytes=self._size,
            has_timestamp=layout.timestamp is not None,
            gpus_from=source,
            units=layout.units,
        )

    def _infer_gpus(self, probe: _Block) -> tuple[int, str]:
        layout = self._layout
        gpus: int | None
        if self._gpus_arg is not None:
            gpus, source = self._gpus_arg, "caller"
        elif probe.index is not None:
            gpus, source = int(probe.index.max()) + 1, "index"
        else:
            gpus, source = None, ""
            if probe.labels is not None:
                labels = probe.labels.slice(0, 2 * gpu_count.MAX_GPUS + 1).to_pylist()
                found = gpu_count.period_from_labels(labels[0], labels)
                if found is not None and (found < len(labels) or len(labels) == len(probe)):
                    assert layout.label is not None  # labels are read only from a label column
                    gpus, source = found, layout.names[layout.label]
            if gpus is None and probe.time_s is not None:
                found = gpu_count.period_from_gaps(probe.time_s)
                if found is not None:
                    gpus, source = found, "timestamps"
            if gpus is None:
                found = gpu_count.period_from_values(probe.values["power_w"])
                if found is not None:
                    gpus, source = found, "values"
            if gpus is None:
                raise RecordingError(
                    self.path,
                    self._first_line,
                    0,
                    "cannot infer the GPU count (no index column, and neither the timestamps nor the "
                    "values repeat clearly): pass --gpus (gpus=)",
                )
        assert gpus is not None
        if layout.label is not None and layout.index is None and probe.labels is not None:
            first = probe.labels.slice(0, gpus)
            distinct = pc.count_distinct(first).as_py()
            if len(first) < gpus or distinct != gpus:
                raise RecordingError(
                    self.path,
                    self._first_line,
                    layout.label + 1,
                    f"the first {gpus} rows should name {gpus} different GPUs, they name {distinct}: "
                    "check --gpus",
                )
            self._labels = first.combine_chunks()
        return gpus, source

    def _assign(self, block: _Block, position: int, gpus: int) -> np.ndarray:
        """Board index per row: the index column, else the uuid/bus id, else the position."""
        if block.index is not None:
            too_big = block.index >= gpus
            if too_big.any():
                row = int(np.argmax(too_big))
                raise RecordingError(
                    self.path,
                    int(block.line[row]),
                    (self._layout.index or 0) + 1,
                    f"index {block.index[row]} but the recording has {gpus} GPUs "
                    f"({'--gpus' if self._gpus_arg else 'from the first rows'})",
                )
            return block.index.astype(np.int32, copy=False)
        if block.labels is not None and self._labels is not None:
            found = pc.index_in(block.labels, value_set=self._labels)
            if found.null_count:
                row = int(np.argmax(np.asarray(pc.is_null(found))))
                raise RecordingError(
                    self.path,
                    int(block.line[row]),
                    (self._layout.label or 0) + 1,
                    f"{_short(block.labels[row].as_py())} is not one of the {gpus} GPUs of the first rows",
                )
            return found.to_numpy().astype(np.int32)
        return ((position + np.arange(len(block), dtype=np.int64)) % gpus).astype(np.int32)

    # ------------------------------------------------------------------ public
    def chunks(self, progress: Callable[[int], None] | None = None) -> Iterator[Chunk]:
        """Yield the recording as chunks of about ``chunk_bytes``; ``progress(end_offset)`` is called
        after each (the file size is ``header.size_bytes``). Raises :class:`RecordingError`."""
        gpus = self.header.gpus
        position = 0
        for block, end_offset in self._blocks(self.chunk_bytes, extra=False):
            n = len(block)
            if n == 0:
                if progress is not None:
                    progress(end_offset)
                continue
            gpu = self._assign(block, position, gpus)
            if block.time_s is not None:
                time_s = block.time_s
            else:
                snapshot = (position + np.arange(n, dtype=np.int64)) // gpus
                time_s = snapshot * self.interval_s
            position += n
            absent = np.full(n, np.nan)
            absent.flags.writeable = False
            arrays = {attribute: block.values.get(attribute, absent) for attribute in VALUE_FIELDS}
            yield Chunk(gpu=gpu, time_s=time_s, line=block.line, end_offset=end_offset, **arrays)
            if progress is not None:
                progress(end_offset)

    def read_all(self) -> Chunk:
        """Every row as one chunk (needs memory for the whole recording)."""
        return concat_chunks(list(self.chunks()))


#: Threads converting a block's columns (pyarrow.compute and numpy release the GIL).
_WORKERS = max(1, min(4, os.cpu_count() or 1))
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _run_all(tasks: dict[str, Callable[[], object]]) -> dict[str, object]:
    """Run ``tasks`` on a small shared thread pool; a task's RecordingError becomes its result."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="nvsmi-csv")

    def guarded(task: Callable[[], object]) -> object:
        try:
            return task()
        except RecordingError as error:
            return error

    if len(tasks) == 1 or _WORKERS == 1:
        return {key: guarded(task) for key, task in tasks.items()}
    futures = {key: _POOL.submit(guarded, task) for key, task in tasks.items()}
    return {key: future.result() for key, future in futures.items()}


def _first_uncastable(text: pa.ChunkedArray | pa.Array, to: pa.DataType) -> int:
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


def read_recording(path: str | Path, **kw: object) -> tuple[RecordingHeader, Chunk]:
    """Read a whole recording into one :class:`Chunk` (small files, tests). Keyword arguments go to
    :class:`NvsmiCsvReader`; its warnings are re-issued as :class:`RecordingWarning`."""
    reader = NvsmiCsvReader(path, **kw)  # type: ignore[arg-type]
    chunk = reader.read_all()
    for message in reader.warnings:
        _warnings.warn(message, RecordingWarning, stacklevel=2)
    return reader.header, chunk
