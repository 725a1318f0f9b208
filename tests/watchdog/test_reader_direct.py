"""The reader's direct path (bytes -> arrays with numpy, ``recordings/direct.py``) against the careful
path (``pyarrow.csv`` and ``recordings/cells.py``): the same arrays to the bit, the same warnings, the
same error naming the same line and field - whatever the cells hold - and Arrow never called for a
clean recording."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_triage.recordings import NvsmiCsvReader, RecordingError, parse
from gpu_triage.recordings.direct import parse_direct
from gpu_triage.recordings.layout import read_header
from gpu_triage.recordings.nvsmi_csv import VALUE_FIELDS

ARRAYS = ("gpu", "time_s", "line", *VALUE_FIELDS)
HEADER = "timestamp, index, power.draw [W], utilization.gpu [%], memory.used [MiB]"


def _clean_lines(rows: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(rows):
        second, ms = divmod(45_155 + 100 * (i // 4) + i % 4, 1000)
        minute, second = divmod(34 * 60 + second, 60)
        power = rng.uniform(0, 999.99)
        lines.append(
            f"2025/07/27 00:{minute:02d}:{second:02d}.{ms:03d}, {i % 4}, {power:.2f} W, "
            f"{rng.integers(0, 101)} %, {rng.integers(0, 81_560)} MiB"
        )
    return lines


def _read(path: Path, direct: bool, monkeypatch: pytest.MonkeyPatch, **kw: object) -> object:
    """Everything the reader hands out for ``path`` (or the error it raised), with the direct path
    on or off."""
    monkeypatch.setattr(parse, "DIRECT", direct)
    try:
        reader = NvsmiCsvReader(path, **kw)  # type: ignore[arg-type]
        chunks = list(reader.chunks())
    except RecordingError as error:
        return ("error", str(error))
    arrays = {name: np.concatenate([getattr(c, name) for c in chunks]) if chunks else None for name in ARRAYS}
    return reader.header, arrays, reader.warnings, reader.dropped_rows, [len(c) for c in chunks]


def _same(a: object, b: object) -> None:
    if isinstance(a, tuple) and a and a[0] == "error":
        assert a == b
        return
    assert isinstance(a, tuple) and isinstance(b, tuple)
    header_a, arrays_a, *rest_a = a
    header_b, arrays_b, *rest_b = b
    assert header_a == header_b
    assert rest_a == rest_b
    for name in ARRAYS:
        x, y = arrays_a[name], arrays_b[name]  # type: ignore[index]
        assert x.dtype == y.dtype, name
        # bit for bit: NaN where NaN, and the very same doubles elsewhere
        assert x.tobytes() == y.tobytes(), name


def test_clean_blocks_never_reach_arrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean recording is decoded without pyarrow.csv once the header is probed: the bytes go to
    arrays directly (the same arrays the Arrow path gives)."""
    path = tmp_path / "clean.csv"
    path.write_text(HEADER + "\n" + "\n".join(_clean_lines(4000)) + "\n")
    expected = _read(path, False, monkeypatch, chunk_bytes=4096)
    monkeypatch.setattr(parse, "DIRECT", True)
    reader = NvsmiCsvReader(path, chunk_bytes=4096)

    def no_arrow(*args: object, **kw: object) -> None:
        raise AssertionError("pyarrow.csv was called for a clean block")

    monkeypatch.setattr(parse.pacsv, "read_csv", no_arrow)
    chunks = list(reader.chunks())
    assert sum(len(c) for c in chunks) == 4000
    monkeypatch.undo()
    _same(_read(path, True, monkeypatch, chunk_bytes=4096), expected)


def test_direct_decodes_power_exactly_as_arrow_casts(tmp_path: Path) -> None:
    """Every two-decimal watt value from 0.00 to 999.99 gives the double that Arrow's cast (and
    Python's float) gives: an exact integer over an exact power of ten, rounded once."""
    cents = np.arange(100_000)
    body = "".join(f"2025/07/27 00:34:45.155, {c // 100}.{c % 100:02d} W, 7 %\n" for c in cents)
    path = tmp_path / "w.csv"
    path.write_text("timestamp, power.draw [W], utilization.gpu [%]\n" + body)
    found = read_header(path, None)
    raw = np.frombuffer(body.encode(), dtype=np.uint8)
    columns = parse_direct(raw, body.encode(), len(cents), found.layout)
    assert columns is not None
    expected = np.array([float(f"{c // 100}.{c % 100:02d}") for c in cents])
    assert columns.values["power_w"].tobytes() == expected.tobytes()
    assert (columns.values["utilization_ratio"] == 0.07).all()


