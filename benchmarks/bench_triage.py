"""Triage throughput against the way people script this today, and triage's peak memory.

Numbers on the same 4.8 M-row recording (8 GPUs at 10 Hz, units in the cells, like the H100
traces), all in this process, best of three:

* bytes only: reading the file's bytes and nothing else - the floor;
* triage: ``triage_file`` as shipped (with two CPUs or more: the next chunk read on a thread through
  ``pyarrow.csv`` while the last is classified - vectorised classification with hysteresis,
  accounting and the deadlock rule) - budget (issue 30) at least 5,000,000 rows/s and at least 10x
  the baseline; beside it the same on one thread (``engine.READ_AHEAD = False``) and with the direct
  decoder first (``parse.DIRECT = True``: numpy on the bytes, what triage uses on one CPU), and the
  direct decoder's rows per CPU second against Arrow's (all threads; what a loaded machine changes
  least);
* baseline: ``pandas.read_csv`` plus a per-row Python loop applying the same bands with a simple
  "N seconds in the band" rule - what a script written for an incident usually is.

Then triage's peak resident memory on a ~2 GB recording, in a fresh process (budget 512 MB).
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.bench_reader import DATA, read_bytes, recording
from benchmarks.common import best_of, header, line
from benchmarks.gen_recording import generate
from gpu_triage.recordings import parse
from gpu_triage.triage import engine
from gpu_triage.triage.engine import TriageOptions, triage_file

ROWS = 4_800_000
QUICK_ROWS = 300_000
BIG_BYTES = 2 << 30
QUICK_BIG_BYTES = 256 << 20
BYTES_PER_ROW = 48  # '2025/07/27 00:34:45.155, 548.21 W, 92 %, 61440 MiB\n'
OPTS = TriageOptions(model="H100", gpus=8, power_limit_w=700.0)

_PEAK_SCRIPT = """
import sys
from gpu_triage.triage import engine
from gpu_triage.triage.engine import TriageOptions, triage_file
r = triage_file(sys.argv[1], TriageOptions(model="H100", gpus=8, power_limit_w=700.0))
with open("/proc/self/status") as status:
    peak_kb = next(int(row.split()[1]) for row in status if row.startswith("VmHWM:"))
