"""Throughput of the nvidia-smi CSV reader alone, beside the time merely to read the file's bytes.

The recording (``nvidia-smi --query-gpu=timestamp,power.draw,utilization.gpu,memory.used --format=csv
-lms 100`` on 8 GPUs, units in the cells, like the H100 traces; about 3 M rows, 150 MB) is generated
once under benchmarks/data/ (git-ignored) and reused. Three numbers:

* bytes only: reading the file in the reader's block size and doing nothing with it - the ceiling;
* reader: :class:`gpu_triage.recordings.NvsmiCsvReader` turning it into float arrays (budget: at least
  3,000,000 rows/s on the 2-core development machine, so that triage as a whole reaches 1,000,000),
  as wall time (best of 3) and as rows per CPU second over all its threads - the latter barely moves
  when other jobs share the cores, the former can halve - each beside the previous parser
  (``parse.DIRECT = False``: every block through ``pyarrow.csv``);
* peak memory: the reader's maximum resident set above the interpreter with its imports, measured in
  a fresh process (the budget for the whole triage of a 2 GB file is 512 MB; the reader's share should
  stay under ~200 MB, and does not grow with the file).
"""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import best_of, header, line
from benchmarks.gen_recording import generate
from gpu_triage.recordings import parse
from gpu_triage.recordings.nvsmi_csv import DEFAULT_CHUNK_BYTES, NvsmiCsvReader

DATA = Path(__file__).resolve().parent / "data"
ROWS = 3_000_000
QUICK_ROWS = 300_000
READER_BUDGET_ROWS_S = 3_000_000
MEMORY_BUDGET_MB = 200

_PEAK_SCRIPT = """
import sys
from gpu_triage.recordings.nvsmi_csv import NvsmiCsvReader

def high_water_kb():
    # VmHWM belongs to this process's address space; ru_maxrss would carry the parent's peak over exec.
    with open("/proc/self/status") as status:
        return next(int(row.split()[1]) for row in status if row.startswith("VmHWM:"))

base = high_water_kb()
for chunk in NvsmiCsvReader(sys.argv[1]).chunks():
    pass
print((high_water_kb() - base) / 1024)
"""


def recording(rows: int) -> Path:
    """The benchmark recording with ``rows`` rows (generated on first use)."""
    path = DATA / f"nvsmi-h100-{rows}.csv"
    if not path.exists() or path.stat().st_size == 0:
        DATA.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        generate(partial, rows, gpus=8, units_in_cells=True, seed=0)
        partial.replace(path)
    return path


def read_bytes(path: Path, block: int = DEFAULT_CHUNK_BYTES) -> int:
    """Read the file in ``block``-sized pieces into one reused buffer; return the byte count."""
    buffer = bytearray(block)
    total = 0
    with path.open("rb", buffering=0) as f, memoryview(buffer) as view:
        while got := f.readinto(view):
            total += got
    return total


def read_rows(path: Path) -> int:
    return sum(len(chunk) for chunk in NvsmiCsvReader(path).chunks())


def cpu_seconds(fn: Callable[[], object]) -> float:
    """User + system CPU time of this process (every thread) spent in ``fn``."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    fn()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def peak_memory_mb(path: Path) -> float:
    """The reader's peak RSS above its imports, in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(path)], check=True, capture_output=True, text=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def run(quick: bool = False) -> None:
    rows = QUICK_ROWS if quick else ROWS
    header(f"nvidia-smi CSV reader ({rows:,} rows, 8 GPUs, units in cells)")
    path = recording(rows)
    size_mb = path.stat().st_size / 1e6
    repeat = 1 if quick else 3
    assert read_rows(path) == rows  # also warms the page cache and Arrow's thread pool
    bytes_s = best_of(lambda: read_bytes(path), repeat)
    reader_s = arrow_s = float("inf")
    for _ in range(repeat):  # interleaved: a neighbour's load hits both alike
        for direct in (True, False):
            parse.DIRECT = direct
            took = best_of(lambda: read_rows(path), 1)
            reader_s, arrow_s = (min(reader_s, took), arrow_s) if direct else (reader_s, min(arrow_s, took))
    parse.DIRECT = None  # triage's own choice again (parse.direct_first)
    line("bytes only (read in blocks)", size_mb / bytes_s, "MB/s")
    line("reader", size_mb / reader_s, "MB/s", baseline=size_mb / bytes_s, baseline_name="bytes only")
    rate = rows / reader_s
    line(
        "reader rows/s",
        rate,
        "rows/s",
        baseline=rows / bytes_s,
        baseline_name="bytes only",
        budget=f">= {READER_BUDGET_ROWS_S:,} rows/s",
        ok=rate >= READER_BUDGET_ROWS_S,
    )
    line(
        "reader vs the previous parser (pyarrow.csv)",
        rate,
        "rows/s",
        baseline=rows / arrow_s,
        baseline_name="parse.DIRECT=False",
    )
    line("reader time vs bytes-only time", reader_s / bytes_s, "x", higher_is_better=False)
    # CPU time over all threads: less sensitive than wall time to neighbours sharing the cores.
    cpu_s = min(cpu_seconds(lambda: read_rows(path)) for _ in range(repeat))
    parse.DIRECT = False
    arrow_cpu_s = min(cpu_seconds(lambda: read_rows(path)) for _ in range(repeat))
    parse.DIRECT = None  # triage's own choice again (parse.direct_first)
    line(
        "reader rows per CPU second (all threads)",
        rows / cpu_s,
        "rows/s",
        baseline=rows / arrow_cpu_s,
        baseline_name="previous parser",
    )
    peak = peak_memory_mb(path)
    line(
        "reader peak RSS above imports",
        peak,
        "MB",
        budget=f"<= {MEMORY_BUDGET_MB} MB",
        ok=peak <= MEMORY_BUDGET_MB,
        higher_is_better=False,
    )


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