_NUMBER_CELLS = st.one_of(
    st.builds(lambda w, f: f" {w}.{f:02d} W", st.integers(0, 9999), st.integers(0, 99)),
    st.builds(lambda w: f" {w} W", st.integers(0, 10**9)),
    st.builds(lambda w, f: f" {w}.{f}", st.integers(0, 99999), st.integers(0, 999)),
    st.sampled_from(
        [
            " [N/A]",
            " N/A",
            " ",
            "",
            "72.36 W",
            "  72.36 W",
            " 72.36W",
            " 72.36 W ",
            " .5 W",
            " 5. W",
            " -5 W",
            " +5 W",
            " 1e3 W",
            " nan W",
            " inf",
            " 0x10",
            " 7,5",
            " 12345678 W",
            " 123456789",
            " 1.2.3 W",
            " 00072.360 W",
            " 7\u00e9 W",
            " 72.36 mW",
        ]
    ),
)
_UTIL_CELLS = st.one_of(
    st.builds(lambda u: f" {u} %", st.integers(0, 100)),
    st.builds(lambda u: f" {u}", st.integers(0, 100)),
    st.sampled_from([" [Not Supported]", " 5.5 %", " %", " 100%", "100 %"]),
)
_STAMPS = st.one_of(
    st.builds(
        lambda s, frac: f"2025/07/27 00:{s // 60 % 60:02d}:{s % 60:02d}{frac}",
        st.integers(0, 7200),
        st.sampled_from(["", ".1", ".15", ".155", ".155000", ".1550000"]),
    ),
    st.sampled_from(
        [
            "1970/01/01 00:00:00.000",
            "2025/13/27 00:34:45.155",
            "2025-07-27T00:34:45.155",
            " 2025/07/27 00:34:45.155",
            "2025/07/27 00:34:45.15x",
            "2025/07/27 00:34:45,155",
            "N/A",
        ]
    ),
)


@st.composite
def _recordings(draw: st.DrawFn) -> bytes:
    """A recording whose rows are mostly clean, with odd cells, odd lines and odd endings mixed in;
    either nvidia-smi's usual layout or one that starts with the index (no timestamp)."""
    rows = draw(st.integers(1, 40))
    clean = draw(st.booleans())
    index_first = draw(st.booleans())
    lines = []
    for i in range(rows):
        if clean:
            stamp = f"2025/07/27 00:34:{45 + i // 8:02d}.{i % 8:03d}"
            power = f"{draw(st.integers(0, 99999)) / 100:.2f} W"
            lines.append(
                f"{i % 8}, {power}, {i % 101} %" if index_first else f"{stamp}, {i % 8}, {power}, {i % 101} %"
            )
            continue
        index = draw(st.sampled_from([f" {i % 8}", f" {i % 8}", " 9", "7", " x", " 1024", ""]))
        if index_first:
            line = (
                f"{index.strip() if draw(st.booleans()) else index},{draw(_NUMBER_CELLS)},{draw(_UTIL_CELLS)}"
            )
        else:
            line = f"{draw(_STAMPS)},{index},{draw(_NUMBER_CELLS)},{draw(_UTIL_CELLS)}"
        lines.append(draw(st.sampled_from([line, line, line, line, "", line + ", 3", line + "\r"])))
    ending = draw(st.sampled_from(["\n", "\n", "", "\r\n"]))
    header = (
        "index, power.draw [W], utilization.gpu [%]"
        if index_first
        else "timestamp, index, power.draw [W], utilization.gpu [%]"
    )
    return (header + "\n" + "\n".join(lines) + ending).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_recordings(), chunk_bytes=st.sampled_from([1, 64, 1 << 20]))
def test_direct_and_arrow_paths_agree_on_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes, chunk_bytes: int
) -> None:
    """Whatever the cells hold, both paths give the same rows, warnings and dropped rows - or the
    same error, naming the same file, line and field."""
    path = tmp_path / "fuzz.csv"
    path.write_bytes(data)
    _same(
        _read(path, True, monkeypatch, chunk_bytes=chunk_bytes),
        _read(path, False, monkeypatch, chunk_bytes=chunk_bytes),
    )


def test_direct_path_keeps_the_error_of_a_bad_cell_deep_in_a_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One bad cell among thousands of clean rows: the block goes the careful way, which names it."""
    lines = _clean_lines(5000)
    lines[3217] = lines[3217].replace(" W,", "x W,")
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + "\n" + "\n".join(lines) + "\n")
    monkeypatch.setattr(parse, "DIRECT", True)
    with pytest.raises(RecordingError, match=r"bad\.csv:3219:3: power\.draw: '[0-9.]+x W' is not a number"):
        list(NvsmiCsvReader(path).chunks())


def test_a_layout_that_starts_with_the_index_goes_direct_too(tmp_path: Path) -> None:
    """``--query-gpu=index,power.draw,...``: the first cell of a block ends within its first 8 bytes
    (the word before it starts before the block) and has no leading space; still decoded directly."""
    body = "".join(f"{i % 8}, {i * 1.25:.2f} W, {i % 101} %\n" for i in range(100))
    path = tmp_path / "ix.csv"
    path.write_text("index, power.draw [W], utilization.gpu [%]\n" + body)
    found = read_header(path, None)
    columns = parse_direct(np.frombuffer(body.encode(), dtype=np.uint8), body.encode(), 100, found.layout)
    assert columns is not None and columns.index is not None
    assert columns.index.tolist() == [i % 8 for i in range(100)]
    assert columns.values["power_w"].tolist() == [float(f"{i * 1.25:.2f}") for i in range(100)]
