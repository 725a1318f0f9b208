"""Printing helpers shared by the benchmarks: one aligned line per measurement, with the baseline
beside it and the ratio, and the budget when there is one. Benchmarks measure; they never fail a test."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def line(
    name: str,
    value: float,
    unit: str,
    *,
    baseline: float | None = None,
    baseline_name: str = "",
    budget: str = "",
    higher_is_better: bool = True,
    ok: bool | None = None,
) -> str:
    text = f"  {name:<46} {value:>14,.3f} {unit:<10}"
    if baseline is not None and baseline > 0:
        ratio = value / baseline
        text += f" | {baseline_name or 'baseline'} {baseline:,.3f} {unit}  ratio {ratio:.2f}x"
    if budget:
        verdict = "" if ok is None else ("  OK" if ok else "  OVER BUDGET")
        text += f" | budget {budget}{verdict}"
    print(text, flush=True)
    return text


def header(title: str) -> None:
    print(f"\n== {title}", flush=True)


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best wall time of ``repeat`` runs (the least disturbed by a noisy neighbour)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def median(values: list[float]) -> float:
    return statistics.median(values)
