"""The sections of the job file that only ``ft-trainer train`` reads: ``[train]``, ``[optim]``,
``[deepspeed]``, ``[progress]`` and ``[metrics]`` - the training component's own configuration.

:func:`~ft_trainer.config.load_config` keeps them raw in ``JobConfig.extra``; :func:`train_settings` reads
them into the dataclasses below the same way (:mod:`gpu_triage.model.config_schema`: types, ranges,
unknown keys with a "did you mean", relative paths against the job file, each default written once on
its field) and raises one :class:`~ft_trainer.config.ConfigError` listing every problem with its file,
line and key. Every key and default is documented in ``docs/training.md``. Pure: no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ft_trainer.config import ConfigError, JobConfig
from ft_trainer.train.throughput import PEAK_BF16_DENSE_FLOPS
from gpu_triage.contract import check_job_name
from gpu_triage.model.config_schema import MISSING, Invalid, setting

__all__ = [
    "DeepSpeedSettings",
    "MetricsSettings",
    "OptimSettings",
    "ProgressSettings",
    "Settings",
    "TrainSettings",
    "train_settings",
]

RANDOM_BY_DEFAULT = frozenset({"tiny-qwen3"})  # presets that are random models (CPU tests)


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """``[train]``."""

    device: Literal["auto", "cpu", "cuda"] = setting(
        "auto", doc="auto = cuda when torch sees a GPU, else cpu (DS_ACCELERATOR=cpu, gloo)"
    )
    dist_backend: Literal["auto", "gloo", "nccl"] = setting("auto", doc="auto = nccl on cuda, gloo on cpu")
    collective_timeout_s: float = setting(1800.0, ge=10, expected="seconds >= 10")
    init: Literal["auto", "pretrained", "random"] = setting(
        "auto", doc="auto = pretrained when model.path (or train.weights) is set, else random"
    )
    weights: Path | None = setting(None, doc="pretrained weights for a preset (a local HF directory)")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    save_every_steps: int = setting(0, ge=0, expected="an integer >= 0 (0 = epoch ends only)")
    save_every_epoch: bool = True
    save_at_end: bool = True
    max_steps: int = setting(
        0, ge=0, expected="an integer >= 0 (0 = no limit)", doc="stop after this optimizer step"
    )
    resume: Literal["auto", "never"] = setting("auto", doc="auto = from the checkpoint directory's latest")
    cpu_threads: int = setting(0, ge=0, expected="an integer >= 0 (0 = default)")


@dataclass(frozen=True, kw_only=True)
class OptimSettings:
    """``[optim]``."""

    lr: float = setting(1e-5, gt=0, expected="a learning rate > 0")
    min_lr_ratio: float = setting(0.1, ge=0, le=1, expected="a fraction 0..1")
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: int = setting(0, ge=0)
    warmup_ratio: float = setting(0.0, ge=0, lt=1, expected="a fraction 0..1 (exclusive)")
    total_steps: int = setting(0, ge=0, expected="an integer >= 0 (0 = from the plan)")
    weight_decay: float = setting(0.0, ge=0)
    betas: tuple[float, float] = setting(
        (0.9, 0.95), ge=0, lt=1, expected="two numbers in [0, 1), e.g. [0.9, 0.95]"
    )
    eps: float = setting(1e-8, gt=0)
    max_grad_norm: float = setting(1.0, ge=0, expected="a number >= 0 (0 = off)")
    implementation: Literal["auto", "torch", "fused", "cpu_adam"] = setting(
        "auto", doc="auto = fused on GPU, torch on CPU, cpu_adam with optimizer offload"
    )

    @property
    def beta1(self) -> float:
        return self.betas[0]

    @property
    def beta2(self) -> float:
        return self.betas[1]


def _bf16(value: Any) -> str:
    """``bf16 = "auto" | true | false`` as ``"auto"``, ``"on"``, ``"off"``."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    raise Invalid('"auto", true or false')


@dataclass(frozen=True, kw_only=True)
class DeepSpeedSettings:
    """``[deepspeed]``."""

    override: Path | None = setting(None, doc="JSON deep-merged over the generated config (experts)")
    bf16: str = setting("auto", parse=_bf16, doc="auto = on for cuda, off (fp32) for cpu")
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = setting(50_000_000, ge=1, expected="bytes >= 1")
    stage3_prefetch_bucket_size: int = setting(50_000_000, ge=0)
    stage3_param_persistence_threshold: int = setting(100_000, ge=0)
    stage3_max_live_parameters: int = setting(1_000_000_000, ge=1)
    stage3_gather_16bit_weights_on_model_save: bool = False
    nvme_path: Path | None = setting(None, doc="needed when [zero] offloads to nvme")


