"""The nvidia-smi CSV reader on the real traces, on generated variants, and under hypothesis.

Every recording here is either one of ``../shared/traces`` or written into ``tmp_path`` by the test.
"""

from __future__ import annotations

import calendar
import math
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpu_triage.recordings import (
    Chunk,
    NvsmiCsvReader,
    RecordingError,
    RecordingWarning,
    concat_chunks,
    gpu_model_name,
    read_recording,
)
from gpu_triage.recordings.gpu_count import period_from_gaps, period_from_values
from gpu_triage.recordings.nvsmi_csv import VALUE_FIELDS
from tests.conftest import require_traces

MIB = float(1 << 20)
HEADER = "timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]"
TRACE_GPUS = {
    "h100-8gpu-ckpt100.csv": 8,
    "h100-8gpu-ckpt1000.csv": 8,
    "titanx-2gpu-a.csv": 2,
    "titanx-2gpu-b.csv": 2,
    "titanx-2gpu-burn.csv": 2,
}
ARRAYS = ("gpu", "time_s", "line", *VALUE_FIELDS)


def epoch(text: str) -> float:
    """Reference conversion of an nvidia-smi timestamp (naive = UTC) with the standard library."""
    fmt = "%Y/%m/%d %H:%M:%S.%f" if "." in text else "%Y/%m/%d %H:%M:%S"
    moment = datetime.strptime(text.replace("-", "/"), fmt)
    return calendar.timegm(moment.timetuple()) + moment.microsecond / 1e6


