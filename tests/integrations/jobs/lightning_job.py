"""The Lightning example (docs/examples/lightning_ddp.py) with the test conditions of ``hf_job.py``:
``TEST_STEP_S`` per step, ``TEST_SLOW_SAVE_S`` per checkpoint (slow storage), and ``TEST_DEADLOCK=1``:
at the end of epoch 0 rank 1 runs an extra barrier inside ``on_train_epoch_end`` under a job-scoped
``epoch_end`` lease while rank 0 goes on into epoch 1. ``TEST_HISTORY_DIR``: every record written,
per rank, as JSON lines."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import lightning_ddp
import pytorch_lightning as pl
import torch.distributed as dist

from gpu_triage.integrations.lightning import WatchdogCallback

STEP_S = float(os.environ.get("TEST_STEP_S", "0"))
SLOW_SAVE_S = float(os.environ.get("TEST_SLOW_SAVE_S", "0"))
DEADLOCK = os.environ.get("TEST_DEADLOCK") == "1"
HISTORY = os.environ.get("TEST_HISTORY_DIR")

_save = pl.Trainer.save_checkpoint


def _slow_save(self: pl.Trainer, *args: Any, **kwargs: Any) -> Any:
    out = _save(self, *args, **kwargs)
    time.sleep(SLOW_SAVE_S)
    return out


pl.Trainer.save_checkpoint = _slow_save  # type: ignore[method-assign]


class Conditions(pl.Callback):
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if HISTORY:  # every record the watchdog callback writes, one JSON line each
            watchdog = next(c for c in trainer.callbacks if isinstance(c, WatchdogCallback))
            out = open(os.path.join(HISTORY, f"rank-{trainer.global_rank}.jsonl"), "a")  # noqa: SIM115

            def record(r: dict) -> None:
                out.write(json.dumps(r) + "\n")
                out.flush()

            watchdog.progress.writer.on_write = record

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        time.sleep(STEP_S)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if DEADLOCK and trainer.global_rank == 1 and trainer.current_epoch == 0:
            watchdog = next(c for c in trainer.callbacks if isinstance(c, WatchdogCallback))
            watchdog.progress.begin("epoch_end")  # a job-scoped epoch-end lease
            print("rank 1: extra barrier at the end of epoch 0", flush=True)
            dist.barrier()  # rank 0 never joins: it is in epoch 1's all-reduce


if __name__ == "__main__":
    sys.exit(lightning_ddp.main(sys.argv[1:], callbacks=[Conditions()]))