@dataclass(frozen=True, kw_only=True)
class ProgressSettings:
    """``[progress]``."""

    enabled: bool = True
    job: str | None = setting(
        None, nonempty=True, expected="a job name", doc="default: $GPU_WATCHDOG_JOB, else job.name"
    )
    dir: Path | None = setting(
        None, doc="default: $GPU_WATCHDOG_PROGRESS_DIR, else /run/gpu-watchdog/progress"
    )
    init_lease_s: float = setting(900.0, gt=0, expected="seconds > 0")
    epoch_end_lease_s: float = setting(
        60.0, gt=0, expected="seconds > 0", doc="first estimate; later ones from measured epoch ends"
    )
    done_lease_s: float = setting(60.0, gt=0, expected="seconds > 0")
    min_save_bytes_per_s: float = setting(
        500e6, gt=0, expected="bytes per second > 0", doc="first-save estimate of checkpoint throughput"
    )
    lease_factor: float = setting(2.0, ge=1, expected="a factor >= 1")
    lease_slack_s: float = setting(30.0, ge=0, expected="seconds >= 0")
    min_lease_s: float = setting(30.0, gt=0, expected="seconds > 0")
    max_lease_s: float = setting(7200.0, gt=0, expected="seconds > 0")
    history: bool = setting(True, doc="also append every record to <metrics dir>/progress/rank-N.jsonl")


@dataclass(frozen=True, kw_only=True)
class MetricsSettings:
    """``[metrics]``."""

    dir: Path | None = setting(None, doc="default: <checkpoint.dir>/metrics")
    log_every_steps: int = setting(1, ge=1)
    peak_flops_per_device: float | None = setting(
        None, gt=0, expected="FLOP/s > 0 (e.g. 2.25e15)", doc="default: the GPU table, or measured on CPU"
    )
    gpu_model: str | None = setting(
        None, nonempty=True, expected="a GPU model name", doc='override the table lookup (e.g. "B300")'
    )


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


def train_settings(cfg: JobConfig) -> Settings:
    """Read ``cfg.extra``'s training sections; one :class:`ConfigError` listing every problem."""
    reader = cfg.reader()
    model = cfg.model

    train = reader.read(TrainSettings, cfg.extra.get("train", {}), "train")
    if train is not None:
        if train.init == "pretrained" and model.path is None and train.weights is None:
            reader.expected(
                "train.init",
                "model.path or train.weights (a local directory with the weights) for init = 'pretrained'",
                "pretrained",
            )
        if (
            train.init == "auto"
            and model.path is None
            and train.weights is None
            and model.preset not in RANDOM_BY_DEFAULT
        ):
            reader.expected(
                "train.weights",
                f"the {model.preset} weights (a local Hugging Face directory), or train.init = 'random' "
                "for a throughput test (fine-tuning starts from pretrained weights)",
                MISSING,
            )
        if train.weights is not None and model.preset is None:
            reader.problem(
                "train.weights", "expected only with model.preset (model.path already names the weights)"
            )

    optim = reader.read(OptimSettings, cfg.extra.get("optim", {}), "optim")
    if optim is not None and optim.warmup_steps and optim.warmup_ratio:
        reader.expected("optim.warmup_ratio", "warmup_steps or warmup_ratio, not both", optim.warmup_ratio)

    ds = reader.read(DeepSpeedSettings, cfg.extra.get("deepspeed", {}), "deepspeed")
    if ds is not None:
        if ds.override is not None and not ds.override.is_file():
            reader.expected("deepspeed.override", "an existing JSON file", str(ds.override))
        if "nvme" in (cfg.zero.offload_optimizer, cfg.zero.offload_param) and ds.nvme_path is None:
            reader.expected(
                "deepspeed.nvme_path", "a local NVMe directory (required by zero offload to 'nvme')", MISSING
            )

    progress = reader.read(ProgressSettings, cfg.extra.get("progress", {}), "progress")
    if progress is not None:
        if progress.max_lease_s < progress.min_lease_s:
            reader.expected(
                "progress.max_lease_s",
                f">= progress.min_lease_s ({progress.min_lease_s})",
                progress.max_lease_s,
            )
        if progress.job is not None:
            try:
                check_job_name(progress.job)
            except ValueError as exc:
                reader.expected("progress.job", str(exc), progress.job)

    metrics = reader.read(MetricsSettings, cfg.extra.get("metrics", {}), "metrics")
    gpu_model = metrics.gpu_model if metrics is not None else None
    if gpu_model is not None and gpu_model.upper() not in PEAK_BF16_DENSE_FLOPS:
        reader.expected("metrics.gpu_model", "one of " + ", ".join(PEAK_BF16_DENSE_FLOPS), gpu_model)

    reader.raise_if_any(ConfigError.of)
    assert train and optim and ds and progress and metrics  # else raise_if_any raised
    return Settings(train=train, optim=optim, deepspeed=ds, progress=progress, metrics=metrics)
