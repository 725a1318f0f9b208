"""Pure estimates the gate compares against the hardware: checkpoint size and ZeRO-3 memory.

**Checkpoint.** A DeepSpeed ZeRO-3 checkpoint of a bf16 model trained with Adam holds, per parameter, the
bf16 weights (2 bytes, ``*_model_states.pt``), the fp32 master copy and the two fp32 Adam moments (12
bytes, ``*_optim_states.pt``), and, when the 16-bit weights are consolidated on save, another 2 bytes:
16 bytes per parameter (``checkpoint.bytes_per_param``), plus ``checkpoint.margin`` (default 10 %) for
metadata, the scheduler and file-system slack. Room is needed for one new checkpoint beside the ones
kept: ``keep_last`` older ones are deleted only after the new one is complete.

**ZeRO-3 model states.** DeepSpeed's own formula (``estimate_zero3_model_states_mem_needs`` in
``deepspeed/runtime/zero/stage3.py``, reproduced here without importing DeepSpeed): with ``P`` parameters,
``G`` GPUs over ``N`` nodes, the largest layer ``Lp`` and buffer factor ``b`` (1.5):

- no offload: per GPU ``4 Lp + 18 P / G``; per node CPU ``4 Lp (GPUs per node) b`` with zero.Init;
- optimizer offloaded: per GPU ``4 Lp + 2 P / G``; per node CPU ``16 P / N b``;
- optimizer and parameters offloaded: per GPU ``4 Lp``; per node CPU ``18 P / N b``.

**Activations** (added per GPU; an estimate, bf16, flash/SDPA attention so no s^2 term; Korthikanti et
al. 2022): with gradient checkpointing, each layer keeps its input (``2 s b h`` bytes) and one layer is
recomputed at a time (``34 s b h``); without it, every layer keeps ``34 s b h``. Logits and their
gradient add ``8 s b V`` (bf16 logits, fp32 copy for the loss, bf16 gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

from ft_trainer.planning.presets import ModelSpec

__all__ = ["MemoryEstimate", "checkpoint_bytes", "zero3_memory"]

GIB = 1 << 30


def checkpoint_bytes(params: int, bytes_per_param: float = 16.0, margin: float = 0.10) -> int:
    """Bytes one full ZeRO-3 checkpoint needs on disk (see module docstring)."""
    return int(params * bytes_per_param * (1.0 + margin))


@dataclass(frozen=True)
class MemoryEstimate:
    model_states_per_gpu_bytes: int
    activations_per_gpu_bytes: int
    cpu_per_node_bytes: int
    largest_layer_bytes: int

    @property
    def per_gpu_bytes(self) -> int:
        return self.model_states_per_gpu_bytes + self.activations_per_gpu_bytes


def zero3_memory(
    spec: ModelSpec,
    *,
    nodes: int,
    gpus_per_node: int,
    seq_len: int,
    micro_batch: int,
    offload_optimizer: bool = False,
    offload_param: bool = False,
    zero_init: bool = True,
    buffer_factor: float = 1.5,
    gradient_checkpointing: bool = True,
) -> MemoryEstimate:
    """Per-GPU and per-node memory of a ZeRO-3 job by formula (module docstring)."""
    total_params = spec.params
    largest = spec.largest_layer_params
    total_gpus = nodes * gpus_per_node
    gpus_factor = 1.0 / nodes
    largest_mem = 4 * largest
    if offload_optimizer:
        if offload_param:
            gpu = largest_mem
            cpu = total_params * (18 * gpus_factor if zero_init else max(4 * gpus_per_node, 18 * gpus_factor))
        else:
            gpu = largest_mem + int(2 * total_params / total_gpus)
            cpu = total_params * (16 * gpus_factor if zero_init else max(4 * gpus_per_node, 16 * gpus_factor))
    else:
        gpu = largest_mem + int(18 * total_params / total_gpus)
        cpu = (largest if zero_init else total_params) * 4 * gpus_per_node
    cpu *= buffer_factor
    sbh = seq_len * micro_batch * spec.hidden_size
    kept_per_layer = 2 * sbh if gradient_checkpointing else 34 * sbh
    recompute = 34 * sbh if gradient_checkpointing else 0
    act = spec.num_layers * kept_per_layer + recompute + 8 * seq_len * micro_batch * spec.vocab_size
    return MemoryEstimate(
        model_states_per_gpu_bytes=int(gpu),
        activations_per_gpu_bytes=int(act),
        cpu_per_node_bytes=int(cpu),
        largest_layer_bytes=int(largest_mem),
    )
