"""Equalize-to-minimum with a real gloo process group on CPU (torch.multiprocessing spawn, file://
rendezvous).

One spawn of three ranks checks two things, to pay torch's start-up once:
1. scripted local counts -> every rank gets min rounded down to grad_accum, the MIN/MAX it saw, its drops;
2. the real pipeline: each rank opens the job's data, takes its local count from the plan, equalizes it
   through the collective, iterates exactly that many packed micro-batches, and the ranks confirm with a
   second collective that they all ran the same number (the no-deadlock property) and that it matches the
   gate's prediction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainer.conftest import JobWriter

pytestmark = pytest.mark.trainer

WORLD = 3
SCRIPTED = {0: 311, 1: 312, 2: 317}  # grad_accum 4 -> 308


def _worker(rank: int, init_file: str, job: str, out_dir: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from ft_trainer.config import load_config
    from ft_trainer.data.data import JobData
    from ft_trainer.planning.equalize import equalize_epoch

    # a short collective timeout: a broken equalize fails the test in seconds instead of hanging for 30 min
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=30)
    )
    try:
        scripted = equalize_epoch(SCRIPTED[rank], grad_accum=4, micro_batch=2, seq_len=16, epoch=0)
        cfg = load_config(job)
        data = JobData.open(cfg)
        real = []
        for epoch in range(cfg.epochs):
            plan = data.epoch_plan(epoch)
            local = int(plan.local_micro_batches[rank])
            eq = equalize_epoch(
                local,
                grad_accum=cfg.data.grad_accum,
                micro_batch=cfg.data.micro_batch,
                seq_len=cfg.data.seq_len,
                epoch=epoch,
                expected=int(plan.micro_batches[rank]),
            )
            ran = tokens = 0
            for mb in data.rank_stream(plan, rank).iter_micro_batches(eq.micro_batches):
                t = torch.from_numpy(mb)
                # a collective per micro-batch, like ZeRO-3's all-gathers: an extra batch on one rank
                # would hang here (barrier timeout fails the test instead)
                dist.all_reduce(torch.zeros(1))
                ran += 1
                tokens += int(t.numel())
            counts = torch.tensor([ran, -ran])
            dist.all_reduce(counts, op=dist.ReduceOp.MIN)
            real.append(
                {
                    "epoch": epoch,
                    "local": local,
                    "ran": ran,
                    "tokens": tokens,
                    "min_ran": int(counts[0]),
                    "max_ran": -int(counts[1]),
                    "equalized": eq.micro_batches,
                    "predicted": int(plan.micro_batches[rank]),
                    "dropped_tokens": eq.dropped_tokens,
                }
            )
        Path(out_dir, f"rank-{rank}.json").write_text(
            json.dumps(
                {
                    "scripted": {
                        "micro_batches": scripted.micro_batches,
                        "min": scripted.min_micro_batches,
                        "max": scripted.max_micro_batches,
                        "dropped_micro_batches": scripted.dropped_micro_batches,
                        "dropped_tokens": scripted.dropped_tokens,
                    },
                    "real": real,
                }
            )
        )
    finally:
        dist.destroy_process_group()


def test_equalize_with_real_gloo_process_group(tmp_path: Path, write_job: JobWriter) -> None:
    import torch.multiprocessing as mp

    # equalize on, local counts unequal across ranks (checked below), grad_accum 3
    job = write_job(
        data={"seq_len": 24, "micro_batch": 2, "grad_accum": 3, "equalize": True},
        cluster={"gpus_per_node": WORLD},
        job={"epochs": 2},
    )
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(
        _worker,
        args=(str(tmp_path / "rendezvous"), str(job), str(out)),
        nprocs=WORLD,
        join=True,
        start_method="spawn",
    )
    results = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(WORLD)]

    for r, res in enumerate(results):
        s = res["scripted"]
        assert s["micro_batches"] == 308 and s["min"] == 311 and s["max"] == 317
        assert s["dropped_micro_batches"] == SCRIPTED[r] - 308
        assert s["dropped_tokens"] == (SCRIPTED[r] - 308) * 2 * 16

    for epoch in range(2):
        rows = [res["real"][epoch] for res in results]
        locals_ = [row["local"] for row in rows]
        assert len(set(locals_)) > 1, "the data should give unequal local counts, or this proves nothing"
        expect = (min(locals_) // 3) * 3
        for row in rows:
            assert row["ran"] == row["equalized"] == row["predicted"] == expect > 0
            assert row["min_ran"] == row["max_ran"] == expect
            assert row["tokens"] == expect * 2 * 24
            assert row["dropped_tokens"] == (row["local"] - expect) * 2 * 24
