"""The DeepSpeed configuration, generated from the job file (pure: no torch, no DeepSpeed).

:func:`build_ds_config` maps the job onto DeepSpeed's JSON: ZeRO stage 3 with the ``[zero]`` offload
choices and the ``[deepspeed]`` tuning keys, bf16 on GPU and fp32 on CPU, AdamW with ``[optim]``'s
hyper-parameters, gradient clipping, the micro-batch and gradient-accumulation sizes. There is no
DeepSpeed ``scheduler`` section: the learning rate comes from :mod:`ft_trainer.train.schedule`, set by the
trainer before each optimizer step, so a resume restores it exactly.

Experts can deep-merge a JSON file over the result (``deepspeed.override``); :func:`deep_merge` replaces
leaves and merges tables, and a ``null`` in the override deletes the key. The batch keys are checked
after the merge: an override may not change the batch arithmetic behind the gate's plan.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from ft_trainer.config import ConfigError, JobConfig
from ft_trainer.train.settings import Settings

__all__ = ["bf16_enabled", "build_ds_config", "deep_merge", "load_override", "optimizer_impl"]

NEVER_PRINT_STEPS = 1 << 30


def bf16_enabled(settings: Settings, device: str) -> bool:
    """bf16 when asked, or (``auto``) on GPU; fp32 on CPU."""
    mode = settings.deepspeed.bf16
    return mode == "on" or (mode == "auto" and device == "cuda")


def optimizer_impl(cfg: JobConfig, settings: Settings, device: str) -> str:
    """Which AdamW runs: ``cpu_adam`` when the optimizer is offloaded (DeepSpeed requires it), ``fused``
    (DeepSpeed's FusedAdam, JIT-built) on GPU, ``torch`` (torch.optim.AdamW) on CPU."""
    impl = settings.optim.implementation
    if impl != "auto":
        return impl
    if cfg.zero.offload_optimizer != "none":
        return "cpu_adam"
    return "fused" if device == "cuda" else "torch"


def _offload(kind: str, settings: Settings) -> dict[str, Any] | None:
    if kind == "none":
        return None
    out: dict[str, Any] = {"device": kind, "pin_memory": True}
    if kind == "nvme":
        out["nvme_path"] = str(settings.deepspeed.nvme_path)
    return out


def build_ds_config(cfg: JobConfig, settings: Settings, *, device: str) -> dict[str, Any]:
    """DeepSpeed's config dict for ``cfg`` on ``device`` (``cpu`` or ``cuda``), before any override."""
    d, o, s = cfg.data, settings.optim, settings.deepspeed
    zero: dict[str, Any] = {
        "stage": 3,
        "overlap_comm": s.overlap_comm,
        "contiguous_gradients": s.contiguous_gradients,
        "reduce_bucket_size": s.reduce_bucket_size,
        "stage3_prefetch_bucket_size": s.stage3_prefetch_bucket_size,
        "stage3_param_persistence_threshold": s.stage3_param_persistence_threshold,
        "stage3_max_live_parameters": s.stage3_max_live_parameters,
        "stage3_gather_16bit_weights_on_model_save": s.stage3_gather_16bit_weights_on_model_save,
    }
    for key, kind in (
        ("offload_optimizer", cfg.zero.offload_optimizer),
        ("offload_param", cfg.zero.offload_param),
    ):
        off = _offload(kind, settings)
        if off is not None:
            zero[key] = off
    params: dict[str, Any] = {
        "lr": o.lr,
        "betas": [o.beta1, o.beta2],
        "eps": o.eps,
        "weight_decay": o.weight_decay,
    }
    impl = optimizer_impl(cfg, settings, device)
    if impl == "torch":
        params["torch_adam"] = True
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": d.micro_batch,
        "gradient_accumulation_steps": d.grad_accum,
        "train_batch_size": d.micro_batch * d.grad_accum * cfg.cluster.world_size,
        "gradient_clipping": o.max_grad_norm,
        "bf16": {"enabled": bf16_enabled(settings, device)},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": params},
        "zero_allow_untested_optimizer": impl == "torch",
        "zero_force_ds_cpu_optimizer": impl == "cpu_adam",
        "steps_per_print": NEVER_PRINT_STEPS,
        "wall_clock_breakdown": False,
    }
    return config


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged in: tables merge recursively, other values replace, and a
    ``None`` value removes the key. Neither input is modified."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_override(cfg: JobConfig, settings: Settings, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with ``deepspeed.override`` (if any) merged in; :class:`ConfigError` for a bad file or
    an override that changes the batch arithmetic or the ZeRO stage."""
    path: Path | None = settings.deepspeed.override
    if path is None:
        return config
    try:
        override = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(cfg.path, "deepspeed.override", message=f"cannot read {path}: {exc}") from None
    if not isinstance(override, dict):
        raise ConfigError(cfg.path, "deepspeed.override", "a JSON object", type(override).__name__)
    merged = deep_merge(config, override)
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        if merged.get(key) != config[key]:
            raise ConfigError(
                cfg.path,
                f"deepspeed.override: {key}",
                f"{config[key]} (set by [data] and [cluster]; the plan and the gate depend on it)",
                merged.get(key),
            )
    if merged.get("zero_optimization", {}).get("stage") != 3:
        raise ConfigError(
            cfg.path, "deepspeed.override: zero_optimization.stage", "3", merged.get("zero_optimization")
        )
    return merged
