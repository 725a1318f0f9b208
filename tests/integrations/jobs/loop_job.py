"""The plain-loop example (docs/examples/plain_loop.py) with ``TEST_STEP_S`` per step,
``TEST_SLOW_SAVE_S`` per save (slow storage) and ``TEST_DEADLOCK=1``: after epoch 0, rank 1 alone
saves (``with progress.checkpoint():`` around a barrier - the classic ``if rank == 1: save()`` with a
collective inside) while rank 0 goes on into epoch 1 and blocks in DDP's all-reduce."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import plain_loop
import torch.distributed as dist

from gpu_triage.integrations import Progress

STEP_S = float(os.environ.get("TEST_STEP_S", "0"))
SLOW_SAVE_S = float(os.environ.get("TEST_SLOW_SAVE_S", "0"))
DEADLOCK = os.environ.get("TEST_DEADLOCK") == "1"

_save = plain_loop.save
_step = Progress.step


def slow_save(*args: Any, **kwargs: Any) -> None:
    _save(*args, **kwargs)
    time.sleep(SLOW_SAVE_S)


def slow_step(self: Progress, *args: Any, **kwargs: Any) -> None:
    _step(self, *args, **kwargs)
    time.sleep(STEP_S)


def after_epoch(progress: Progress, epoch: int) -> None:
    if DEADLOCK and epoch == 0 and dist.get_rank() == 1:
        print("rank 1: a save only this rank does, with a collective inside", flush=True)
        with progress.checkpoint():
            dist.barrier()


plain_loop.save = slow_save
Progress.step = slow_step  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(plain_loop.main(sys.argv[1:], after_epoch=after_epoch))
