"""Equalize-to-minimum: every rank runs the same number of micro-batches each epoch.

DeepSpeed ZeRO-3 issues collectives inside every forward and backward; a rank with one micro-batch more
than the others waits in a collective nobody else joins - the epoch-end deadlock (DeepSpeed issue 2223).
DeepSpeed has no ``Join`` support, so each epoch every rank counts its packed micro-batches,
``all_reduce(MIN)`` finds the smallest count, and every rank truncates to it, rounded down to a multiple
of ``grad_accum`` so the epoch ends on an optimizer step.

The arithmetic (:func:`equalized_count`, :func:`whole_steps`) is pure and shared with the plan, so the gate
predicts exactly what training does. :func:`equalize_epoch` is the thin collective: it imports torch only
when called, so this module stays importable by the gate.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["EqualizeResult", "equalize_epoch", "equalized_count", "whole_steps"]

log = logging.getLogger("ft_trainer.planning.equalize")


def equalized_count(min_local_micro_batches: int, grad_accum: int) -> int:
    """The count every rank runs: the global minimum rounded down to a multiple of ``grad_accum``."""
    if grad_accum < 1:
        raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
    if min_local_micro_batches < 0:
        raise ValueError(f"micro-batch count must be >= 0, got {min_local_micro_batches}")
    return (min_local_micro_batches // grad_accum) * grad_accum


def whole_steps(counts: np.ndarray, grad_accum: int) -> np.ndarray:
    """Each count rounded down to whole optimizer steps (what a rank runs with equalize off)."""
    return (np.asarray(counts, dtype=np.int64) // grad_accum) * grad_accum


@dataclass(frozen=True)
class EqualizeResult:
    epoch: int
    local_micro_batches: int  # what this rank could build
    min_micro_batches: int  # the smallest count over all ranks
    max_micro_batches: int  # the largest count over all ranks
    micro_batches: int  # what every rank runs this epoch
    dropped_micro_batches: int  # on this rank
    dropped_tokens: int  # on this rank: dropped micro-batches x micro_batch x seq_len

    def steps_for(self, grad_accum: int) -> int:
        return self.micro_batches // grad_accum


def equalize_epoch(
    local_micro_batches: int,
    *,
    grad_accum: int,
    micro_batch: int,
    seq_len: int,
    epoch: int = 0,
    group: Any = None,
    expected: int | None = None,
    logger: logging.Logger | None = None,
) -> EqualizeResult:
    """All-reduce this rank's packed micro-batch count with MIN (and MAX, in the same collective) over
    ``group`` (a ``torch.distributed`` process group; None = the default group), truncate to the minimum
    rounded down to a multiple of ``grad_accum``, and log the tokens dropped.

    ``expected`` is the count the plan predicted (``EpochPlan.micro_batches[rank]``); a different result
    means ranks disagree on the data (different caches or configs) and is logged as an error."""
    import torch
    import torch.distributed as dist

    lg = logger or log
    t = torch.tensor([local_micro_batches, -local_micro_batches], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    lo, hi = int(t[0].item()), -int(t[1].item())
    target = equalized_count(lo, grad_accum)
    dropped = local_micro_batches - target
    result = EqualizeResult(
        epoch=epoch,
        local_micro_batches=local_micro_batches,
        min_micro_batches=lo,
        max_micro_batches=hi,
        micro_batches=target,
        dropped_micro_batches=dropped,
        dropped_tokens=dropped * micro_batch * seq_len,
    )
    lg.info(
        "equalize epoch %d: ranks have %d..%d micro-batches; every rank runs %d (%d steps); "
        "this rank drops %d micro-batches = %d tokens",
        epoch,
        lo,
        hi,
        target,
        target // grad_accum,
        dropped,
        result.dropped_tokens,
    )
    if expected is not None and expected != target:
        lg.error(
            "equalize epoch %d: plan predicted %d micro-batches per rank but the ranks agreed on %d: "
            "ranks see different data or configs (compare the plan fingerprints in their logs)",
            epoch,
            expected,
            target,
        )
    return result