print(r.samples, peak_kb / 1024)
"""


def _classify_row(gpu: int, p: float, u: float, spin_since: dict[int, int], i: int) -> str:
    frac = p / 700.0
    if frac >= 0.40:
        state = "compute"
    elif u >= 90 and frac < 0.30:
        state = "checkpoint_or_deadlock"
    elif u < 10:
        state = "idle"
    else:
        state = "data_starvation"
    if state == "checkpoint_or_deadlock":
        spin_since.setdefault(gpu, i)
    else:
        spin_since.pop(gpu, None)
    return state


def _frame(path: Path):
    import pandas as pd

    df = pd.read_csv(path, skipinitialspace=True)
    df.columns = ["timestamp", "power", "util", "mem"]
    df["power"] = df["power"].astype(str).str.replace(" W", "", regex=False).astype(float)
    df["util"] = df["util"].astype(str).str.replace(" %", "", regex=False).astype(float)
    return df


def baseline_typical(path: Path) -> int:
    """pandas.read_csv + ``itertuples`` + a function per row: how incident scripts are usually written."""
    df = _frame(path)
    spin_since: dict[int, int] = {}
    states = [
        _classify_row(i % 8, row.power, row.util, spin_since, i) for i, row in enumerate(df.itertuples())
    ]
    return len(states)


def baseline(path: Path) -> int:
    """The same, hand-optimised: plain lists and the rule inlined (the fastest pure-Python loop)."""
    df = _frame(path)
    power, util = df["power"], df["util"]
    spin_since: dict[int, int] = {}
    states = []
    for i, (p, u) in enumerate(zip(power.tolist(), util.tolist(), strict=True)):
        gpu = i % 8
        frac = p / 700.0
        if frac >= 0.40:
            state = "compute"
        elif u >= 90 and frac < 0.30:
            state = "checkpoint_or_deadlock"
        elif u < 10:
            state = "idle"
        else:
            state = "data_starvation"
        if state == "checkpoint_or_deadlock":
            spin_since.setdefault(gpu, i)
        else:
            spin_since.pop(gpu, None)
        states.append(state)
    return len(states)


#: (name, engine.READ_AHEAD, parse.DIRECT) of each variant timed; None: triage's own choice by the
#: CPUs it may use (read-ahead and Arrow with two or more, parse.direct_first).
_VARIANTS = (
    ("triage", None, None),
    ("one thread", False, None),
    ("direct", True, True),
    ("arrow", True, False),
)


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (this process, every thread) of one call of ``fn``."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    fn()
    wall_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    return wall_s, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def peak_memory(path: Path) -> tuple[int, float]:
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(path)], check=True, capture_output=True, text=True
    ).stdout.split()
    return int(out[0]), float(out[1])


def run(quick: bool = False) -> None:
    rows = QUICK_ROWS if quick else ROWS
    path = recording(rows)
    size_mb = path.stat().st_size / 2**20
    header(f"triage throughput: {path.name} ({rows:,} rows, {size_mb:.0f} MB)")
    t_bytes = best_of(lambda: read_bytes(path))
    # interleaved (one thread, read-ahead, previous parser, ...): a neighbour's load hits all alike
    took: dict[str, list[float]] = {name: [] for name, _, _ in _VARIANTS}
    cpu: dict[str, list[float]] = {name: [] for name in took}
    for _ in range(3):
        for name, read_ahead, direct in _VARIANTS:
            engine.READ_AHEAD, parse.DIRECT = read_ahead, direct
            wall_s, cpu_s = _timed(lambda: triage_file(path, OPTS))
            took[name].append(wall_s)
            cpu[name].append(cpu_s)
    engine.READ_AHEAD, parse.DIRECT = None, None
    t_triage, t_one_thread, t_direct = min(took["triage"]), min(took["one thread"]), min(took["direct"])
    cpus, first = parse.usable_cpus(), "direct decoder" if parse.direct_first() else "Arrow"
    print(
        f"  (this process may use {cpus} CPUs: triage reads ahead: {cpus >= 2}; decodes with {first} first)"
    )
    base_rows = min(rows, 1_000_000)
    base_path = recording(base_rows)
    t0 = time.perf_counter()
    baseline_typical(base_path)
    typical_rate = base_rows / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    baseline(base_path)
    fast_rate = base_rows / (time.perf_counter() - t0)
    triage_rate = rows / t_triage
    line("bytes only (the floor)", rows / t_bytes, "rows/s")
    line(
        "triage",
        triage_rate,
        "rows/s",
        baseline=typical_rate,
        baseline_name="pandas+itertuples",
        budget=">= 5,000,000 rows/s and >= 10x baseline",
        ok=triage_rate >= 5e6 and triage_rate >= 10 * typical_rate,
    )
    line(
        "triage vs the same on one thread (before)",
        triage_rate,
        "rows/s",
        baseline=rows / t_one_thread,
        baseline_name="one thread",
    )
    line(
        "triage vs the direct decoder first",
        triage_rate,
        "rows/s",
        baseline=rows / t_direct,
        baseline_name="parse.DIRECT=True",
    )
    # CPU seconds over all threads: what a loaded machine changes least
    line(
        "direct decoder rows per CPU second (all threads)",
        rows / min(cpu["direct"]),
        "rows/s",
        baseline=rows / min(cpu["arrow"]),
        baseline_name="pyarrow.csv",
    )
    line(
        "triage vs a hand-optimised loop",
        triage_rate,
        "rows/s",
        baseline=fast_rate,
        baseline_name="pandas+lists",
    )
    line("triage time / bytes-only time", t_triage / t_bytes, "x", higher_is_better=False)

    big_bytes = QUICK_BIG_BYTES if quick else BIG_BYTES
    big_rows = big_bytes // BYTES_PER_ROW // 8 * 8
    big = DATA / f"nvsmi-h100-{big_rows}.csv"
    if not big.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        print(f"  (generating {big.name}, ~{big_bytes / 2**30:.1f} GB, once)", flush=True)
        generate(big.with_suffix(".partial"), big_rows, gpus=8, units_in_cells=True, seed=1)
        big.with_suffix(".partial").replace(big)
    header(f"triage peak memory: {big.name} ({big.stat().st_size / 2**30:.2f} GB)")
    t0 = time.perf_counter()
    samples, peak_mb = peak_memory(big)
    took = time.perf_counter() - t0
    line("peak resident memory (whole process)", peak_mb, "MB", budget="<= 512 MB", ok=peak_mb <= 512)
    line("rows/s on the big file (fresh process)", samples / took, "rows/s")


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
