"""A plain PyTorch DDP loop that reports to the watchdog: ``Progress`` and three ``with`` blocks.

Runs on CPU (gloo) as well as on GPUs (nccl)::

    export GPU_WATCHDOG_PROGRESS_DIR=/tmp/progress      # default /run/gpu-watchdog/progress
    torchrun --nproc-per-node 2 docs/examples/plain_loop.py --out /tmp/loop-example
    cat /tmp/progress/loop-example/rank-*.json

The watchdog lines are marked ``# <-``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from gpu_triage.integrations import Progress


def save(model: torch.nn.Module, path: Path) -> None:
    """Rank 0 writes, every rank waits: a collective save, announced on every rank."""
    if dist.get_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
    dist.barrier()


def main(
    argv: Sequence[str] | None = None, after_epoch: Callable[[Progress, int], None] | None = None
) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="checkpoints go here")
    ap.add_argument("--job", default="loop-example", help="the job name the watchdog shows")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--save-steps", type=int, default=4)
    args = ap.parse_args(argv)

    with Progress.from_env(args.job) as progress:  # <- init; RANK/LOCAL_RANK/WORLD_SIZE from torchrun
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        x = torch.randn(args.samples, 16)
        data = TensorDataset(x, x.sum(dim=1, keepdim=True))
        sampler = DistributedSampler(data, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size=4, sampler=sampler)
        model = DistributedDataParallel(torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        progress.train()  # <- steps from here on
        step = 0
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                progress.step(step, epoch=epoch, tokens=step * len(xb))  # <- after each optimizer step
                if step % args.save_steps == 0:
                    with progress.checkpoint():  # <- on every rank
                        save(model.module, Path(args.out) / f"step-{step}.pt")
            with progress.epoch_end():  # <- end-of-epoch collectives
                total = torch.tensor([loss.item()])
                dist.all_reduce(total)
            if after_epoch is not None:
                after_epoch(progress, epoch)
        dist.destroy_process_group()
    return 0  # <- leaving the with block wrote "done"


if __name__ == "__main__":
    sys.exit(main())
