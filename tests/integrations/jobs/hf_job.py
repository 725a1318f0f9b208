"""The HF example (docs/examples/hf_trainer.py) with two test conditions, both off unless asked:

- ``TEST_STEP_S``: each optimizer step takes this long (a bigger model), so the daemon learns the
  step interval; ``TEST_SLOW_SAVE_S``: every checkpoint takes this much longer (slow storage), so
  the daemon sees the save;
- ``TEST_DEADLOCK=1``: at the end of epoch 0, rank 1 runs an extra collective (a barrier rank 0 never
  joins) inside an ``on_epoch_end`` hook, announcing ``epoch_end`` through the watchdog callback, as
  a buggy user hook would; rank 0 goes on into epoch 1 and blocks in DDP's all-reduce.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import hf_trainer
import torch.distributed as dist
from transformers import Trainer, TrainerCallback

from gpu_triage.integrations.hf import WatchdogCallback

STEP_S = float(os.environ.get("TEST_STEP_S", "0"))
SLOW_SAVE_S = float(os.environ.get("TEST_SLOW_SAVE_S", "0"))
DEADLOCK = os.environ.get("TEST_DEADLOCK") == "1"

_save = Trainer._save_checkpoint


def _slow_save(self: Trainer, *args: Any, **kwargs: Any) -> Any:
    out = _save(self, *args, **kwargs)
    time.sleep(SLOW_SAVE_S)
    return out


Trainer._save_checkpoint = _slow_save  # type: ignore[method-assign]


class Conditions(TrainerCallback):
    def __init__(self) -> None:
        self.watchdog: WatchdogCallback | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(STEP_S)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if DEADLOCK and args.process_index == 1 and round(state.epoch or 0) == 1:
            assert self.watchdog is not None and self.watchdog.progress is not None
            self.watchdog.progress.begin("epoch_end")  # a job-scoped epoch-end lease
            print("rank 1: extra barrier at the end of epoch 0", flush=True)
            dist.barrier()  # rank 0 never joins: it is in epoch 1's all-reduce


def main() -> int:
    conditions = Conditions()
    trainer = hf_trainer.build(sys.argv[1:], callbacks=[conditions])
    conditions.watchdog = next(
        c for c in trainer.callback_handler.callbacks if isinstance(c, WatchdogCallback)
    )
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
