"""``ft-trainer bench-data``: how fast this machine's data path feeds one rank, in cache and stream mode,
against what the job consumes (``job.expected_tokens_per_s`` / world size).

Measured on one process, iterating the job's real plan (rank 0, epoch 0 by default) for a fixed time. A
node runs one such reader per GPU, each in its own rank process, so the per-rank comparison is the right
one as long as the node has a core per rank for its reader.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ft_trainer.config import JobConfig
from ft_trainer.data.data import JobData

__all__ = ["ModeResult", "bench_mode", "verdict"]


@dataclass(frozen=True)
class ModeResult:
    mode: str
    tokens: int
    seconds: float
    micro_batches: int
    error: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def bench_mode(
    cfg: JobConfig, mode: str, *, seconds: float = 2.0, rank: int = 0, epoch: int = 0
) -> ModeResult:
    """Tokens per second of packed micro-batches for ``rank`` in ``mode`` (``cache`` or ``stream``)."""
    try:
        data = JobData.open(cfg, mode=mode)
        plan = data.epoch_plan(epoch)
        stream = data.rank_stream(plan, rank)
        data.source()  # open files / load the tokenizer outside the timed loop
    except Exception as exc:  # reported, not raised: the other mode may still be measurable
        return ModeResult(mode, 0, 0.0, 0, error=str(exc))
    if stream.num_micro_batches == 0:
        return ModeResult(mode, 0, 0.0, 0, error=f"rank {rank} has no micro-batch in epoch {epoch}")
    tokens = n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for mb in stream.iter_micro_batches():
            tokens += mb.size
            n += 1
            if time.perf_counter() >= deadline:
                break
        if time.perf_counter() >= deadline:
            break
    return ModeResult(mode, tokens, time.perf_counter() - t0, n)


def verdict(results: list[ModeResult], need_per_rank_tokens_per_s: float | None) -> tuple[str, list[str]]:
    """(one-line verdict, per-mode notes). Headroom >= 2x: ample; 1-2x: tight; < 1x: the GPUs starve."""
    notes: list[str] = []
    ok_modes = [r for r in results if r.error is None]
    if need_per_rank_tokens_per_s is None:
        return (
            "no verdict: set job.expected_tokens_per_s (the whole job's training throughput) to compare",
            notes,
        )
    worst = None
    for r in ok_modes:
        h = r.tokens_per_s / need_per_rank_tokens_per_s
        label = "ample" if h >= 2 else ("tight" if h >= 1 else "STARVES the GPUs")
        notes.append(f"{r.mode}: headroom {h:,.1f}x ({label})")
        worst = h if worst is None else min(worst, h)
    if worst is None:
        return "no verdict: no mode could be measured", notes
    if worst >= 2:
        v = (
            "OK: every measured mode delivers >= 2x what a rank consumes; the job is compute-bound and cache "
            "and stream deliver the same training throughput"
        )
    elif worst >= 1:
        v = "TIGHT: a mode has under 2x headroom; a slow file system or busy CPUs would starve the GPUs"
    else:
        v = "STARVED: a mode delivers less than a rank consumes; use the cache mode or more reader cores"
    return v, notes