def write(tmp_path: Path, text: str, name: str = "rec.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def stamp(epoch_ms: int) -> str:
    """nvidia-smi's timestamp text for an epoch time in milliseconds (UTC)."""
    seconds, ms = divmod(epoch_ms, 1000)
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y/%m/%d %H:%M:%S") + f".{ms:03d}"


def snapshot_lines(snapshots: int, gpus: int, *, units: bool = True) -> list[str]:
    """Rows like the H100 traces, a snapshot every 100 ms with its rows 2 ms apart: GPU g of snapshot
    s draws 100 + 10 s + g W at (s + g) % 101 % and uses 17 + g MiB."""
    start_ms = int(epoch("2025/07/27 00:34:45") * 1000)
    w, pct, mib = (" W", " %", " MiB") if units else ("", "", "")
    return [
        f"{stamp(start_ms + 100 * s + 2 * g)}, {100 + 10 * s + g:.2f}{w}, {(s + g) % 101}{pct}, {17 + g}{mib}"
        for s in range(snapshots)
        for g in range(gpus)
    ]


def same(a: Chunk, b: Chunk) -> None:
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


# ----------------------------------------------------------------------------- real traces
@pytest.fixture(scope="module")
def traces() -> dict[str, tuple]:
    folder = require_traces()
    return {name: read_recording(folder / name) for name in TRACE_GPUS}


@pytest.mark.parametrize("name", sorted(TRACE_GPUS))
def test_real_trace_reads_with_inferred_gpu_count(traces: dict, name: str) -> None:
    header, chunk = traces[name]
    path = require_traces() / name
    data_lines = [line for line in path.read_text().splitlines()[1:] if line.strip()]
    assert header.gpus == TRACE_GPUS[name]
    assert header.gpus_from == "timestamps"
    assert not header.has_index and header.gpu_names is None and header.power_limit_w is None
    assert header.columns == ("timestamp", "power.draw", "utilization.gpu", "memory.used")
    assert len(chunk) == len(data_lines)
    np.testing.assert_array_equal(chunk.gpu, np.arange(len(chunk)) % header.gpus)
    np.testing.assert_array_equal(chunk.line, np.arange(2, len(chunk) + 2))
    limit_w = 700.0 if name.startswith("h100") else 250.0
    assert np.all((chunk.power_w > 5) & (chunk.power_w < limit_w * 1.1))
    assert np.all((chunk.utilization_ratio >= 0) & (chunk.utilization_ratio <= 1))
    assert np.all((chunk.memory_used_bytes >= 0) & (chunk.memory_used_bytes < 96 * 2**30))
    assert np.all(np.isnan(chunk.power_limit_w)) and np.all(np.isnan(chunk.temperature_c))
    duration_s = chunk.time_s[-1] - chunk.time_s[0]
    assert 300 < duration_s < 900
    assert np.all(np.diff(chunk.time_s) >= 0)  # nvidia-smi logs in time order
    # The last data line, converted independently.
    stamp, power, util, memory = (field.strip() for field in data_lines[-1].split(","))
    assert chunk.time_s[-1] == pytest.approx(epoch(stamp), abs=1e-6)
    assert chunk.power_w[-1] == float(power.removesuffix(" W"))
    assert chunk.utilization_ratio[-1] == int(util.removesuffix(" %")) / 100
    assert chunk.memory_used_bytes[-1] == int(memory.removesuffix(" MiB")) * MIB


def test_real_trace_known_cells(traces: dict) -> None:
    _, h100 = traces["h100-8gpu-ckpt100.csv"]
    assert (h100.power_w[0], h100.utilization_ratio[0], h100.memory_used_bytes[0]) == (72.36, 0.0, 131 * MIB)
    assert h100.time_s[0] == pytest.approx(epoch("2025/07/27 00:34:45.155"), abs=1e-6)
    assert h100.power_w.max() == pytest.approx(590.99)
    # titanx-2gpu-b writes bare power but '0 %' and '1 MiB' in the cells.
    _, titan = traces["titanx-2gpu-b.csv"]
    assert (titan.power_w[0], titan.utilization_ratio[0], titan.memory_used_bytes[0]) == (17.65, 0.0, MIB)
    _, titan_a = traces["titanx-2gpu-a.csv"]
    assert titan_a.power_w[:2].tolist() == [18.14, 16.49]


def test_real_trace_in_tiny_chunks_gives_the_same_arrays(traces: dict) -> None:
    path = require_traces() / "titanx-2gpu-a.csv"
    offsets: list[int] = []
    reader = NvsmiCsvReader(path, chunk_bytes=4096)
    chunks = list(reader.chunks(progress=offsets.append))
    assert len(chunks) > 50
    same(concat_chunks(chunks), traces["titanx-2gpu-a.csv"][1])
    assert offsets == sorted(offsets) and offsets[-1] == path.stat().st_size == reader.header.size_bytes


def test_gpu_count_from_repeated_power_readings_matches_traces(traces: dict) -> None:
    for name, gpus in TRACE_GPUS.items():
        chunk = traces[name][1]
        assert period_from_gaps(chunk.time_s[:5000]) == gpus
        assert period_from_values(chunk.power_w[:5000]) == gpus


def test_trace_without_timestamps_infers_from_readings(tmp_path: Path) -> None:
    source = require_traces() / "titanx-2gpu-a.csv"
    lines = source.read_text().splitlines()[:4001]
    text = "\n".join(line.split(", ", 1)[1] for line in lines) + "\n"
    reader = NvsmiCsvReader(write(tmp_path, text), interval_s=0.1)
    assert reader.header.gpus == 2 and reader.header.gpus_from == "values"
    assert not reader.header.has_timestamp
    assert any("no timestamp column" in w for w in reader.warnings)
    chunk = reader.read_all()
    np.testing.assert_allclose(chunk.time_s[:6], [0, 0, 0.1, 0.1, 0.2, 0.2])


# ----------------------------------------------------------------------------- generated variants
def test_index_column_assigns_gpus_whatever_the_order(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "timestamp, index, power.draw [W]",
            "2025/07/27 00:00:00.000, 2, 300.00 W",
            "2025/07/27 00:00:00.001, 0, 100.00 W",
            "2025/07/27 00:00:00.002, 1, 200.00 W",
            "2025/07/27 00:00:01.000, 1, 201.00 W",
            "2025/07/27 00:00:01.001, 2, 301.00 W",
            "2025/07/27 00:00:01.002, 0, 101.00 W",
        ]
    )
    header, chunk = read_recording(write(tmp_path, text + "\n"))
    assert header.has_index and header.gpus == 3 and header.gpus_from == "index"
    assert chunk.gpu.tolist() == [2, 0, 1, 1, 2, 0]
    assert chunk.power_w.tolist() == [300, 100, 200, 201, 301, 101]
    with pytest.raises(RecordingError) as error:
        read_recording(write(tmp_path, text + "\n"), gpus=2)
    assert (error.value.line, error.value.column) == (2, 2)


