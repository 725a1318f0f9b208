"""What the progress integrations cost a training loop: ``progress.step()`` per optimizer step (the
rate-limited path, almost every call), one phase write (JSON + temp file + rename, on a tmpfs like
``/run``), and the flusher thread's CPU while the loop runs. Baselines: a bare ``time.time()`` call and
the same loop without a flusher. A training step is 10 ms or more: a step call under 10 us is under
0.1 % of it."""

from __future__ import annotations

import os
import resource
import tempfile
import time
from pathlib import Path

from benchmarks.common import header, line
from gpu_triage.integrations import Progress

STEP_BUDGET_US = 10.0
WRITE_BUDGET_US = 1000.0
FLUSHER_BUDGET_PCT = 0.5


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(quick: bool = False) -> None:
    header("integrations: the cost of reporting progress")
    shm = Path("/dev/shm")
    n = 20_000 if quick else 200_000
    with tempfile.TemporaryDirectory(prefix="gpu-triage-bench-", dir=shm if shm.is_dir() else None) as tmp:
        env = {"RANK": "0", "WORLD_SIZE": "1"}
        progress = Progress.from_env("bench", env=env, directory=tmp, flusher=False)
        progress.train()

        t0 = time.perf_counter()
        for _ in range(n):
            time.time()
        base_us = (time.perf_counter() - t0) / n * 1e6

        t0 = time.perf_counter()
        for i in range(n):
            progress.step(i, epoch=0, tokens=i * 4096)
        step_us = (time.perf_counter() - t0) / n * 1e6
        line(
            "progress.step() per call",
            step_us,
            "us",
            baseline=base_us,
            baseline_name="time.time()",
            budget=f"< {STEP_BUDGET_US:.0f} us",
            higher_is_better=False,
            ok=step_us < STEP_BUDGET_US,
        )

        writes = 200 if quick else 2000
        t0 = time.perf_counter()
        for _ in range(writes):
            progress.writer.phase("eval", lease_s=60.0)
        write_us = (time.perf_counter() - t0) / writes * 1e6
        line(
            f"one phase write ({'tmpfs' if shm.is_dir() else 'tmp'})",
            write_us,
            "us",
            budget=f"< {WRITE_BUDGET_US:.0f} us",
            higher_is_better=False,
            ok=write_us < WRITE_BUDGET_US,
        )
        progress.close()

        seconds = 2.0 if quick else 10.0
        usage = {}
        for with_flusher in (False, True):
            p = Progress.from_env("bench", env=env, directory=tmp, flusher=with_flusher)
            p.train()
            cpu0, t0, i = _cpu_s(), time.monotonic(), 0
            while time.monotonic() - t0 < seconds:  # a loop stepping every 10 ms
                i += 1
                p.step(i)
                time.sleep(0.01)
            usage[with_flusher] = (_cpu_s() - cpu0) / (time.monotonic() - t0) * 100
            p.close()
        extra = usage[True] - usage[False]  # may read below 0: noise of a shared machine
        line(
            "flusher thread, extra CPU (% of one core)",
            extra,
            "%",
            baseline=usage[False],
            baseline_name="the loop alone",
            budget=f"< {FLUSHER_BUDGET_PCT} %",
            higher_is_better=False,
            ok=extra < FLUSHER_BUDGET_PCT,
        )
    print(f"  (pid {os.getpid()}; n={n})")
