"""Cycle time with 10,000 hostile files in the progress directory, beside the quiet baseline.

The real daemon cycle (reader, inspector, fusion, detector, event store; no HTTP) on an explicit clock,
one cycle per simulated second, with one real job (2 rank processes, progress files advancing). The
hostile node adds, owned by another user (``nobody`` when run as root): 250 job directories x 40
well-formed rank files that name a process that is no rank (every claim is refused), and 100
directories whose names are not valid UTF-8 or hold a newline / ESC. Measured per case: the first
(cold) cycle and the median and p99 of the steady cycles that follow. What an attacker writes is
read at most up to its owner's caps (``progress.MAX_*_PER_OWNER``), and fusion is linear in claims
(issue 18 item 4: ~20 s a cycle before, with 1,024 x 40 files).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import header, line

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
HOSTILE_DIRS = 250
FILES_PER_DIR = 40
BAD_NAMES = 100


def _record(job: str, rank: int, pid: int, now: float, world: int) -> bytes:
    return (
        f'{{"job": "{job}", "rank": {rank}, "local_rank": {rank}, "world_size": {world}, "pid": {pid}, '
        f'"host": "{socket.gethostname()}", "step": 1, "epoch": 0, "tokens": 0, "phase": "train", '
        f'"lease_until": null, "time": {now}}}'
    ).encode()


def _attacker() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    nobody = pwd.getpwnam("nobody")
    return nobody.pw_uid, nobody.pw_gid


def _fill(progress: Path, decoy_pid: int, now: float) -> int:
    owner = _attacker()
    count = 0
    for i in range(HOSTILE_DIRS):
        d = progress / f"h{i:04d}"
        d.mkdir()
        for r in range(FILES_PER_DIR):
            p = d / f"rank-{r}.json"
            p.write_bytes(_record(d.name, r, decoy_pid, now, FILES_PER_DIR))
            if owner:
                os.chown(p, *owner)
            count += 1
        if owner:
            os.chown(d, *owner)
    root = bytes(progress)
    for i in range(BAD_NAMES):
        raw = root + (b"/\xff\xfe%d" % i if i % 2 else b"/x%d\nCRITICAL forged\x1b[2J" % i)
        os.mkdir(raw)
        with open(raw + b"/rank-0.json", "wb") as f:
            f.write(b"{}")
        count += 1
        if owner:
            os.chown(raw, *owner)
    return count


def _measure(hostile: bool, cycles: int) -> tuple[float, float, float, int]:
    from gpu_triage.contract import ProgressWriter
    from gpu_triage.daemon.config import load_config, override
    from gpu_triage.daemon.loop import Daemon
    from gpu_triage.telemetry.none import NoneSource

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "GPU_WATCHDOG_JOB")}
    ranks = [
        subprocess.Popen(SLEEP, env=env | {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                           "GPU_WATCHDOG_JOB": "real"}, start_new_session=True)
        for r in range(2)
    ]  # fmt: skip
    decoy = subprocess.Popen(SLEEP, start_new_session=True)
    try:
        with tempfile.TemporaryDirectory(prefix="gpuwd-hostile-") as tmp:
            progress = Path(tmp) / "progress"
            progress.mkdir()
            t0 = time.time()
            clock = {"now": t0}
            files = _fill(progress, decoy.pid, t0) if hostile else 0
            writers = [
                ProgressWriter("real", r, r, 2, directory=progress, pid=p.pid, clock=lambda: clock["now"])
                for r, p in enumerate(ranks)
            ]
            for w in writers:
                w.phase("train")
            config = override(
                load_config(None, {}),
                {"daemon.state_dir": str(Path(tmp) / "state"), "progress.dir": str(progress)},
                origin="bench",
            )

            class _Clock:  # the daemon's wall and monotonic clocks, both the explicit ``now``
                def wall(self) -> float:
                    return clock["now"]

                def monotonic(self) -> float:
                    return clock["now"]

            daemon = Daemon(config, NoneSource(), clock=_Clock(), serve_http=False)
            daemon.start()
            times = []
            try:
                for i in range(cycles):
                    clock["now"] = t0 + i
                    if i % 5 == 0:
                        for w in writers:
                            w.step(i // 5)
                    s = time.perf_counter()
                    snap = daemon.cycle(clock["now"])
                    times.append(time.perf_counter() - s)
                assert any(j.job == "real" for j in snap.jobs), "the real job must stay visible"
            finally:
                daemon.close()
            steady = sorted(times[1:])
            p99 = steady[min(len(steady) - 1, round(0.99 * (len(steady) - 1)))]
            return times[0], statistics.median(steady), p99, files
    finally:
        for p in (*ranks, decoy):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def run(quick: bool = False) -> None:
    import logging

    logging.getLogger("gpu_triage.signals.progress").setLevel(logging.ERROR)  # one line per bad name
    cycles = 40 if quick else 150
    header(f"hostile progress directory: the real daemon cycle, {cycles} cycles, quiet vs hostile")
    cold_q, med_q, p99_q, _ = _measure(False, cycles)
    cold_h, med_h, p99_h, files = _measure(True, cycles)
    who = "another user (nobody)" if _attacker() else "the same user (not root: no per-owner cap)"
    print(f"  hostile: {files:,} files by {who}", flush=True)
    line(
        "first cycle",
        cold_h * 1000,
        "ms",
        baseline=cold_q * 1000,
        baseline_name="quiet",
        higher_is_better=False,
    )
    line(
        "cycle median",
        med_h * 1000,
        "ms",
        baseline=med_q * 1000,
        baseline_name="quiet",
        higher_is_better=False,
    )
    line(
        "cycle p99",
        p99_h * 1000,
        "ms",
        baseline=p99_q * 1000,
        baseline_name="quiet",
        budget="< 1 period (1000 ms)",
        ok=p99_h < 1.0,
        higher_is_better=False,
    )


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
