"""The program a test Slurm job runs: two simulated ranks writing real progress files.

``python slurm_payload.py steady``: both ranks step forever (every 0.2 s).
``python slurm_payload.py deadlock``: after 25 steps rank 0 announces ``epoch_end`` (it ran out of
batches) and rank 1 stays in ``train`` with its step frozen - the epoch-end deadlock; every process
of the job ignores SIGTERM (a rank stuck in a collective often does), so only a SIGKILL ends it.

Progress goes through the trainer's own writer (``ProgressWriter.from_env`` of the contract module
``gpu_triage.contract``, which the trainer writes through) into
``$GPU_WATCHDOG_PROGRESS_DIR/$GPU_WATCHDOG_JOB/``, which the cluster's TaskProlog sets. Standard
library only besides that module, so it runs as an unprivileged job user from a copied directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

STEP_S = 0.2
DEADLOCK_AFTER_STEPS = 25


def rank(mode: str) -> None:
    from gpu_triage.contract import ProgressWriter  # what the trainer writes through

    writer = ProgressWriter.from_env()
    writer.phase("train")
    step = 0
    while mode == "steady" or step < DEADLOCK_AFTER_STEPS:
        step += 1
        writer.step(step, epoch=0, tokens=step * 4096)
        time.sleep(STEP_S)
    writer.flush()
    if os.environ["RANK"] == "0":
        writer.phase("epoch_end", lease_s=30.0)
    while True:
        time.sleep(3600)


def main() -> int:
    mode = sys.argv[1]
    if mode == "deadlock":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the ranks
    if os.environ.get("RANK") is not None:
        rank(mode)
        return 0
    children = [
        subprocess.Popen(
            [sys.executable, __file__, mode],
            env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"},
        )
        for r in range(2)
    ]
    for child in children:
        child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
