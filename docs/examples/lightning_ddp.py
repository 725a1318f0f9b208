"""A Lightning DDP job that reports to the watchdog: one callback.

Runs on CPU (gloo) as well as on GPUs::

    export GPU_WATCHDOG_PROGRESS_DIR=/tmp/progress      # default /run/gpu-watchdog/progress
    torchrun --nproc-per-node 2 docs/examples/lightning_ddp.py --out /tmp/lightning-example
    cat /tmp/progress/lightning-example/rank-*.json

The only lines the watchdog needs are the import and ``callbacks=[WatchdogCallback(...)]``. Works the
same with ``import lightning.pytorch as pl`` (the ``lightning`` distribution).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from gpu_triage.integrations.lightning import WatchdogCallback


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(samples: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 16, generator=g)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def build(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = ()) -> tuple[pl.Trainer, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="checkpoints go here")
    ap.add_argument("--job", default="lightning-example", help="the job name the watchdog shows")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=64, help="training samples per epoch (all ranks)")
    ap.add_argument("--save-steps", type=int, default=4)
    args = ap.parse_args(argv)
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "2")),
        strategy="ddp",
        max_epochs=args.epochs,
        callbacks=[
            WatchdogCallback(args.job),  # <- the watchdog integration
            ModelCheckpoint(dirpath=args.out, every_n_train_steps=args.save_steps, save_top_k=-1),
            *callbacks,
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=args.out,
    )
    return trainer, (Regression(), loader(args.samples, 0), loader(16, 1))


def main(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = ()) -> int:
    trainer, (model, train, val) = build(argv, callbacks)
    trainer.fit(model, train, val)
    return 0


if __name__ == "__main__":
    sys.exit(main())
