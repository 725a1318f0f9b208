"""The learning-rate schedule: linear warmup, then cosine (or linear, or constant) decay to a floor.

A pure function of the optimizer step, so a resumed run sets exactly the rate the uninterrupted run had
at that step - nothing about the schedule lives in the checkpoint. The trainer writes the rate into the
optimizer's parameter groups before every optimizer step (no DeepSpeed scheduler).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LrSchedule", "lr_at", "total_optimizer_steps"]


def lr_at(
    step: int,
    *,
    base_lr: float,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.0,
) -> float:
    """Learning rate of optimizer step ``step`` (0-based: the first step the run takes is 0).

    Warmup ramps linearly from ``base_lr / warmup_steps`` (step 0) to ``base_lr`` (step
    ``warmup_steps - 1``); then the rate decays from ``base_lr`` at ``warmup_steps`` to
    ``base_lr * min_lr_ratio`` at ``total_steps - 1`` and stays there. ``constant`` keeps ``base_lr``."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return base_lr
    floor = base_lr * min_lr_ratio
    span = max(1, total_steps - 1 - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    if schedule == "cosine":
        return floor + (base_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return floor + (base_lr - floor) * (1.0 - progress)
    raise ValueError(f"unknown schedule {schedule!r}")


@dataclass(frozen=True)
class LrSchedule:
    base_lr: float
    total_steps: int
    warmup_steps: int
    schedule: str
    min_lr_ratio: float

    @classmethod
    def build(
        cls,
        *,
        base_lr: float,
        total_steps: int,
        warmup_steps: int = 0,
        warmup_ratio: float = 0.0,
        schedule: str = "cosine",
        min_lr_ratio: float = 0.0,
    ) -> LrSchedule:
        """``warmup_ratio`` (of ``total_steps``) applies when ``warmup_steps`` is 0."""
        warm = warmup_steps or round(warmup_ratio * total_steps)
        return cls(base_lr, max(1, total_steps), min(warm, max(0, total_steps - 1)), schedule, min_lr_ratio)

    def __call__(self, step: int) -> float:
        return lr_at(
            step,
            base_lr=self.base_lr,
            total_steps=self.total_steps,
            warmup_steps=self.warmup_steps,
            schedule=self.schedule,
            min_lr_ratio=self.min_lr_ratio,
        )


def total_optimizer_steps(micro_batches_per_epoch: Sequence[int], grad_accum: int) -> int:
    """Optimizer steps of a whole run: each epoch's micro-batch count in whole steps, summed."""
    return sum(int(n) // grad_accum for n in micro_batches_per_epoch)
