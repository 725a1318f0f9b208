"""A plain DeepSpeed ZeRO-3 training script (gloo, CPU, a tiny random MLP), written the way users
write one - not this project's trainer: no progress files, no phase announcements.

    RANK=.. WORLD_SIZE=2 MASTER_ADDR=.. MASTER_PORT=.. python plain_deepspeed.py MODE OUT_DIR

MODE ``deadlock``: the classic epoch-end deadlock of uneven shards - rank 0 has 2 batches, rank 1
has 4; rank 0 finishes its epoch and waits in the epoch-end ``barrier`` while rank 1 waits in its
ZeRO-3 gradient reduce-scatter (its backward). Neither ever returns.

MODE ``slow_save``: both ranks train 2 steps, then ``engine.save_checkpoint``; rank 0's storage is
slow (its writes are throttled to take ``SLOW_SAVE_S`` seconds, 150 by default) while rank 1 has
written its shard and waits in the save's collective (ZeRO-3's epilogue all-gather, then the
final barrier). Then both finish and exit 0.

MODE ``save_deadlock``: the field report's shape - uneven shards again (rank 0 has 2 batches, rank 1
has 4), and the epoch ends with ``engine.save_checkpoint`` (a collective inside): rank 0 finishes its
batches and blocks in the save's first collective while rank 1 still waits in its training step's
gradient reduce-scatter. Neither ever returns.

MODE ``save_split``: the same failure with one long rank - the last rank (``WORLD_SIZE - 1``) has 4
batches, every other rank 2: every other rank blocks in the epoch-end save's first collective while
the last rank waits in its third step's collective. Neither side ever returns.

MODE ``train``: a healthy job - steps until ``TRAIN_S`` seconds (60 by default) have passed on rank 0
or ``OUT_DIR/stop`` exists (rank 0 broadcasts whether to go on each step, so every rank takes the same
steps), then
``OUT_DIR/done-<rank>`` and exit 0. ``OUT_DIR/step-<rank>`` holds the rank's step count.

Each rank writes ``OUT_DIR/ready-<rank>`` once DeepSpeed is initialised and
``OUT_DIR/epoch-end-<rank>`` at its epoch end.
"""

from __future__ import annotations

import importlib
import io
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
import torch.distributed as dist


def throttled_save(state_dict: object, path: str, seconds: float) -> None:
    """Write ``state_dict`` to ``path`` slowly: storage that needs ``seconds`` for it."""
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    data = buf.getvalue()
    chunks = 50
    step = max(1, len(data) // chunks + 1)
    with open(path, "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i : i + step])
            f.flush()
            time.sleep(seconds / chunks)


def train_steps(engine: deepspeed.DeepSpeedEngine, n: int) -> None:
    for _ in range(n):
        x = torch.randn(2, 16)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()


def main() -> int:
    mode, out = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    # DeepSpeed's CPU backend JIT-compiles a shared-memory op only inference all-reduce uses: skip the
    # C++ build (a user on CPU does the same, or waits for it once)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    (out / f"ready-{rank}").write_text(str(os.getpid()))
    if mode == "deadlock":
        batches = 2 if rank == 0 else 4  # uneven shards: nobody equalised the epoch
        for _epoch in range(2):
            train_steps(engine, batches)
            (out / f"epoch-end-{rank}").write_text("")
            dist.barrier()  # rank 0 waits here; rank 1 is still in its backward's reduce-scatter
        return 0
    if mode == "save_deadlock":
        batches = 2 if rank == 0 else 4  # uneven shards: nobody equalised the epoch
        train_steps(engine, batches)
        (out / f"epoch-end-{rank}").write_text("")
        engine.save_checkpoint(str(out / "ckpt"), tag="epoch0")  # rank 0 blocks inside the save
        return 0
    if mode == "save_split":
        batches = 4 if rank == int(os.environ["WORLD_SIZE"]) - 1 else 2
        train_steps(engine, batches)
        (out / f"epoch-end-{rank}").write_text("")
        engine.save_checkpoint(str(out / "ckpt"), tag="epoch0")  # the short ranks block inside the save
        return 0
    if mode == "train":
        end = time.time() + float(os.environ.get("TRAIN_S", "60"))
        step = 0
        while True:
            go = torch.tensor([1 if time.time() < end and not (out / "stop").exists() else 0])
            dist.broadcast(go, 0)
            if not int(go.item()):
                break
            train_steps(engine, 1)
            step += 1
            (out / f"step-{rank}").write_text(str(step))
            time.sleep(0.05)
        (out / f"done-{rank}").write_text(str(step))
        return 0
    if mode == "slow_save":
        train_steps(engine, 2)
        if rank == 0:
            seconds = float(os.environ.get("SLOW_SAVE_S", "150"))
            engine.checkpoint_engine.save = lambda state_dict, path: throttled_save(state_dict, path, seconds)
        (out / f"epoch-end-{rank}").write_text("")
        engine.save_checkpoint(str(out / "ckpt"), tag="epoch0")
        (out / f"saved-{rank}").write_text("")
        dist.barrier()
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main())
