"""The pure parts of ``ft-trainer train``: the reserved sections' validation, the generated DeepSpeed
config and its override, the learning-rate schedule, checkpoint selection and the atomic marker, lease
lengths, throughput/MFU arithmetic, and the command line's refusals (exit 2, before any torch import)."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ft_trainer.config import ConfigError, load_config
from ft_trainer.planning.estimates import checkpoint_bytes
from ft_trainer.planning.presets import PRESETS
from ft_trainer.train.checkpoint import (
    COMPLETE_FILE,
    LATEST_FILE,
    CheckpointInfo,
    duration_lease_s,
    list_checkpoints,
    parse_fault,
    prune_selection,
    read_latest,
    save_lease_s,
    step_of_tag,
    tag_for_step,
    write_latest,
)
from ft_trainer.train.ds_config import build_ds_config, deep_merge, load_override, optimizer_impl
from ft_trainer.train.model import check_weights_match_preset, resolve_init
from ft_trainer.train.schedule import LrSchedule, lr_at, total_optimizer_steps
from ft_trainer.train.settings import train_settings
from ft_trainer.train.throughput import MetricsLog, ThroughputMeter, lookup_peak_flops, mfu, read_metrics
from tests.trainer.conftest import JobWriter

REPO = Path(__file__).resolve().parents[2]


def with_lists(job: Path) -> Path:
    """The ``write_job`` fixture quotes lists; turn ``key = "[a, b]"`` back into TOML arrays."""
    job.write_text(re.sub(r'= "(\[[^"]*\])"', r"= \1", job.read_text()))
    return job


# ------------------------------------------------------------------------------------------- settings
def test_defaults_and_values(write_job: JobWriter) -> None:
    s = train_settings(load_config(write_job()))
    assert (s.train.device, s.train.resume, s.train.save_every_steps, s.train.max_steps) == (
        "auto",
        "auto",
        0,
        0,
    )
    assert (s.optim.lr, s.optim.schedule, s.optim.beta1, s.optim.beta2) == (1e-5, "cosine", 0.9, 0.95)
    assert s.progress.history and s.progress.min_save_bytes_per_s == 500e6
    cfg = load_config(
        with_lists(
            write_job(
                optim={"lr": 2e-4, "betas": [0.8, 0.99], "warmup_ratio": 0.1},
                progress={"job": "ft-7", "init_lease_s": 60},
                metrics={"log_every_steps": 5, "gpu_model": "b300"},
                train={"save_every_steps": 100, "cpu_threads": 2},
            )
        )
    )
    s = train_settings(cfg)
    assert (s.optim.lr, s.optim.beta1, s.optim.beta2, s.optim.warmup_ratio) == (2e-4, 0.8, 0.99, 0.1)
    assert s.progress_job(cfg, env={}) == "ft-7" and s.progress.init_lease_s == 60.0
    assert s.metrics_dir(cfg) == cfg.checkpoint.dir / "metrics"
    assert train_settings(load_config(write_job())).progress_job(cfg, env={"GPU_WATCHDOG_JOB": "j"}) == "j"


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            {"train": {"save_evry_steps": 3}},
            "train.save_evry_steps: unknown key (did you mean 'save_every_steps'?)",
        ),
        ({"optim": {"lr": -1}}, "optim.lr: expected a learning rate > 0, got -1"),
        (
            {"optim": {"betas": [0.9]}},
            "optim.betas: expected two numbers in [0, 1), e.g. [0.9, 0.95], got [0.9]",
        ),
        ({"optim": {"warmup_steps": 5, "warmup_ratio": 0.1}}, "optim.warmup_ratio: expected warmup_steps or"),
        (
            {"optim": {"schedule": "step"}},
            'optim.schedule: expected one of cosine, linear, constant, got "step"',
        ),
        ({"deepspeed": {"bf16": "yes"}}, 'deepspeed.bf16: expected "auto", true or false, got "yes"'),
        ({"deepspeed": {"override": "nope.json"}}, "deepspeed.override: expected an existing JSON file"),
        ({"zero": {"offload_optimizer": "nvme"}}, "deepspeed.nvme_path: expected a local NVMe directory"),
        ({"progress": {"job": "a/b"}}, "progress.job: expected job name 'a/b'"),  # check_job_name's words
        (
            {"progress": {"min_lease_s": 100, "max_lease_s": 10}},
            "progress.max_lease_s: expected >= progress.min",
        ),
        (
            {"metrics": {"gpu_model": "V100"}},
            "metrics.gpu_model: expected one of B300, B200, H200, H100, A100",
        ),
        ({"train": {"init": "pretrained"}}, "train.init: expected model.path or train.weights"),
        ({"train": {"device": "tpu"}}, 'train.device: expected one of auto, cpu, cuda, got "tpu"'),
        (
            {"model": {"preset": "qwen3-32b", "tokenizer": None}},
            "train.weights: expected the qwen3-32b weights (a local Hugging Face directory), or train.init",
        ),
    ],
)
def test_errors_name_file_key_expected_and_actual(write_job: JobWriter, sections: dict, message: str) -> None:
    job = with_lists(write_job(**sections))
    with pytest.raises(ConfigError) as exc:
        train_settings(load_config(job))
    msg = str(exc.value)
    assert len(exc.value.problems) == 1, msg
    found = re.match(rf"{re.escape(str(job))}(?::(\d+))?: ", msg)
    assert found, msg
    key = message.split(":")[0]
    if found.group(1):  # the key's line (a key the file does not have: its section's header)
        line = job.read_text().splitlines()[int(found.group(1)) - 1]
        section, leaf = key.split(".")
        assert line.split(" =")[0] in (leaf, "betas") or line == f"[{section}]", (line, key)
    else:  # only a key whose section the file does not have goes without a line
        assert f"[{key.split('.')[0]}]" not in job.read_text(), msg
    assert message in msg


def test_every_problem_in_the_training_sections_at_once(write_job: JobWriter) -> None:
    job = with_lists(
        write_job(
            train={"device": "tpu", "max_stepz": 3},
            optim={"lr": 0, "betas": [0.9, 1.5]},
            progress={"min_lease_s": 100, "max_lease_s": 10},
        )
    )
    with pytest.raises(ConfigError) as exc:
        train_settings(load_config(job))
    lines = job.read_text().splitlines()
    problems = exc.value.problems
    assert [p.key for p in problems] == [
        "train.device",
        "train.max_stepz",
        "optim.lr",
        "optim.betas",
        "progress.max_lease_s",
    ]
    for problem in problems:  # each at its own line, in file order
        assert problem.line is not None and lines[problem.line - 1].startswith(problem.key.split(".")[1])
    assert [p.line for p in problems] == sorted(p.line for p in problems if p.line is not None)
    assert "optim.betas: expected two numbers in [0, 1), e.g. [0.9, 0.95], got [0.9, 1.5]" in str(exc.value)


# ------------------------------------------------------------------------------------------ ds_config
def test_ds_config_cpu_and_gpu(write_job: JobWriter) -> None:
    cfg = load_config(write_job(optim={"lr": 1e-4, "max_grad_norm": 0.5, "weight_decay": 0.1}))
    s = train_settings(cfg)
    cpu = build_ds_config(cfg, s, device="cpu")
    assert cpu["zero_optimization"]["stage"] == 3
    assert (
        cpu["train_micro_batch_size_per_gpu"],
        cpu["gradient_accumulation_steps"],
        cpu["train_batch_size"],
    ) == (
        2,
        2,
        8,
    )
    assert cpu["bf16"] == {"enabled": False} and cpu["gradient_clipping"] == 0.5
    assert cpu["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True},
    }
    assert "scheduler" not in cpu  # the trainer sets the LR itself, from the pure schedule
    gpu = build_ds_config(cfg, s, device="cuda")
    assert gpu["bf16"] == {"enabled": True} and "torch_adam" not in gpu["optimizer"]["params"]
    assert optimizer_impl(cfg, s, "cuda") == "fused" and optimizer_impl(cfg, s, "cpu") == "torch"
    assert "offload_optimizer" not in gpu["zero_optimization"]

    off = load_config(
        write_job(
            zero={"offload_optimizer": "cpu", "offload_param": "nvme"}, deepspeed={"nvme_path": "/nvme"}
        )
    )
    so = train_settings(off)
    z = build_ds_config(off, so, device="cuda")["zero_optimization"]
    assert z["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert z["offload_param"] == {"device": "nvme", "pin_memory": True, "nvme_path": "/nvme"}
    assert optimizer_impl(off, so, "cuda") == "cpu_adam"


def test_override_is_deep_merged_and_may_not_change_the_batch(write_job: JobWriter, tmp_path: Path) -> None:
    assert deep_merge({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": 5, "c": None}, "e": [1]}) == {
        "a": {"b": 5},
        "d": 3,
        "e": [1],
    }
    (tmp_path / "ds.json").write_text(
        json.dumps(
            {
                "zero_optimization": {"overlap_comm": False, "sub_group_size": 1e9},
                "wall_clock_breakdown": True,
            }
        )
    )
    cfg = load_config(write_job(deepspeed={"override": "ds.json"}))
    s = train_settings(cfg)
    merged = load_override(cfg, s, build_ds_config(cfg, s, device="cpu"))
    assert merged["zero_optimization"]["overlap_comm"] is False and merged["zero_optimization"]["stage"] == 3
    assert merged["zero_optimization"]["sub_group_size"] == 1e9 and merged["wall_clock_breakdown"] is True

    (tmp_path / "ds.json").write_text(json.dumps({"gradient_accumulation_steps": 8}))
    with pytest.raises(ConfigError, match=r"deepspeed\.override: gradient_accumulation_steps: expected 2"):
        load_override(cfg, s, build_ds_config(cfg, s, device="cpu"))
    (tmp_path / "ds.json").write_text("[1, 2")
    with pytest.raises(ConfigError, match=r"ds\.json"):
        load_override(cfg, s, build_ds_config(cfg, s, device="cpu"))


# ------------------------------------------------------------------------------------------- schedule
def test_lr_schedule_warmup_cosine_floor() -> None:
    kw = {"base_lr": 1e-3, "total_steps": 101, "warmup_steps": 10, "min_lr_ratio": 0.1}
    assert lr_at(0, **kw) == pytest.approx(1e-4)
    assert lr_at(9, **kw) == pytest.approx(1e-3)
    assert lr_at(10, **kw) == pytest.approx(1e-3)
    assert lr_at(55, **kw) == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # half-way down the cosine
    assert lr_at(100, **kw) == pytest.approx(1e-4) and lr_at(500, **kw) == pytest.approx(1e-4)
    decay = [lr_at(s, **kw) for s in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(decay))
    assert lr_at(55, **kw, schedule="linear") == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    assert lr_at(70, **kw, schedule="constant") == 1e-3
    with pytest.raises(ValueError):
        lr_at(-1, **kw)
    sched = LrSchedule.build(base_lr=1e-3, total_steps=200, warmup_ratio=0.05, min_lr_ratio=0.0)
    assert sched.warmup_steps == 10 and sched(199) == pytest.approx(0.0, abs=1e-12)
    # a resumed run asks for the same step and gets the same rate: nothing to restore
    again = LrSchedule.build(base_lr=1e-3, total_steps=200, warmup_ratio=0.05, min_lr_ratio=0.0)
    assert [sched(s) for s in range(200)] == [again(s) for s in range(200)]
    assert total_optimizer_steps([21, 20, 19], grad_accum=4) == 5 + 5 + 4


# ----------------------------------------------------------------------------------------- checkpoints
def test_tags_latest_marker_and_pruning(tmp_path: Path) -> None:
    assert tag_for_step(120) == "step-000000120" and step_of_tag("step-000000120") == 120
    assert step_of_tag("global_step120") is None and step_of_tag("step-12") is None
    for step, complete in ((4, True), (8, True), (12, True), (16, False)):
        d = tmp_path / tag_for_step(step)
        d.mkdir()
        (d / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x")
        if complete:
            (d / COMPLETE_FILE).write_text("{}")
    (tmp_path / "unrelated").mkdir()
    infos = list_checkpoints(tmp_path)
    assert [(c.step, c.complete) for c in infos] == [(4, True), (8, True), (12, True), (16, False)]
    assert read_latest(tmp_path) is None
    write_latest(tmp_path, tag_for_step(12))
    assert (tmp_path / LATEST_FILE).read_text() == "step-000000012"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert read_latest(tmp_path) == "step-000000012"
    write_latest(tmp_path, tag_for_step(16))  # a marker naming a half checkpoint is not believed
    assert read_latest(tmp_path) is None
    doomed = prune_selection(infos, "step-000000012", keep_last=2)
    assert [c.step for c in doomed] == [4]  # never the incomplete one (removed at start-up instead)
    assert [c.step for c in prune_selection(infos, "step-000000004", keep_last=1)] == [8]
    fake = [CheckpointInfo(tag_for_step(i), i, tmp_path, True) for i in range(5)]
    assert [c.step for c in prune_selection(fake, tag_for_step(4), keep_last=3)] == [0, 1]


def test_leases_from_measured_save_throughput() -> None:
    # first save of Qwen3-32B: nothing measured, the size by formula at the configured 500 MB/s
    first = checkpoint_bytes(PRESETS["qwen3-32b"].params)
    assert save_lease_s(first, 500e6, factor=2.0, slack_s=30.0, min_s=30.0, max_s=7200.0) == pytest.approx(
        2.0 * first / 500e6 + 30.0
    )
    # measured: 525 GB at 4 GB/s -> 2 x 131 s + 30 s
    assert save_lease_s(525e9, 4e9) == pytest.approx(2 * 131.25 + 30)
    assert save_lease_s(1e6, 1e9) == pytest.approx(30.002)  # 2 x 1 ms + 30 s slack
    assert save_lease_s(1e6, 1e9, slack_s=0.0) == 30.0  # clamped to the minimum
    assert save_lease_s(1e15, 1e6, max_s=3600) == 3600.0
    with pytest.raises(ValueError):
        save_lease_s(1.0, 0.0)
    assert duration_lease_s(None, 60.0) == 60.0
    assert duration_lease_s(12.0, 60.0, factor=2.0, slack_s=30.0) == 54.0
    assert duration_lease_s(0.01, 60.0, slack_s=0.0, min_s=30.0) == 30.0
    assert parse_fault(None) is None and parse_fault("crash_in_save:16") == (16, 0)
    assert parse_fault("crash_in_save:16:1") == (16, 1)
    with pytest.raises(ValueError, match="crash_in_save:STEP"):
        parse_fault("boom")


# ----------------------------------------------------------------------------------------- throughput
def test_peak_table_mfu_and_meter(tmp_path: Path) -> None:
    assert lookup_peak_flops("NVIDIA H100 80GB HBM3") == ("H100", 989.4e12)
    assert lookup_peak_flops("NVIDIA H200") == ("H200", 989.4e12)
    assert lookup_peak_flops("NVIDIA B300 SXM6 AC") == ("B300", 2.25e15)
    assert lookup_peak_flops("NVIDIA A100-SXM4-80GB") == ("A100", 312e12)
    assert lookup_peak_flops("Tesla V100-SXM2-32GB") is None
    spec = PRESETS["qwen3-32b"]
    # the reference job: ~53k tokens/s on 16 B300 at seq_len 4096
    value = mfu(53_000, spec.flops_per_token(4096), 16, 2.25e15)
    assert value == pytest.approx(53_000 * spec.flops_per_token(4096) / (16 * 2.25e15))
    assert 0.25 < value < 0.40
    with pytest.raises(ValueError):
        mfu(1.0, 1.0, 0, 1.0)

    meter = ThroughputMeter(
        tokens_per_step=1000, flops_per_token=6e3, devices=4, peak_flops_per_device=1e9, start_s=100.0
    )
    meter.start_interval(100.0)
    for _ in range(5):
        meter.add_step()
    nums = meter.close_interval(110.0)
    assert (
        nums["tokens_per_s"] == 500.0
        and nums["step_time_s"] == 2.0
        and nums["tokens_per_s_per_device"] == 125
    )
    assert nums["mfu"] == pytest.approx(500 * 6e3 / 4e9)
    assert nums["gpu_hours"] == pytest.approx(4 * 10 / 3600)
    meter.elapsed_before_s = 3600.0  # a resumed run carries the GPU-hours of the segments before it
    meter.add_step()
    assert meter.close_interval(112.0)["gpu_hours"] == pytest.approx(4 * (3600 + 12) / 3600)
    assert ThroughputMeter(1, 1.0, 1, None, 0.0).close_interval(1.0)["mfu"] is None

    log = MetricsLog(tmp_path / "m" / "metrics.jsonl")
    log.write("step", step=1, loss=2.5)
    log.write("step", step=2, loss=2.0)
    log.close()
    with open(tmp_path / "m" / "metrics.jsonl", "a") as f:
        f.write('{"kind": "step", "ste')  # killed mid-write
    recs = read_metrics(tmp_path / "m" / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2] and all(math.isfinite(r["time"]) for r in recs)
    MetricsLog(None).write("step", step=1)  # other ranks: a no-op


# ------------------------------------------------------------------------------------------------ model
def test_init_modes_and_preset_weights_check(write_job: JobWriter, tmp_path: Path) -> None:
    cfg = load_config(write_job())
    assert resolve_init(cfg, train_settings(cfg)) == ("random", None)
    weights = tmp_path / "w"
    weights.mkdir()
    spec = PRESETS["tiny-qwen3"]
    hf = spec.hf_config_dict()
    (weights / "config.json").write_text(json.dumps(hf))
    cfg = load_config(write_job(train={"weights": str(weights)}))
    assert resolve_init(cfg, train_settings(cfg)) == ("pretrained", weights)
    check_weights_match_preset(spec, weights, cfg.path)
    (weights / "config.json").write_text(json.dumps(hf | {"num_hidden_layers": 4, "hidden_size": 128}))
    with pytest.raises(
        ConfigError, match=r"is not a tiny-qwen3: hidden_size: preset 64, weights 128; num_layers"
    ):
        check_weights_match_preset(spec, weights, cfg.path)


# -------------------------------------------------------------------------------------- command line
def _ft_trainer(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ft_trainer.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_train_refuses_bad_jobs_and_launches_with_exit_2(write_job: JobWriter, tmp_path: Path) -> None:
    bad = write_job(name="bad.toml", optim={"lr": 0})
    proc = _ft_trainer("train", "--config", str(bad))
    lr_line = bad.read_text().splitlines().index("lr = 0") + 1
    assert proc.returncode == 2
    assert f"{bad}:{lr_line}: optim.lr: expected a learning rate > 0, got 0" in proc.stderr

    # the launcher started 1 rank, the job (and its plan) is for 2
    job = write_job(name="good.toml")
    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "GPU_WATCHDOG_PROGRESS_DIR": str(tmp_path / "p"),
    }
    proc = _ft_trainer("train", "--config", str(job), env=env)
    assert proc.returncode == 2, proc.stderr
    assert "the launcher started 1 ranks (WORLD_SIZE) but cluster.world_size is 2" in proc.stderr
    # its init phase was announced (with a lease) before the refusal
    rec = json.loads((tmp_path / "p" / "tiny" / "rank-0.json").read_text())
    assert rec["phase"] == "init" and rec["lease_until"] > rec["time"]

    proc = _ft_trainer("train", "--config", str(job), env={"RANK": "3", "WORLD_SIZE": "2"})
    assert proc.returncode == 2 and "RANK 3, LOCAL_RANK 0, WORLD_SIZE 2: inconsistent" in proc.stderr
    helptext = _ft_trainer("train", "--help").stdout
    assert "deepspeed --hostfile hostfile --no_local_rank --module ft_trainer.cli train" in helptext
