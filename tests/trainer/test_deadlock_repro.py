"""The epoch-end deadlock, reproduced for real - and prevented.

Two real ``ft-trainer train`` ranks (DeepSpeed ZeRO-3, gloo, CPU) on a corpus with one long document:
packing gives one rank more micro-batches than the other in epoch 0. With ``data.equalize = false``
the rank with fewer finishes its epoch and waits in the end-of-epoch barrier (phase ``epoch_end``, a
lease) while the other waits in its next backward's reduce-scatter (phase ``train``, step frozen):
neither ever returns. The test sees it with its own clock - both processes alive, both progress files
unchanged for 20 s, both nearly idle - then kills the process group and checks nothing is left. The
gate refuses the same plan before launch. With equalize on, the same data completes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from ft_trainer.config import load_config
from ft_trainer.data.data import JobData
from ft_trainer.devtools.testing import TinyData, launch_local, prepare_tiny_data, write_tiny_job
from ft_trainer.gate import run_gate
from ft_trainer.train.throughput import read_metrics
from gpu_triage.signals.progress_model import parse_record

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(420)]

FROZEN_S = 20.0
START_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> TinyData:
    return prepare_tiny_data(tmp_path_factory.mktemp("tiny"), imbalanced=True, tokenizer_dir=tokenizer_dir)


def survivors(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line mentions ``marker``."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def deadlock_job(tmp: Path, data: TinyData, equalize: bool, name: str) -> Path:
    """One epoch, grad_accum 1, with the first seed whose epoch 0 packs unequal counts."""
    for seed in range(60):
        job = write_tiny_job(
            tmp / f"{name}.toml",
            cache_dir=data.cache_dir,
            tokenizer_dir=data.tokenizer_dir,
            checkpoint_dir=tmp / f"ckpt-{name}",
            job={"seed": seed, "epochs": 1},
            data={"equalize": equalize, "grad_accum": 1},
            train={"save_every_epoch": False, "save_at_end": False},
        )
        plan = JobData.open(load_config(job)).epoch_plan(0)
        if int(plan.local_micro_batches.max()) - int(plan.local_micro_batches.min()) >= 4:
            return job
    raise AssertionError("no imbalanced seed found")


def test_epoch_end_deadlock_hangs_without_equalize_and_completes_with_it(
    tmp_path: Path, tiny_data: TinyData
) -> None:
    off = deadlock_job(tmp_path, tiny_data, equalize=False, name="off")
    cfg = load_config(off)
    plan = JobData.open(cfg).epoch_plan(0)
    short, long_ = int(plan.micro_batches.argmin()), int(plan.micro_batches.argmax())
    lo, hi = int(plan.micro_batches.min()), int(plan.micro_batches.max())
    assert lo < hi

    # the gate refuses this plan before launch
    report = run_gate(cfg)
    assert not report.ok
    assert [i.name for i in report.invariants if not i.ok] == ["equal_steps_per_rank"]

    progress_dir = tmp_path / "progress"
    run = launch_local(off, log_dir=tmp_path / "logs-off", progress_dir=progress_dir)
    pids = run.pids
    try:
        # 1. wait until the short rank announces the epoch end
        deadline = time.monotonic() + START_TIMEOUT_S
        records: dict[int, object] = {}
        while time.monotonic() < deadline:
            assert all(run.alive()), "a rank exited instead of hanging:\n" + run.tail()
            try:
                records = {r: parse_record(run.progress_file(r).read_bytes()) for r in (0, 1)}
            except FileNotFoundError:
                records = {}
            if records and records[short].phase == "epoch_end":
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the short rank never reached the epoch end:\n" + run.tail())

        # 2. nothing moves for FROZEN_S while both processes live and sleep
        procs = [psutil.Process(p) for p in pids]
        time.sleep(2.0)  # let the last rate-limited progress write (<= 1 s) land
        snapshot = {r: run.progress_file(r).read_bytes() for r in (0, 1)}
        mtimes = {r: os.stat(run.progress_file(r)).st_mtime_ns for r in (0, 1)}
        cpu0 = [sum(p.cpu_times()[:2]) for p in procs]
        t0 = time.monotonic()
        while time.monotonic() - t0 < FROZEN_S:
            assert all(run.alive()), "a rank exited instead of hanging:\n" + run.tail()
            for r in (0, 1):
                assert run.progress_file(r).read_bytes() == snapshot[r], f"rank {r} advanced: not a hang"
                assert os.stat(run.progress_file(r)).st_mtime_ns == mtimes[r]
            time.sleep(0.5)
        cpu_s = [sum(p.cpu_times()[:2]) - c for p, c in zip(procs, cpu0, strict=True)]
        assert all(c < 0.25 * FROZEN_S for c in cpu_s), f"ranks busy, not blocked: {cpu_s} CPU-s"

        # 3. the signature: phase disagreement with frozen steps
        frozen = {r: parse_record(snapshot[r]) for r in (0, 1)}
        assert frozen[short].phase == "epoch_end" and frozen[short].lease_until is not None
        assert frozen[long_].phase == "train" and frozen[long_].lease_until is None
        assert frozen[short].step == lo  # grad_accum 1: one step per micro-batch
        assert lo <= frozen[long_].step < hi  # it never finished its extra micro-batches
        assert "equalize is OFF and epoch 0 is unbalanced" in run.output(0) + run.output(1)
    finally:
        run.kill()
    # 4. every process of the job is gone
    assert all(rc is not None for rc in run.returncodes())
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert survivors(str(off)) == [], "processes of the job survived the kill"

    # 5. the same data with equalize on completes
    on = deadlock_job(tmp_path, tiny_data, equalize=True, name="on")
    with launch_local(
        on, log_dir=tmp_path / "logs-on", progress_dir=progress_dir, job="tiny-cpu-on"
    ) as run_on:
        codes = run_on.wait(START_TIMEOUT_S)
        assert codes == [0, 0], run_on.tail()
        done = [parse_record(run_on.progress_file(r).read_bytes()) for r in (0, 1)]
    assert [d.phase for d in done] == ["done", "done"] and done[0].step == done[1].step == lo
    eq = [
        r for r in read_metrics(tmp_path / "ckpt-on" / "metrics" / "metrics.jsonl") if r["kind"] == "equalize"
    ]
    assert (eq[0]["min"], eq[0]["max"], eq[0]["micro_batches"]) == (lo, hi, lo)
