"""Model presets: architecture numbers the gate and the trainer share, without importing torch.

A :class:`ModelSpec` holds what the data side and the gate need (vocabulary, positions, parameter count,
the largest single layer for ZeRO-3's memory formula) and what the training side needs to build a
Hugging Face ``Qwen3Config`` (:meth:`ModelSpec.hf_config_dict`). Specs come from a named preset or from
a local Hugging Face model directory's ``config.json`` (read as JSON: no transformers import).

Qwen3-32B numbers are the public ``config.json`` of ``Qwen/Qwen3-32B``: hidden 5120, 64 layers, 64 query
heads and 8 key/value heads of dimension 128, MLP intermediate 25600, vocabulary 151936, 40960
positions, untied embeddings, RoPE theta 1e6, RMSNorm eps 1e-6, no attention bias, per-head q/k RMSNorm.
:func:`count_params` gives 32,762,123,264 parameters for it (the model card's "32.8B"; 31.2B without
the two embedding matrices, as the card states).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["PRESETS", "ModelSpec", "count_params", "from_hf_config", "get_preset", "largest_layer_params"]


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer in the Qwen3/Llama family (SwiGLU MLP, GQA, RMSNorm, RoPE)."""

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    tie_word_embeddings: bool = False
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    qk_norm: bool = True
    attention_bias: bool = False
    params_override: int | None = None
    source: str = "preset"

    @property
    def params(self) -> int:
        """Total trainable parameters (the override from the job file, if any, wins)."""
        return self.params_override if self.params_override is not None else count_params(self)

    @property
    def largest_layer_params(self) -> int:
        return largest_layer_params(self)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, PaLM's formula (Chowdhery et al. 2022, appendix B): 6 N for the
        matmuls, forward and backward, plus 12 L d_attn s for attention (not halved for the causal mask,
        as MFU is commonly reported). N counts matmul weights: the input embedding is a lookup, so an
        untied embedding is left out; a tied one is the LM head's matmul and stays in."""
        attn_dim = self.num_attention_heads * self.head_dim
        embed_lookup = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return 6.0 * (self.params - embed_lookup) + 12.0 * self.num_layers * attn_dim * seq_len

    def with_overrides(
        self, *, vocab_size: int | None = None, max_positions: int | None = None, params: int | None = None
    ) -> ModelSpec:
        return replace(
            self,
            vocab_size=self.vocab_size if vocab_size is None else vocab_size,
            max_positions=self.max_positions if max_positions is None else max_positions,
            params_override=self.params_override if params is None else params,
        )

    def hf_config_dict(self) -> dict[str, Any]:
        """Keyword arguments for ``transformers.Qwen3Config`` (a random-initialised model of this shape)."""
        return {
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_positions,
            "tie_word_embeddings": self.tie_word_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
        }


def count_params(spec: ModelSpec) -> int:
    """Parameters of a Qwen3-style decoder: embeddings (+ untied LM head), per layer q/k/v/o projections,
    a SwiGLU MLP (gate, up, down), two RMSNorms and (Qwen3) per-head q/k RMSNorms, plus the final norm."""
    h, hd = spec.hidden_size, spec.head_dim
    q_dim = spec.num_attention_heads * hd
    kv_dim = spec.num_kv_heads * hd
    attn = h * q_dim + 2 * h * kv_dim + q_dim * h
    if spec.attention_bias:
        attn += q_dim + 2 * kv_dim
    mlp = 3 * h * spec.intermediate_size
    norms = 2 * h + (2 * hd if spec.qk_norm else 0)
    per_layer = attn + mlp + norms
    embed = spec.vocab_size * h
    head = 0 if spec.tie_word_embeddings else spec.vocab_size * h
    return embed + head + spec.num_layers * per_layer + h


def largest_layer_params(spec: ModelSpec) -> int:
    """The largest single module (what ZeRO-3 gathers at once): the embedding or one MLP projection."""
    return max(spec.vocab_size * spec.hidden_size, spec.hidden_size * spec.intermediate_size)


PRESETS: dict[str, ModelSpec] = {
    "qwen3-32b": ModelSpec(
        name="qwen3-32b",
        hidden_size=5120,
        num_layers=64,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=25600,
        vocab_size=151936,
        max_positions=40960,
        tie_word_embeddings=False,
    ),
    # A random tiny Qwen3 for CPU tests. Vocabulary 512 matches the byte-level BPE tokenizer the tests
    # train with trainer.tokenization.train_byte_bpe(vocab_size=512).
    "tiny-qwen3": ModelSpec(
        name="tiny-qwen3",
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=512,
        max_positions=1024,
        tie_word_embeddings=True,
        rope_theta=10_000.0,
    ),
}


def get_preset(name: str) -> ModelSpec:
    """The preset called ``name``; ``KeyError`` listing the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None


def from_hf_config(model_dir: Path) -> ModelSpec:
    """A spec from a local Hugging Face model directory's ``config.json`` (read as JSON, no transformers).

    Raises ``FileNotFoundError`` or ``ValueError`` naming the file and the missing field."""
    path = Path(model_dir) / "config.json" if Path(model_dir).is_dir() else Path(model_dir)
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)

    def need(key: str) -> Any:
        if key not in cfg:
            raise ValueError(f"{path}: field {key!r} is missing")
        return cfg[key]

    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    return ModelSpec(
        name=str(cfg.get("_name_or_path") or Path(model_dir).name),
        hidden_size=hidden,
        num_layers=int(need("num_hidden_layers")),
        num_attention_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(need("intermediate_size")),
        vocab_size=int(need("vocab_size")),
        max_positions=int(need("max_position_embeddings")),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_theta=float(cfg.get("rope_theta", 10_000.0)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qk_norm=cfg.get("model_type") in ("qwen3", "qwen3_moe"),
        attention_bias=bool(cfg.get("attention_bias", False)),
        source=str(path),
    )
