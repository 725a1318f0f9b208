"""Which field of a recording's line holds what, in which unit: the header line and the column layout.

An nvidia-smi CSV header names each ``--query-gpu`` field, with its unit in brackets or not
(``timestamp, power.draw [W], utilization.gpu [%]``); a ``noheader`` recording has none, and the caller
passes the field list instead (``columns=``). :func:`read_header` finds the header line (skipping
leading blank lines and a UTF-8 byte-order mark) and turns it into a :class:`Layout`: the position of
the timestamp, the GPU index, the uuid/bus id and the name, and per numeric field its position, the
unit suffix its cells may carry and the factor to the :class:`~gpu_triage.recordings.values.Chunk`
attribute's unit. No pyarrow here: this is plain text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_triage.recordings.errors import RecordingError


@dataclass(frozen=True)
class NumericField:
    """How one numeric nvidia-smi field becomes one :class:`~gpu_triage.recordings.values.Chunk` array."""

    attribute: str
    names: tuple[str, ...]
    """nvidia-smi field names accepted, the preferred one first."""
    default_unit: str
    scales: dict[str, float]
    """Unit (as written in the header's brackets or after the number) -> factor to the attribute's unit
    (factors below 1 are applied as a division by their inverse: 57 % -> 57 / 100, exactly 0.57)."""


_WATTS = {"W": 1.0, "mW": 1e-3, "kW": 1e3}
_BYTES = {"MiB": float(1 << 20), "KiB": float(1 << 10), "GiB": float(1 << 30), "B": 1.0}
NUMERIC_FIELDS: tuple[NumericField, ...] = (
    NumericField("power_w", ("power.draw", "power.draw.average", "power.draw.instant"), "W", _WATTS),
    NumericField("utilization_ratio", ("utilization.gpu",), "%", {"%": 0.01}),
    NumericField("memory_used_bytes", ("memory.used",), "MiB", _BYTES),
    NumericField("power_limit_w", ("enforced.power.limit", "power.limit"), "W", _WATTS),
    NumericField("memory_total_bytes", ("memory.total",), "MiB", _BYTES),
    NumericField("sm_clock_mhz", ("clocks.sm", "clocks.current.sm"), "MHz", {"MHz": 1.0, "GHz": 1e3}),
    NumericField("temperature_c", ("temperature.gpu",), "C", {"C": 1.0}),
)
#: The float64 value arrays of a :class:`~gpu_triage.recordings.values.Chunk`, in field order.
VALUE_FIELDS = tuple(f.attribute for f in NUMERIC_FIELDS)
#: Non-numeric fields the reader understands (``gpu_name`` etc. are nvidia-smi's long aliases).
_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}
KNOWN_FIELDS = frozenset(
    {"timestamp", "index", "name", "uuid", "pci.bus_id"} | {n for f in NUMERIC_FIELDS for n in f.names}
)
#: A header line longer than this is not one (the check reads no further).
_MAX_HEADER_BYTES = 1 << 20
_HEADER_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)\s*(?:\[([^\]]*)\])?")


@dataclass
class Layout:
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


@dataclass(frozen=True)
class HeaderLine:
    """What :func:`read_header` found: the layout and where the data starts."""

    layout: Layout
    data_start: int
    """Byte offset of the first data line."""
    first_line: int
    """1-based line number of the first data line."""
    header_bytes: bytes
    """The header line, stripped (b"" without one): a data line equal to it is a repeated header."""


def split_fields(text: str) -> list[tuple[str, str | None]] | None:
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


def read_header(path: Path, columns: Sequence[str] | None) -> HeaderLine:
    """Find the header line of ``path`` (or accept ``columns``); raises :class:`RecordingError` for a
    recording without one (and no ``columns``), ``ValueError`` for ``columns`` that are no field names."""
    given = None
    if columns is not None:
        given = split_fields(", ".join(columns))
        if given is None or len(given) != len(columns):
            raise ValueError(f"columns= must be nvidia-smi field names, got {list(columns)}")
    offset, line_no, bom = 0, 0, 0
    with path.open("rb") as f:
        while True:
            raw = f.readline(_MAX_HEADER_BYTES)
            line_no += 1
            if not raw:
                raise RecordingError(path, max(line_no - 1, 1), 0, "the recording is empty")
            bom = 3 if line_no == 1 and raw.startswith(b"\xef\xbb\xbf") else 0
            text = raw[bom:]
            if text.strip():
                break
            offset += len(raw)
    try:
        parsed = split_fields(text.decode("utf-8"))
    except UnicodeDecodeError:
        parsed = None
    if parsed is None:
        if given is None:
            raise RecordingError(
                path,
                line_no,
                1,
                "no header line (a --format=csv,noheader recording?): pass the --query-gpu field "
                "list, e.g. `gpu-watchdog triage --columns timestamp,index,power.draw,utilization.gpu "
                "FILE` (Python: columns=[...])",
            )
        return HeaderLine(layout_from(given, line_no, path), offset + bom, line_no, b"")
    if given is not None and [b for b, _ in given] != [b for b, _ in parsed]:
        raise RecordingError(
            path,
            line_no,
            1,
            f"the header names {[b for b, _ in parsed]} but columns= gives {[b for b, _ in given]}",
        )
    return HeaderLine(layout_from(parsed, line_no, path), offset + len(raw), line_no + 1, text.strip())


def layout_from(parsed: list[tuple[str, str | None]], header_line: int, path: Path) -> Layout:
    """The layout of the fields ``parsed`` from a header (or ``columns=``) on line ``header_line``."""
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
                path,
                header_line,
                pos + 1,
                f"unknown unit [{unit}] for {names[pos]} (expected one of {sorted(spec.scales)})",
            )
        numeric[spec.attribute] = (pos, " " + unit, spec.scales[unit], names[pos])
    if "power_w" not in numeric:
        raise RecordingError(
            path,
            header_line,
            1,
            "no power.draw column (nor power.draw.average / power.draw.instant): board power is what "
            "triage classifies; record with --query-gpu=timestamp,index,power.draw,utilization.gpu,...",
        )
    label = position("uuid", "pci.bus_id")
    return Layout(
        names=names,
        units=units,
        timestamp=position("timestamp"),
        index=position("index"),
        label=label,
        name=position("name"),
        numeric=numeric,
    )
