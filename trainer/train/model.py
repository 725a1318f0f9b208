"""The model: a Hugging Face causal LM built for DeepSpeed ZeRO-3. Nothing is downloaded.

- ``model.path = DIR``: any local Hugging Face causal LM (``AutoModelForCausalLM.from_pretrained(DIR,
  local_files_only=True)``), weights included (``train.init = "random"`` builds it from its config.json
  instead).
- ``model.preset = "qwen3-32b"``: the Qwen3-32B architecture (:mod:`ft_trainer.planning.presets`); the
  weights come from ``train.weights = DIR`` (a local copy of Qwen/Qwen3-32B, whose config.json must
  match the preset), or ``train.init = "random"`` for throughput tests.
- ``model.preset = "tiny-qwen3"``: a random-initialised two-layer Qwen3 for CPU tests.

With ``zero.zero_init`` (default) the model is built under ``deepspeed.zero.Init`` through transformers'
``HfDeepSpeedConfig``, so each rank only ever holds its partition (a 32B model never materialises on one
GPU); transformers then initialises random weights with the gathered parameters, or loads the
pretrained ones shard by shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ft_trainer.config import ConfigError, JobConfig
from ft_trainer.planning.presets import ModelSpec, from_hf_config
from ft_trainer.train.settings import Settings

__all__ = ["BuiltModel", "build_model", "check_weights_match_preset", "resolve_init"]

ARCH_FIELDS = (
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
)


def resolve_init(cfg: JobConfig, settings: Settings) -> tuple[str, Path | None]:
    """("pretrained", weights directory) or ("random", None)."""
    weights = cfg.model.path or settings.train.weights
    init = settings.train.init
    if init == "auto":
        init = "pretrained" if weights is not None else "random"
    if init == "pretrained":
        if weights is None:
            raise ConfigError(
                cfg.path, "train.init", "model.path or train.weights for pretrained weights", init
            )
        return "pretrained", weights
    return "random", None


def check_weights_match_preset(spec: ModelSpec, weights: Path, job_file: Path) -> None:
    """The weights' config.json describes the preset's architecture (else a :class:`ConfigError`)."""
    try:
        theirs = from_hf_config(weights)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            job_file,
            "train.weights",
            "a local model directory with config.json",
            str(weights),
            message=str(exc),
        ) from None
    diffs = [
        f"{name}: preset {getattr(spec, name)}, weights {getattr(theirs, name)}"
        for name in ARCH_FIELDS
        if getattr(spec, name) != getattr(theirs, name)
    ]
    if diffs:
        raise ConfigError(
            job_file,
            "train.weights",
            f"weights of the {spec.name} architecture",
            str(weights),
            message=f"{weights} is not a {spec.name}: " + "; ".join(diffs),
        )


@dataclass
class BuiltModel:
    module: Any  # torch.nn.Module
    init: str
    weights: Path | None
    hf_ds_config: Any  # keeps transformers' ZeRO-3 switch alive while DeepSpeed wraps the model
    partitioned_at_init: bool


def _have_accelerate() -> bool:
    import importlib.util

    return importlib.util.find_spec("accelerate") is not None


def _random_zero3(model_cls: Any, hf_config: Any, ds_config: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    """Build under ``deepspeed.zero.Init`` (each rank allocates only its partition), then initialise
    the weights module by module with the parameters gathered (rank 0 initialises, then they are
    re-partitioned): transformers' own ZeRO-3 procedure, without its accelerate-based switch."""
    import contextlib

    import deepspeed
    from transformers.initialization import no_init_weights
    from transformers.integrations.deepspeed import initialize_weights_zero3, prevent_arange_dtype_change

    with contextlib.ExitStack() as stack:
        stack.enter_context(no_init_weights())
        stack.enter_context(prevent_arange_dtype_change())
        stack.enter_context(deepspeed.zero.Init(config_dict_or_path=ds_config))
        module = model_cls._from_config(hf_config, **kwargs)
    initialize_weights_zero3(module)
    module.tie_weights()
    return module


def build_model(cfg: JobConfig, settings: Settings, ds_config: dict[str, Any], *, bf16: bool) -> BuiltModel:
    """Build (or load) the model, partitioned at construction when ``zero.zero_init``."""
    import logging

    import torch
    import torch._dynamo  # imported before zero.Init patches tensor constructors
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    log = logging.getLogger("ft_trainer.train.model")
    init, weights = resolve_init(cfg, settings)
    if weights is not None and cfg.model.preset is not None:
        check_weights_match_preset(cfg.model.spec, weights, cfg.path)
    dtype = torch.bfloat16 if bf16 else torch.float32
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": settings.train.attn_implementation}
    hf_ds = None
    partitioned = False
    if init == "pretrained":
        assert weights is not None
        if cfg.zero.zero_init and _have_accelerate():
            from transformers.integrations import HfDeepSpeedConfig  # type: ignore[attr-defined]

            hf_ds = HfDeepSpeedConfig(ds_config)  # from_pretrained then loads each shard into partitions
            partitioned = True
        elif cfg.zero.zero_init:
            log.warning(
                "the accelerate package is missing, so transformers cannot load %s partitioned (zero.Init): "
                "every rank loads the full weights into host memory before DeepSpeed partitions them "
                "(~2 bytes/parameter per rank); pip install 'accelerate>=1.1'",
                weights,
            )
        module = AutoModelForCausalLM.from_pretrained(weights, local_files_only=True, **kwargs)
    else:
        if cfg.model.path is not None:
            hf_config = AutoConfig.from_pretrained(cfg.model.path, local_files_only=True)
        else:
            fields = cfg.model.spec.hf_config_dict()
            fields.pop("model_type", None)
            hf_config = Qwen3Config(**fields)
        model_cls: Any = MODEL_FOR_CAUSAL_LM_MAPPING[
            type(hf_config)
        ]  # resolved before zero.Init patches torch
        if cfg.zero.zero_init:
            module = _random_zero3(model_cls, hf_config, ds_config, kwargs)
            partitioned = True
        else:
            module = model_cls._from_config(hf_config, **kwargs)
    module.config.use_cache = False
    if cfg.model.gradient_checkpointing:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return BuiltModel(
        module=module, init=init, weights=weights, hf_ds_config=hf_ds, partitioned_at_init=partitioned
    )
