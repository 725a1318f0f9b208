"""The sections of the job file that only ``ft-trainer train`` reads: ``[train]``, ``[optim]``,
``[deepspeed]``, ``[progress]`` and ``[metrics]``.

:func:`load_config` keeps them raw in ``JobConfig.extra``; :func:`train_settings` validates them the same
way (types, ranges, unknown keys with a "did you mean", relative paths against the job file) and raises
:class:`~ft_trainer.config.ConfigError` naming the file, the key, what was expected and what was found.
Every key and default is documented in ``docs/training.md``. Pure: no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ft_trainer.config import ConfigError, JobConfig, _Section

__all__ = [
    "DeepSpeedSettings",
    "MetricsSettings",
    "OptimSettings",
    "ProgressSettings",
    "Settings",
    "TrainSettings",
    "train_settings",
]

SCHEDULES = ("cosine", "linear", "constant")
OPTIMIZER_IMPLS = ("auto", "torch", "fused", "cpu_adam")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
INITS = ("auto", "pretrained", "random")
RESUME = ("auto", "never")
ATTN = ("sdpa", "eager", "flash_attention_2")
RANDOM_BY_DEFAULT = frozenset({"tiny-qwen3"})  # presets that are random models (CPU tests)


@dataclass(frozen=True)
class TrainSettings:
    device: str = "auto"  # auto = cuda when torch sees a GPU, else cpu (DS_ACCELERATOR=cpu, gloo)
    dist_backend: str = "auto"  # auto = nccl on cuda, gloo on cpu
    collective_timeout_s: float = 1800.0
    init: str = "auto"  # auto = pretrained when model.path (or train.weights) is set, else random
    weights: Path | None = None  # pretrained weights for a preset (a local HF directory)
    attn_implementation: str = "sdpa"
    save_every_steps: int = 0  # 0 = only at epoch ends (save_every_epoch) and at the end
    save_every_epoch: bool = True
    save_at_end: bool = True
    max_steps: int = 0  # stop after this optimizer step (0 = run every epoch); the LR schedule is unchanged
    resume: str = "auto"  # auto = from the checkpoint directory's "latest" if there is one; never
    cpu_threads: int = 0  # torch intra-op threads per rank on CPU (0 = torch's default)


@dataclass(frozen=True)
class OptimSettings:
    lr: float = 1e-5
    min_lr_ratio: float = 0.1
    schedule: str = "cosine"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0  # used when warmup_steps = 0
    total_steps: int = 0  # 0 = computed from the plan of every epoch
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    max_grad_norm: float = 1.0  # 0 = no clipping
    implementation: str = "auto"  # auto = fused on GPU, torch on CPU, cpu_adam with optimizer offload


@dataclass(frozen=True)
class DeepSpeedSettings:
    override: Path | None = None  # JSON deep-merged over the generated config (experts)
    bf16: str = "auto"  # auto = on for cuda, off (fp32) for cpu
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 50_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_gather_16bit_weights_on_model_save: bool = False
    nvme_path: Path | None = None  # needed when [zero] offloads to nvme


@dataclass(frozen=True)
class ProgressSettings:
    enabled: bool = True
    job: str | None = None  # default: $GPU_WATCHDOG_JOB, else job.name
    dir: Path | None = None  # default: $GPU_WATCHDOG_PROGRESS_DIR, else /run/gpu-watchdog/progress
    init_lease_s: float = 900.0
    epoch_end_lease_s: float = 60.0  # first estimate; later ones from measured epoch-end durations
    done_lease_s: float = 60.0
    min_save_bytes_per_s: float = 500e6  # first-save estimate of aggregate checkpoint write throughput
    lease_factor: float = 2.0
    lease_slack_s: float = 30.0
    min_lease_s: float = 30.0
    max_lease_s: float = 7200.0
    history: bool = True  # also append every record written to <metrics dir>/progress/rank-N.jsonl


@dataclass(frozen=True)
class MetricsSettings:
    dir: Path | None = None  # default: <checkpoint.dir>/metrics
    log_every_steps: int = 1
    peak_flops_per_device: float | None = None  # default: the GPU table, or measured on CPU
    gpu_model: str | None = None  # override the table lookup by device name (e.g. "B300")


@dataclass(frozen=True)
class Settings:
    train: TrainSettings
    optim: OptimSettings
    deepspeed: DeepSpeedSettings
    progress: ProgressSettings
    metrics: MetricsSettings

    def progress_job(self, cfg: JobConfig, env: Mapping[str, str] | None = None) -> str:
        env = os.environ if env is None else env
        return self.progress.job or env.get("GPU_WATCHDOG_JOB") or cfg.name

    def metrics_dir(self, cfg: JobConfig) -> Path:
        return self.metrics.dir or (cfg.checkpoint.dir / "metrics")


def _pos(v: Any) -> bool:
    return v >= 1


def _nonneg(v: Any) -> bool:
    return v >= 0


def _gt0(v: Any) -> bool:
    return v > 0


def train_settings(cfg: JobConfig) -> Settings:
    """Validate ``cfg.extra``'s training sections; :class:`ConfigError` on the first problem."""
    f = cfg.path
    base = Path(cfg.path).resolve().parent

    def section(name: str) -> _Section:
        return _Section(f, name, cfg.extra.get(name, {}), base)

    t = section("train")
    train = TrainSettings(
        device=t.choice("device", DEVICES, "auto"),
        dist_backend=t.choice("dist_backend", BACKENDS, "auto"),
        collective_timeout_s=t.get(
            "collective_timeout_s", "float", 1800.0, check=lambda v: v >= 10, expected="seconds >= 10"
        ),
        init=t.choice("init", INITS, "auto"),
        weights=t.get("weights", "path", None),
        attn_implementation=t.choice("attn_implementation", ATTN, "sdpa"),
        save_every_steps=t.get(
            "save_every_steps", "int", 0, check=_nonneg, expected="an integer >= 0 (0 = epoch ends only)"
        ),
        save_every_epoch=t.get("save_every_epoch", "bool", True),
        save_at_end=t.get("save_at_end", "bool", True),
        max_steps=t.get("max_steps", "int", 0, check=_nonneg, expected="an integer >= 0 (0 = no limit)"),
        resume=t.choice("resume", RESUME, "auto"),
        cpu_threads=t.get("cpu_threads", "int", 0, check=_nonneg, expected="an integer >= 0 (0 = default)"),
    )
    t.finish()
    if train.init == "pretrained" and cfg.model.path is None and train.weights is None:
        raise ConfigError(
            f,
            "train.init",
            "model.path or train.weights (a local directory with the weights) for init = 'pretrained'",
            "pretrained",
        )
    if (
        train.init == "auto"
        and cfg.model.path is None
        and train.weights is None
        and cfg.model.preset not in RANDOM_BY_DEFAULT
    ):
        raise ConfigError(
            f,
            "train.weights",
            f"the {cfg.model.preset} weights (a local Hugging Face directory), or train.init = 'random' "
            "for a throughput test (fine-tuning starts from pretrained weights)",
            "missing",
        )
    if train.weights is not None and cfg.model.preset is None:
        raise ConfigError(
            f, "train.weights", "only with model.preset (model.path already names the weights)", "set"
        )

    o = section("optim")
    warmup_steps = o.get("warmup_steps", "int", 0, check=_nonneg, expected="an integer >= 0")
    betas = o.table.get("betas", [0.9, 0.95])
    o.known.add("betas")
    if (
        not isinstance(betas, list)
        or len(betas) != 2
        or not all(isinstance(b, int | float) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)
    ):
        raise ConfigError(f, "optim.betas", "two numbers in [0, 1), e.g. [0.9, 0.95]", betas)
    optim = OptimSettings(
        lr=o.get("lr", "float", 1e-5, check=_gt0, expected="a learning rate > 0"),
        min_lr_ratio=o.get(
            "min_lr_ratio", "float", 0.1, check=lambda v: 0 <= v <= 1, expected="a fraction 0..1"
        ),
        schedule=o.choice("schedule", SCHEDULES, "cosine"),
        warmup_steps=warmup_steps,
        warmup_ratio=o.get(
            "warmup_ratio", "float", 0.0, check=lambda v: 0 <= v < 1, expected="a fraction 0..1 (exclusive)"
        ),
        total_steps=o.get(
            "total_steps", "int", 0, check=_nonneg, expected="an integer >= 0 (0 = from the plan)"
        ),
        weight_decay=o.get("weight_decay", "float", 0.0, check=_nonneg, expected="a number >= 0"),
        beta1=float(betas[0]),
        beta2=float(betas[1]),
        eps=o.get("eps", "float", 1e-8, check=_gt0, expected="a number > 0"),
        max_grad_norm=o.get("max_grad_norm", "float", 1.0, check=_nonneg, expected="a number >= 0 (0 = off)"),
        implementation=o.choice("implementation", OPTIMIZER_IMPLS, "auto"),
    )
    o.finish()
    if optim.warmup_steps and optim.warmup_ratio:
        raise ConfigError(
            f, "optim.warmup_ratio", "warmup_steps or warmup_ratio, not both", optim.warmup_ratio
        )

    d = section("deepspeed")
    ds = DeepSpeedSettings(
        override=d.get("override", "path", None),
        bf16=_bf16(d),
        overlap_comm=d.get("overlap_comm", "bool", True),
        contiguous_gradients=d.get("contiguous_gradients", "bool", True),
        reduce_bucket_size=d.get("reduce_bucket_size", "int", 50_000_000, check=_pos, expected="bytes >= 1"),
        stage3_prefetch_bucket_size=d.get(
            "stage3_prefetch_bucket_size", "int", 50_000_000, check=_nonneg, expected="an integer >= 0"
        ),
        stage3_param_persistence_threshold=d.get(
            "stage3_param_persistence_threshold", "int", 100_000, check=_nonneg, expected="an integer >= 0"
        ),
        stage3_max_live_parameters=d.get(
            "stage3_max_live_parameters", "int", 1_000_000_000, check=_pos, expected="an integer >= 1"
        ),
        stage3_gather_16bit_weights_on_model_save=d.get(
            "stage3_gather_16bit_weights_on_model_save", "bool", False
        ),
        nvme_path=d.get("nvme_path", "path", None),
    )
    d.finish()
    if ds.override is not None and not ds.override.is_file():
        raise ConfigError(f, "deepspeed.override", "an existing JSON file", str(ds.override))
    if "nvme" in (cfg.zero.offload_optimizer, cfg.zero.offload_param) and ds.nvme_path is None:
        raise ConfigError(
            f, "deepspeed.nvme_path", "a local NVMe directory (required by zero offload to 'nvme')", "missing"
        )

    p = section("progress")
    lease = {"check": _gt0, "expected": "seconds > 0"}
    progress = ProgressSettings(
        enabled=p.get("enabled", "bool", True),
        job=p.get("job", "str", None, check=lambda v: v != "", expected="a job name"),
        dir=p.get("dir", "path", None),
        init_lease_s=p.get("init_lease_s", "float", 900.0, **lease),
        epoch_end_lease_s=p.get("epoch_end_lease_s", "float", 60.0, **lease),
        done_lease_s=p.get("done_lease_s", "float", 60.0, **lease),
        min_save_bytes_per_s=p.get(
            "min_save_bytes_per_s", "float", 500e6, check=_gt0, expected="bytes per second > 0"
        ),
        lease_factor=p.get("lease_factor", "float", 2.0, check=lambda v: v >= 1, expected="a factor >= 1"),
        lease_slack_s=p.get("lease_slack_s", "float", 30.0, check=_nonneg, expected="seconds >= 0"),
        min_lease_s=p.get("min_lease_s", "float", 30.0, **lease),
        max_lease_s=p.get("max_lease_s", "float", 7200.0, **lease),
        history=p.get("history", "bool", True),
    )
    p.finish()
    if progress.max_lease_s < progress.min_lease_s:
        raise ConfigError(
            f,
            "progress.max_lease_s",
            f">= progress.min_lease_s ({progress.min_lease_s})",
            progress.max_lease_s,
        )
    if progress.job is not None:
        from ft_trainer.progress import check_job_name

        try:
            check_job_name(progress.job)
        except ValueError as exc:
            raise ConfigError(f, "progress.job", str(exc), progress.job) from None

    m = section("metrics")
    metrics = MetricsSettings(
        dir=m.get("dir", "path", None),
        log_every_steps=m.get("log_every_steps", "int", 1, check=_pos, expected="an integer >= 1"),
        peak_flops_per_device=m.get(
            "peak_flops_per_device", "float", None, check=_gt0, expected="FLOP/s > 0 (e.g. 2.25e15)"
        ),
        gpu_model=m.get("gpu_model", "str", None, check=lambda v: v != "", expected="a GPU model name"),
    )
    m.finish()
    if metrics.gpu_model is not None:
        from ft_trainer.train.throughput import PEAK_BF16_DENSE_FLOPS

        if metrics.gpu_model.upper() not in PEAK_BF16_DENSE_FLOPS:
            raise ConfigError(
                f, "metrics.gpu_model", "one of " + ", ".join(PEAK_BF16_DENSE_FLOPS), metrics.gpu_model
            )
    return Settings(train=train, optim=optim, deepspeed=ds, progress=progress, metrics=metrics)


def _bf16(d: _Section) -> str:
    """``bf16 = "auto" | true | false``."""
    d.known.add("bf16")
    v = d.table.get("bf16", "auto")
    if v == "auto":
        return "auto"
    if isinstance(v, bool):
        return "on" if v else "off"
    raise ConfigError(d.file, "deepspeed.bf16", '"auto", true or false', v)