def test_nounits_and_units_in_header_or_cells_give_the_same_values(tmp_path: Path) -> None:
    rows = snapshot_lines(12, 2)
    with_units = read_recording(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n", "a.csv"), gpus=2)[1]
    bare = snapshot_lines(12, 2, units=False)
    nounits = read_recording(write(tmp_path, HEADER + "\n" + "\n".join(bare) + "\n", "b.csv"), gpus=2)[1]
    plain_header = "timestamp, power.draw, utilization.gpu, memory.used"
    plain = read_recording(write(tmp_path, plain_header + "\n" + "\n".join(rows) + "\n", "c.csv"), gpus=2)[1]
    same(with_units, nounits)
    same(with_units, plain)
    assert with_units.utilization_ratio[3] == 2 / 100  # snapshot 1, GPU 1
    assert with_units.memory_used_bytes[1] == 18 * MIB


def test_noheader_needs_columns(tmp_path: Path) -> None:
    rows = snapshot_lines(3, 2)
    path = write(tmp_path, "\n".join(rows) + "\n")
    with pytest.raises(RecordingError, match="no header line") as error:
        NvsmiCsvReader(path, gpus=2)
    assert (error.value.line, error.value.column) == (1, 1)
    columns = ["timestamp", "power.draw [W]", "utilization.gpu [%]", "memory.used [MiB]"]
    header, chunk = read_recording(path, gpus=2, columns=columns)
    assert len(chunk) == 6 and chunk.line[0] == 1 and chunk.power_w[5] == 121.0
    assert header.columns == ("timestamp", "power.draw", "utilization.gpu", "memory.used")
    with pytest.raises(ValueError):
        NvsmiCsvReader(path, gpus=2, columns=["timestamp", "72 W"])


@pytest.mark.parametrize("token", ["[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", "[GPU is lost]", ""])
def test_missing_value_markers_become_nan(tmp_path: Path, token: str) -> None:
    text = (
        f"{HEADER}\n2025/07/27 00:00:00.000, {token}, {token}, 5 MiB\n"
        f"2025/07/27 00:00:00.100, 7.5 W, 3 %, {token}\n"
    )
    _, chunk = read_recording(write(tmp_path, text), gpus=1)
    assert math.isnan(chunk.power_w[0]) and math.isnan(chunk.utilization_ratio[0])
    assert chunk.memory_used_bytes[0] == 5 * MIB
    assert (chunk.power_w[1], chunk.utilization_ratio[1]) == (7.5, 0.03) and math.isnan(
        chunk.memory_used_bytes[1]
    )


def test_blank_lines_are_skipped_and_lines_stay_exact(tmp_path: Path) -> None:
    rows = snapshot_lines(3, 2)
    text = (
        "\n\n"
        + HEADER
        + "\n\n"
        + rows[0]
        + "\n   \n"
        + "\n".join(rows[1:4])
        + "\n\r\n\t\n"
        + "\n".join(rows[4:])
        + "\n\n"
    )
    _, chunk = read_recording(write(tmp_path, text), gpus=2)
    assert chunk.line.tolist() == [5, 7, 8, 9, 12, 13]
    assert chunk.gpu.tolist() == [0, 1, 0, 1, 0, 1]
    for chunk_bytes in (1, 17, 64):
        same(read_recording(write(tmp_path, text), gpus=2, chunk_bytes=chunk_bytes)[1], chunk)


@pytest.mark.parametrize(
    ("cut", "why"),
    [
        ("2025/07/27 00:00:00.300, 130.00 W, 3", "fewer fields"),
        ("2025/07/27 00:00:00.300, 130.00 W, 3 %, 17 Mi", "cut unit"),
        ("2025/07/27 00:00:00.300, 130.00 W, 3 %, ", "cut before the value"),
        ("2025/07/27 00:0", "cut timestamp"),
    ],
)
def test_truncated_last_line_is_a_warning(tmp_path: Path, cut: str, why: str) -> None:
    rows = snapshot_lines(3, 1)
    path = write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n" + cut)
    for chunk_bytes in (7, 1 << 20):
        reader = NvsmiCsvReader(path, gpus=1, chunk_bytes=chunk_bytes)
        chunk = reader.read_all()
        assert len(chunk) == 3, why
        assert len(reader.warnings) == 1 and reader.warnings[0].startswith(
            f"{path}:5: skipped the truncated last line"
        )
    with pytest.warns(RecordingWarning, match="truncated"):
        read_recording(path, gpus=1)


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    rows = snapshot_lines(3, 1)
    reader = NvsmiCsvReader(write(tmp_path, HEADER + "\n" + "\n".join(rows)), gpus=1)
    assert len(reader.read_all()) == 3 and reader.warnings == []


def test_malformed_last_line_with_newline_is_an_error(tmp_path: Path) -> None:
    rows = snapshot_lines(3, 1)
    path = write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n2025/07/27 00:00:00.300, 130.00 W, 3\n")
    with pytest.raises(RecordingError) as error:
        read_recording(path, gpus=1)
    assert (error.value.line, error.value.column) == (5, 4)
    assert "expected 4 fields" in error.value.message


def test_crlf_line_endings(tmp_path: Path) -> None:
    rows = snapshot_lines(4, 2)
    unix = read_recording(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n", "u.csv"), gpus=2)[1]
    dos = read_recording(write(tmp_path, HEADER + "\r\n" + "\r\n".join(rows) + "\r\n", "d.csv"), gpus=2)[1]
    same(unix, dos)


@pytest.mark.parametrize("chunk_bytes", [1, 2, 23, 64, 97, 500, 4096])
def test_chunk_boundaries_do_not_change_anything(tmp_path: Path, chunk_bytes: int) -> None:
    rows = snapshot_lines(20, 3)
    rows.insert(7, "")
    path = write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n")
    whole = read_recording(path, gpus=3)[1]
    chunks = list(NvsmiCsvReader(path, gpus=3, chunk_bytes=chunk_bytes).chunks())
    assert all(len(c) for c in chunks)
    same(concat_chunks(chunks), whole)
    assert whole.gpu.tolist() == [i % 3 for i in range(60)]


@pytest.mark.parametrize(
    ("line", "column", "bad", "message"),
    [
        (4, 2, "2025/07/27 00:00:00.200, 7x.5 W, 3 %, 17 MiB", "power.draw: '7x.5 W' is not a number in W"),
        (5, 2, "2025/07/27 00:00:00.300, 72.5 V, 3 %, 17 MiB", "is not a number in W"),
        (4, 4, "2025/07/27 00:00:00.200, 72.5 W, 3 %", "expected 4 fields"),
        (5, 5, "2025/07/27 00:00:00.300, 72.5 W, 3 %, 17 MiB, 9", "expected 4 fields"),
        (4, 1, "2025/13/27 00:00:00.200, 72.5 W, 3 %, 17 MiB", "timestamp: '2025/13/27 00:00:00.200'"),
        (5, 1, "2025/02/30 00:00:00.300, 72.5 W, 3 %, 17 MiB", "is not YYYY/MM/DD"),
        (4, 1, "yesterday, 72.5 W, 3 %, 17 MiB", "timestamp"),
        (5, 4, "2025/07/27 00:00:00.300, 72.5 W, 3 %, inf MiB", "not finite"),
        (4, 3, "2025/07/27 00:00:00.200, 72.5 W, 3\r %, 17 MiB", "stray carriage return"),
    ],
)
def test_malformed_line_in_the_middle_names_line_and_column(
    tmp_path: Path, line: int, column: int, bad: str, message: str
) -> None:
    rows = snapshot_lines(6, 1)
    rows[line - 2] = bad
    path = write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n")
    for chunk_bytes in (1 << 20, 50):
        with pytest.raises(RecordingError) as error:
            read_recording(path, gpus=1, chunk_bytes=chunk_bytes)
        assert (error.value.path, error.value.line, error.value.column) == (str(path), line, column)
        assert message in error.value.message
        assert str(error.value) == f"{path}:{line}:{column}: {error.value.message}"


def test_error_deep_in_a_big_file_names_its_line(tmp_path: Path) -> None:
    rows = snapshot_lines(2000, 8)
    rows[12_345] = rows[12_345].replace(" W,", " W W,")
    path = write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n")
    with pytest.raises(RecordingError) as error:
        list(NvsmiCsvReader(path, gpus=8, chunk_bytes=64 << 10).chunks())
    assert (error.value.line, error.value.column) == (12_347, 2)


def test_first_error_in_the_file_wins_across_columns(tmp_path: Path) -> None:
    rows = snapshot_lines(6, 1)
    rows[3] = rows[3].replace(" MiB", " MiBx")  # line 5, field 4
    rows[4] = rows[4].replace(" W", " Wx")  # line 6, field 2
    with pytest.raises(RecordingError) as error:
        read_recording(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n"), gpus=1)
    assert (error.value.line, error.value.column) == (5, 4)


def test_invalid_utf8_names_line_and_field(tmp_path: Path) -> None:
    rows = [r.encode() for r in snapshot_lines(4, 1)]
    rows[2] = rows[2].replace(b"2 %", b"2 \xff%")
    path = write(tmp_path, HEADER.encode() + b"\n" + b"\n".join(rows) + b"\n")
    with pytest.raises(RecordingError) as error:
        read_recording(path, gpus=1)
    assert (error.value.line, error.value.column, error.value.message) == (4, 3, "not UTF-8 text")


def test_power_draw_is_required(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, utilization.gpu [%]\n2025/07/27 00:00:00.000, 5 %\n")
    with pytest.raises(RecordingError, match=r"no power\.draw column") as error:
        NvsmiCsvReader(path, gpus=1)
    assert error.value.line == 1


def test_empty_and_header_only_files(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="empty"):
        NvsmiCsvReader(write(tmp_path, "", "e.csv"))
    with pytest.raises(RecordingError, match="no data rows"):
        NvsmiCsvReader(write(tmp_path, HEADER + "\n\n", "h.csv"), gpus=1)


def test_all_common_fields_units_and_header_facts(tmp_path: Path) -> None:
    header = (
        "\ufefftimestamp, index, name, pci.bus_id, uuid, power.draw.average [W], power.draw.instant [W], "
        "enforced.power.limit [W], power.limit [W], utilization.gpu [%], memory.used [MiB], "
        "memory.total [MiB], "
        "clocks.current.sm [MHz], temperature.gpu, fan.speed [%], pstate"
    )
    rows = []
    for s in range(3):
        for g in range(2):
            rows.append(
                f"2025-07-27 00:00:0{s}, {g}, NVIDIA H100 80GB HBM3, 00000000:{g:02d}:00.0, GPU-{g}, "
                f"{150 + s:.2f} W, 999.00 W, 700.00 W, 650.00 W, {s + g} %, {1000 + g} MiB, 81559 MiB, "
                f"1980 MHz, {40 + g}, [N/A], P0"
            )
    header_info, chunk = read_recording(write(tmp_path, header + "\n" + "\n".join(rows) + "\n"))
    assert header_info.gpus == 2 and header_info.has_index
    assert header_info.gpu_names == ("NVIDIA H100 80GB HBM3",) * 2
    assert gpu_model_name(header_info) == "NVIDIA H100 80GB HBM3"
    assert header_info.power_limit_w == 700.0  # enforced.power.limit wins over power.limit
    assert header_info.columns[5] == "power.draw.average" and header_info.columns[-1] == "pstate"
    assert chunk.power_w.tolist() == [150, 150, 151, 151, 152, 152]  # power.draw.average, not .instant
    assert chunk.utilization_ratio.tolist() == [0, 0.01, 0.01, 0.02, 0.02, 0.03]
    assert chunk.memory_total_bytes[0] == 81559 * MIB and chunk.memory_used_bytes[1] == 1001 * MIB
    assert chunk.sm_clock_mhz[0] == 1980 and chunk.temperature_c.tolist() == [40, 41] * 3
    assert chunk.time_s[2] - chunk.time_s[0] == 1.0 and chunk.time_s[0] == epoch("2025/07/27 00:00:00")


def test_uuid_names_gpus_without_index(tmp_path: Path) -> None:
    rows = []
    for s in range(4):
        for g in (0, 1, 2):
            rows.append(f"2025/07/27 00:00:0{s}.00{g}, GPU-{'abc'[g]}, {100 * g + s}.00 W")
    rows[4], rows[5] = rows[5], rows[4]  # snapshot 1 lists GPU-c before GPU-b
    header, chunk = read_recording(
        write(tmp_path, "timestamp, uuid, power.draw [W]\n" + "\n".join(rows) + "\n")
    )
    assert header.gpus == 3 and header.gpus_from == "uuid"
    assert chunk.gpu.tolist()[:6] == [0, 1, 2, 0, 2, 1]
    assert chunk.power_w[4] == 201.0


def test_gpu_count_that_cannot_be_inferred_asks_for_gpus(tmp_path: Path) -> None:
    rows = snapshot_lines(3, 4)
    with pytest.raises(RecordingError, match="--gpus"):
        NvsmiCsvReader(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n"))


def test_gpu_count_inferred_from_timestamp_gaps(tmp_path: Path) -> None:
    rows = snapshot_lines(40, 4)
    reader = NvsmiCsvReader(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n"))
    assert reader.header.gpus == 4 and reader.header.gpus_from == "timestamps"


def test_timestamp_variants(tmp_path: Path) -> None:
    stamps = [
        "2025/07/27 00:34:45.155",
        "2025-07-27 00:34:45.2",
        "2025/07/27 00:34:46",
        "2025/07/27T00:34:47.123456",
        "2024/02/29 23:59:59.999",
        "1999/12/31 23:59:60.000",
    ]
    text = "timestamp, power.draw\n" + "".join(f"{s}, 1\n" for s in stamps)
    _, chunk = read_recording(write(tmp_path, text), gpus=1)
    expected = [
        epoch(s.replace("T", " ")) if not s.endswith("60.000") else epoch("1999/12/31 23:59:59") + 1
        for s in stamps
    ]
    np.testing.assert_allclose(chunk.time_s, expected, rtol=0, atol=1e-6)


def test_repeated_header_is_skipped_with_a_warning(tmp_path: Path) -> None:
    rows = snapshot_lines(4, 1)
    text = HEADER + "\n" + "\n".join(rows[:2]) + "\n" + HEADER + "\n" + "\n".join(rows[2:]) + "\n"
    reader = NvsmiCsvReader(write(tmp_path, text), gpus=1)
    chunk = reader.read_all()
    assert chunk.line.tolist() == [2, 3, 5, 6]
    assert reader.warnings == [f"{reader.path}:4: skipped a repeated header line"]


def test_long_line_larger_than_the_chunk(tmp_path: Path) -> None:
    header = HEADER + ", " + ", ".join(f"extra{i}" for i in range(300))
    rows = [r + ", " + ", ".join("x" * 5 for _ in range(300)) for r in snapshot_lines(3, 1)]
    _, chunk = read_recording(write(tmp_path, header + "\n" + "\n".join(rows) + "\n"), gpus=1, chunk_bytes=10)
    assert chunk.power_w.tolist() == [100, 110, 120]


def test_absent_fields_are_read_only_nan(tmp_path: Path) -> None:
    with pytest.warns(RecordingWarning, match="no timestamp column"):
        _, chunk = read_recording(write(tmp_path, "power.draw\n5\n6\n7\n"), gpus=1)
    assert np.isnan(chunk.temperature_c).all() and not chunk.temperature_c.flags.writeable
    assert chunk.time_s.tolist() == [0.0, 1.0, 2.0]


# ----------------------------------------------------------------------------- hypothesis
UNIT_STYLES = ("cells", "header", "none", "both")


@st.composite
def recordings(draw: st.DrawFn) -> tuple[str, dict]:
    """A valid recording's text and the values it encodes."""
    gpus = draw(st.integers(1, 4))
    snapshots = draw(st.integers(1, 12))
    with_index = draw(st.booleans())
    style = {c: draw(st.sampled_from(UNIT_STYLES)) for c in ("power", "util", "memory")}
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    n = gpus * snapshots
    power_centi = draw(st.lists(st.integers(0, 99_999), min_size=n, max_size=n))
    util = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    memory = draw(st.lists(st.integers(0, 200_000), min_size=n, max_size=n))
    missing = draw(
        st.lists(st.sampled_from([None, None, None, "[N/A]", "[Not Supported]"]), min_size=n, max_size=n)
    )
    millis = np.cumsum(draw(st.lists(st.integers(0, 1500), min_size=n, max_size=n)))
    blank_after = draw(st.sets(st.integers(0, n - 1), max_size=3))

    def unit(kind: str, symbol: str, where: str) -> str:
        return f" {symbol}" if style[kind] in (where, "both") else ""

    header = ["timestamp", *(["index"] if with_index else [])]
    header += [
        f"power.draw{unit('power', '[W]', 'header')}",
        f"utilization.gpu{unit('util', '[%]', 'header')}",
    ]
    header += [f"memory.used{unit('memory', '[MiB]', 'header')}", "fan.speed [%]"]
    lines = [", ".join(header)]
    numbers = [1]
    base = epoch("2025/07/27 00:34:45")
    expected: dict[str, list] = {
        k: [] for k in ("gpu", "time_s", "power_w", "utilization_ratio", "memory_used_bytes", "line")
    }
    for i in range(n):
        gpu = i % gpus
        t_ms = int(millis[i])
        seconds, ms = divmod(t_ms, 1000)
        power = f"{power_centi[i] // 100}.{power_centi[i] % 100:02d}" + unit("power", "W", "cells")
        fields = [stamp(int(base) * 1000 + t_ms), *([str(gpu)] if with_index else []), missing[i] or power]
        fields += [
            f"{util[i]}{unit('util', '%', 'cells')}",
            f"{memory[i]}{unit('memory', 'MiB', 'cells')}",
            "[N/A]",
        ]
        lines.append(", ".join(fields))
        numbers.append(len(lines))
        expected["gpu"].append(gpu)
        expected["time_s"].append(base + seconds + ms / 1000)
        expected["power_w"].append(math.nan if missing[i] else power_centi[i] / 100)
        expected["utilization_ratio"].append(util[i] / 100)
        expected["memory_used_bytes"].append(memory[i] * MIB)
        expected["line"].append(len(lines))
        if i in blank_after:
            lines.append("")
    trailing = draw(st.booleans())
    text = newline.join(lines) + (newline if trailing else "")
    return text, {"gpus": gpus, **expected}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recording=recordings(), chunk_bytes=st.sampled_from([1, 13, 80, 1 << 20]))
def test_hypothesis_valid_recordings_round_trip(
    tmp_path: Path, recording: tuple[str, dict], chunk_bytes: int
) -> None:
    text, expected = recording
    reader = NvsmiCsvReader(write(tmp_path, text), gpus=expected["gpus"], chunk_bytes=chunk_bytes)
    chunk = reader.read_all()
    assert reader.warnings == []
    for name in ("gpu", "line", "power_w", "utilization_ratio", "memory_used_bytes"):
        np.testing.assert_array_equal(getattr(chunk, name), np.array(expected[name]), err_msg=name)
    np.testing.assert_allclose(chunk.time_s, expected["time_s"], rtol=0, atol=1e-6)


MUTATIONS = st.text(
    alphabet=st.characters(blacklist_characters="\n", codec="utf-8"), max_size=8
) | st.sampled_from(
    [
        "",
        ",",
        ", ,",
        "\r",
        "W",
        " %",
        "[N/A]",
        "nan",
        "inf",
        "1e999",
        "-",
        ".",
        "2025/13/01 00:00:00.000",
        "\x00",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recording=recordings(), data=st.data())
def test_hypothesis_malformed_line_is_named_exactly(
    tmp_path: Path, recording: tuple[str, dict], data: st.DataObject
) -> None:
    """Corrupt one data line: the reader either copes or names exactly that line."""
    text, expected = recording
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.split(newline)
    target = data.draw(st.sampled_from(expected["line"]), label="line")
    original = lines[target - 1]
    start = data.draw(st.integers(0, len(original)), label="start")
    stop = data.draw(st.integers(start, len(original)), label="stop")
    replacement = data.draw(MUTATIONS, label="replacement")
    lines[target - 1] = original[:start] + replacement + original[stop:]
    assume(lines[target - 1] != original)
    if not text.endswith(newline):
        lines.append("")  # keep a final newline: this test is not about truncation
    chunk_bytes = data.draw(st.sampled_from([7, 64, 1 << 20]), label="chunk_bytes")
    path = write(tmp_path, newline.join(lines))
    try:
        NvsmiCsvReader(path, gpus=expected["gpus"], chunk_bytes=chunk_bytes).read_all()
    except RecordingError as error:
        assert error.line == target, str(error)
        assert re.fullmatch(rf"{re.escape(str(path))}:{target}:\d+: .+", str(error), flags=re.S)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=300), header=st.booleans())
def test_hypothesis_random_bytes_never_crash(tmp_path: Path, blob: bytes, header: bool) -> None:
    raw = (HEADER.encode() + b"\n" if header else b"") + blob
    path = write(tmp_path, raw)
    lines = raw.count(b"\n") + 1
    try:
        NvsmiCsvReader(path, gpus=2, chunk_bytes=16).read_all()
    except RecordingError as error:
        assert 1 <= error.line <= lines


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recording=recordings(), data=st.data())
def test_hypothesis_cut_last_line_is_never_an_error(
    tmp_path: Path, recording: tuple[str, dict], data: st.DataObject
) -> None:
    """A logger killed mid-write leaves a prefix of its last line: kept or skipped, never an error."""
    text, expected = recording
    text = text.rstrip("\r\n")
    assume(len(expected["line"]) >= 2)  # cutting the only row leaves no data: a different error
    last_start = text.rfind("\n") + 1
    cut = data.draw(st.integers(last_start + 1, len(text)), label="cut")
    path = write(tmp_path, text[:cut])
    reader = NvsmiCsvReader(path, gpus=expected["gpus"], chunk_bytes=data.draw(st.sampled_from([5, 1 << 20])))
    chunk = reader.read_all()
    rows = len(expected["line"])
    truncated = any("truncated last line" in w for w in reader.warnings)
    survivors = rows - 1 if truncated else rows
    gpus, header = reader.header.gpus, reader.header
    positional = not header.has_index and not {"uuid", "pci.bus_id"} & set(header.columns)
    # ... and an incomplete last snapshot (rows are GPUs by position) is dropped with its warning
    incomplete = survivors % gpus if positional else 0
    assert len(chunk) == survivors - incomplete
    assert bool(incomplete) == any("the last snapshot has" in w for w in reader.warnings)
    np.testing.assert_array_equal(chunk.line, expected["line"][: len(chunk)])


def test_byte_order_mark_and_timestamp_not_first(tmp_path: Path) -> None:
    rows = ["0, 2025/07/27 00:00:00.000, 5.00 W", "0, 2025/07/27 00:00:01.000, 6.00 W"]
    bom = "\ufeff" + "\n".join(rows) + "\n"
    _, chunk = read_recording(write(tmp_path, bom), columns=["index", "timestamp", "power.draw"])
    assert chunk.power_w.tolist() == [5.0, 6.0] and chunk.time_s[1] - chunk.time_s[0] == 1.0
    header = "\ufeffindex, timestamp, power.draw [W]\n"
    _, same_chunk = read_recording(write(tmp_path, header + "\n".join(rows) + "\n", "h.csv"))
    np.testing.assert_array_equal(same_chunk.time_s, chunk.time_s)
    assert same_chunk.line.tolist() == [2, 3]


@settings(max_examples=60, deadline=None)
@given(
    moments=st.lists(
        st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2199, 12, 31)), min_size=1
    ),
    digits=st.integers(0, 6),
    mixed=st.booleans(),
    dash=st.booleans(),
)
def test_hypothesis_timestamps_match_the_standard_library(
    moments: list[datetime], digits: int, mixed: bool, dash: bool
) -> None:
    """Vectorised timestamp parsing (uniform-width and gather paths) against calendar.timegm."""
    import pyarrow as pa

    from gpu_triage.recordings.timestamps import parse_timestamps

    texts, expected = [], []
    for i, moment in enumerate(moments):
        places = (i % 4) + 1 if mixed else digits  # mixed widths take the gather path
        text = moment.strftime("%Y-%m-%d %H:%M:%S" if dash else "%Y/%m/%d %H:%M:%S")
        fraction = f"{moment.microsecond:06d}"[:places]
        texts.append(text + (f".{fraction}" if places else ""))
        expected.append(calendar.timegm(moment.timetuple()) + (int(fraction) / 10**places if places else 0))
    seconds, bad = parse_timestamps(pa.chunked_array([pa.array(texts)]))
    assert not bad.any()
    np.testing.assert_allclose(seconds, expected, rtol=0, atol=2e-6)
    broken = [*texts[:-1], texts[-1].replace(":", ";", 1)]
    assert parse_timestamps(pa.array(broken))[1].tolist() == [False] * (len(texts) - 1) + [True]


@pytest.mark.parametrize("units_in_cells", [True, False])
def test_benchmark_generator_writes_what_the_reader_reads(tmp_path: Path, units_in_cells: bool) -> None:
    from benchmarks.gen_recording import generate

    rows = 20_003  # the last snapshot cut short
    path = generate(tmp_path / "gen.csv", rows, gpus=8, units_in_cells=units_in_cells, seed=1)
    with pytest.warns(RecordingWarning, match="the last snapshot has 3 of 8 rows"):
        header, chunk = read_recording(path)  # ... and dropped (issue 28)
    assert header.gpus == 8 and header.gpus_from == "timestamps" and len(chunk) == rows - 3
    assert (" W," in path.read_text()[:500]) == units_in_cells
    compute = chunk.utilization_ratio >= 0.85
    spinning = (chunk.utilization_ratio == 1.0) & (chunk.power_w < 200)
    idle = chunk.utilization_ratio == 0
    assert compute.any() and spinning.any() and idle.any()
    assert 500 < np.median(chunk.power_w[compute]) < 600 and 140 < np.median(chunk.power_w[spinning]) < 170
    _, indexed = read_recording(generate(tmp_path / "idx.csv", 800, gpus=4, with_index=True))
    np.testing.assert_array_equal(indexed.gpu, np.arange(800) % 4)
