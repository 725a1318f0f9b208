"""``ft-trainer train`` for real: 2 ranks of DeepSpeed ZeRO-3 on CPU (gloo), the tiny Qwen3, an imbalanced
corpus equalized every epoch.

Three launches, each checked against the one before:
A. an uninterrupted run of two epochs (saving every 4 steps): loss falls, checkpoints are complete and
   ``latest`` names the last, every progress file polled during the run (and every record in the
   per-rank history) is valid by the daemon's own parser, with every phase and its lease;
B. a resume from A's checkpoint of step 8 (mid-epoch) with a crash injected in the middle of the save of
   step 16: until the crash its losses and learning rates equal A's step for step, and afterwards
   ``latest`` still names step 12 while step 16 is a half-written directory;
C. a resume of B's directory: the half checkpoint is removed, the run restarts at step 12 and the same
   data position (epoch 1, micro-batch 4), matches A's losses to the end, and keep-last-2 pruning holds.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from ft_trainer.config import load_config
from ft_trainer.data.data import JobData
from ft_trainer.devtools.testing import LocalRun, TinyData, launch_local, prepare_tiny_data, write_tiny_job
from ft_trainer.train.checkpoint import (
    COMPLETE_FILE,
    FAULT_EXIT_CODE,
    list_checkpoints,
    read_latest,
    tag_for_step,
)
from ft_trainer.train.scaling import load_run, scaling_rows
from ft_trainer.train.throughput import read_metrics
from gpu_triage.signals.progress_model import parse_record

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(600)]

RUN_TIMEOUT_S = 240.0
SAVE_EVERY = 4
LOSS_REL = 1e-6  # same ops on the same data: equal in practice, bit for bit here


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> TinyData:
    return prepare_tiny_data(tmp_path_factory.mktemp("tiny"), imbalanced=True, tokenizer_dir=tokenizer_dir)


def imbalanced_seed(data: TinyData, tmp: Path, grad_accum: int = 2) -> int:
    """A shuffle seed whose epoch 0 gives the two ranks different packed counts (so equalize drops)."""
    for seed in range(60):
        job = write_tiny_job(
            tmp / "probe.toml",
            cache_dir=data.cache_dir,
            tokenizer_dir=data.tokenizer_dir,
            checkpoint_dir=tmp / "probe",
            job={"seed": seed},
            data={"equalize": False},
        )
        plan = JobData.open(load_config(job)).epoch_plan(0)
        if abs(int(plan.micro_batches[0]) - int(plan.micro_batches[1])) >= 2 * grad_accum:
            return seed
    raise AssertionError("no imbalanced seed found")


def run_and_poll(run: LocalRun, timeout_s: float = RUN_TIMEOUT_S) -> tuple[list[int | None], dict]:
    """Wait for the ranks, reading both progress files every 20 ms; every content read must parse."""
    seen: dict[int, list] = {0: [], 1: []}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in (0, 1):
            try:
                raw = run.progress_file(r).read_bytes()
            except FileNotFoundError:
                continue
            rec = parse_record(raw)  # raises on any invalid content
            if not seen[r] or seen[r][-1] != rec:
                seen[r].append(rec)
        if not any(run.alive()):
            break
        time.sleep(0.02)
    else:
        raise AssertionError("run did not finish in time:\n" + run.tail())
    return run.returncodes(), seen


def steps_of(metrics_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(metrics_dir / "metrics.jsonl") if r["kind"] == "step"}


def test_train_resume_and_crash_mid_save(tmp_path: Path, tiny_data: TinyData) -> None:
    seed = imbalanced_seed(tiny_data, tmp_path)

    def job(name: str, ckpt: Path, keep_last: int) -> Path:
        return write_tiny_job(
            tmp_path / f"{name}.toml",
            cache_dir=tiny_data.cache_dir,
            tokenizer_dir=tiny_data.tokenizer_dir,
            checkpoint_dir=ckpt,
            job={"seed": seed, "epochs": 2},
            checkpoint={"keep_last": keep_last},
            train={"save_every_steps": SAVE_EVERY},
        )

    cfg = load_config(job("plan", tmp_path / "unused", 2))
    data = JobData.open(cfg)
    plans = [data.epoch_plan(e) for e in range(2)]
    assert not plans[0].balanced or plans[0].local_micro_batches.min() < plans[0].local_micro_batches.max()
    steps_per_epoch = [int(p.micro_batches.min()) // 2 for p in plans]
    total = sum(steps_per_epoch)
    assert steps_per_epoch[0] > 8 and 12 < total <= 40, steps_per_epoch

    # ---------------------------------------------------------------- A: uninterrupted, polled
    ckpt_a = tmp_path / "ckpt-a"
    with launch_local(
        job("a", ckpt_a, 100), log_dir=tmp_path / "logs-a", progress_dir=tmp_path / "progress-a"
    ) as run:
        codes, polled = run_and_poll(run)
        assert codes == [0, 0], run.tail()
    steps_a = steps_of(ckpt_a / "metrics")
    assert sorted(steps_a) == list(range(1, total + 1))
    losses = [steps_a[s]["loss"] for s in range(1, total + 1)]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    for rec in steps_a.values():
        assert rec["tokens_per_s"] > 0 and 0 < rec["mfu"] < 1 and rec["gpu_hours"] > 0
    run_json = json.loads((ckpt_a / "metrics" / "run.json").read_text())
    assert run_json["world_size"] == 2 and run_json["steps_per_epoch"] == steps_per_epoch
    assert json.loads((ckpt_a / "metrics" / "ds_config.json").read_text())["zero_optimization"]["stage"] == 3
    row = scaling_rows([load_run(ckpt_a / "metrics")])[0]  # the scaling report reads a real run
    assert row.gpus == 2 and row.tokens_per_s > 0 and row.gpu_hours_per_epoch > 0

    # checkpoints: every 4 steps and at each epoch end, all complete, latest = the last one
    saved = sorted({s for s in range(SAVE_EVERY, total + 1, SAVE_EVERY)} | {steps_per_epoch[0], total})
    infos = list_checkpoints(ckpt_a)
    assert [c.step for c in infos] == saved and all(c.complete for c in infos)
    assert read_latest(ckpt_a) == tag_for_step(total)
    final = json.loads((ckpt_a / tag_for_step(total) / COMPLETE_FILE).read_text())
    # saved by save_every_steps just before the epoch end (not saved twice): it resumes at the epoch's end
    expect = (total, 1, 2 * steps_per_epoch[1]) if total % SAVE_EVERY == 0 else (total, 2, 0)
    assert (final["step"], final["epoch"], final["micro_batch"]) == expect

    # progress: what the poller saw, and every record each rank wrote (its history), parse and make sense
    for r in (0, 1):
        seen_phases = {rec.phase for rec in polled[r]}
        assert {"init", "train", "done"} <= seen_phases, seen_phases
        history = [
            parse_record(line)
            for line in (ckpt_a / "metrics" / "progress" / f"rank-{r}.jsonl").read_text().splitlines()
        ]
        assert history[0].phase == "init" and history[-1].phase == "done"
        assert {h.phase for h in history} == {"init", "train", "checkpoint", "epoch_end", "done"}
        assert all(h.rank == r and h.world_size == 2 and h.job == "tiny-cpu" for h in history)
        for h in history:
            if h.phase == "train":
                assert h.lease_until is None
            else:
                assert h.lease_until is not None and h.lease_until - h.time >= 29.9  # min_lease_s 30
        steps = [h.step for h in history]
        assert steps == sorted(steps) and steps[-1] == total
        assert history[-1].tokens == total * 2 * 2 * 64  # grad_accum x micro_batch x seq_len per step
        assert all(polled_rec.pid == history[0].pid for polled_rec in polled[r])

    # ---------------------------------------------------------------- B: resume at step 8, crash saving 16
    ckpt_b = tmp_path / "ckpt-b"
    ckpt_b.mkdir()
    shutil.copytree(ckpt_a / tag_for_step(8), ckpt_b / tag_for_step(8))
    (ckpt_b / "latest").write_text(tag_for_step(8))
    with launch_local(
        job("b", ckpt_b, 2),
        log_dir=tmp_path / "logs-b",
        progress_dir=tmp_path / "progress-b",
        env={"FT_TRAINER_FAULT": "crash_in_save:16"},
    ) as run:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while run.returncodes()[0] is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert run.returncodes()[0] == FAULT_EXIT_CODE, run.tail()
    steps_b = steps_of(ckpt_b / "metrics")
    assert sorted(steps_b) == list(range(9, 17))
    for s in steps_b:
        assert steps_b[s]["loss"] == pytest.approx(steps_a[s]["loss"], rel=LOSS_REL), s
        assert steps_b[s]["lr"] == steps_a[s]["lr"]
    assert read_latest(ckpt_b) == tag_for_step(12)
    half = ckpt_b / tag_for_step(16)
    assert half.is_dir() and any(half.iterdir()) and not (half / COMPLETE_FILE).exists()

    # ---------------------------------------------------------------- C: resume after the crash
    with launch_local(
        job("c", ckpt_b, 2), log_dir=tmp_path / "logs-c", progress_dir=tmp_path / "progress-c"
    ) as run:
        codes, _ = run_and_poll(run)
        assert codes == [0, 0], run.tail()
    records = read_metrics(ckpt_b / "metrics" / "metrics.jsonl")
    start_c = [r for r in records if r["kind"] == "start"][-1]
    position_a = (1, 2 * (12 - steps_per_epoch[0]))  # step 12: epoch 1, two micro-batches per step in
    assert start_c["resumed_from"] == tag_for_step(12) and start_c["step"] == 12
    assert (start_c["epoch"], start_c["micro_batch"]) == position_a
    steps_c = {r["step"]: r for r in records[records.index(start_c) :] if r["kind"] == "step"}
    assert sorted(steps_c) == list(range(13, total + 1))
    for s in steps_c:
        assert steps_c[s]["loss"] == pytest.approx(steps_a[s]["loss"], rel=LOSS_REL), s
        assert steps_c[s]["lr"] == steps_a[s]["lr"]
    # C's progress never went back before the checkpoint it resumed from
    for r in (0, 1):
        lines = (ckpt_b / "metrics" / "progress" / f"rank-{r}.jsonl").read_text().splitlines()
        last_pid = parse_record(lines[-1]).pid
        c_records = [rec for rec in map(parse_record, lines) if rec.pid == last_pid]
        assert c_records[0].phase == "init" and c_records[-1].phase == "done"
        assert all(rec.step >= 12 for rec in c_records[1:]), [rec.step for rec in c_records]
    assert read_latest(ckpt_b) == tag_for_step(total)
    left = list_checkpoints(ckpt_b)
    assert all(c.complete for c in left) and len(left) == 2 and left[-1].step == total, left
