"""An accelerate loop that reports to the watchdog: ``watch(accelerator)`` and ``progress.step``.

Runs on CPU as well as on GPUs::

    export GPU_WATCHDOG_PROGRESS_DIR=/tmp/progress      # default /run/gpu-watchdog/progress
    torchrun --nproc-per-node 2 docs/examples/accelerate_loop.py --out /tmp/accelerate-example
    # or: accelerate launch --num_processes 2 docs/examples/accelerate_loop.py --out ...
    cat /tmp/progress/accelerate-example/rank-*.json

``accelerator.save_state`` and ``load_state`` are announced for you; the watchdog lines are marked
``# <-``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from gpu_triage.integrations.accelerate import unwatch, watch


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="checkpoints go here")
    ap.add_argument("--job", default="accelerate-example", help="the job name the watchdog shows")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--save-steps", type=int, default=4)
    args = ap.parse_args(argv)

    accelerator = Accelerator(cpu=True)
    progress = watch(accelerator, args.job)  # <- init; saves and loads announced from here on
    torch.manual_seed(0)
    x = torch.randn(args.samples, 16)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4, shuffle=True)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = accelerator.prepare(model, opt, loader)

    progress.train()  # <- steps from here on
    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            step += 1
            progress.step(step, epoch=epoch)  # <- after each optimizer step
            if step % args.save_steps == 0:
                accelerator.save_state(str(Path(args.out) / f"step-{step}"))  # announced: checkpoint
    accelerator.wait_for_everyone()
    unwatch(accelerator)  # <- done
    accelerator.end_training()
    if torch.distributed.is_initialized():  # not left to interpreter exit (gloo's threads can abort it)
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
