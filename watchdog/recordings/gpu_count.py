"""Infer how many GPUs a recording without an ``index`` column covers.

nvidia-smi writes one row per GPU per query, in board order, so a recording is a sequence of complete
*snapshots* of ``gpus`` rows. When nothing in the row names its GPU, the count has to be recovered from
the rhythm of the file:

* **timestamp gaps** (:func:`period_from_gaps`): the rows of one snapshot are written within a few
  milliseconds, then nvidia-smi sleeps for the logging interval. With period ``p`` = the GPU count, the
  gap after every ``p``-th row is (nearly) always the big one, and the gaps at the other positions are
  usually tiny. A query can be slow (the real H100 traces have snapshots spread over 0.9 s), so the test
  is statistical: the big position's 10th percentile must exceed four times the median of every other
  position. A multiple of the true count also passes, so the smallest passing period wins; a period
  that shares only a divisor with the truth mixes small and big gaps at every position and fails.
* **repeated readings** (:func:`period_from_values`): when there is no usable timestamp, rows ``p``
  apart are the same GPU one interval later, and a power sensor slower than the logging interval
  repeats its exact reading there, which two different GPUs almost never do. This is a heuristic and
  only answers when the pattern is clear; otherwise the caller must be told to pass ``--gpus``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Largest GPU count considered (16 per node is the most sold; leave room for odd hosts).
MAX_GPUS = 64
#: Every position of a candidate period needs at least this many gaps (fewer gave wrong answers on
#: 30-row windows of the real traces).
MIN_SNAPSHOTS = 8
#: Answer only from enough rows to test every period up to this count (1, 2, 4, 8 and 16 GPUs all
#: occur in practice); shorter recordings need ``--gpus``.
SURE_UP_TO = 16
#: Exact repeats needed before a repeated-readings answer is trusted (chance matches happen).
MIN_REPEATS = 20


def period_from_gaps(time_s: np.ndarray, max_gpus: int = MAX_GPUS) -> int | None:
    """The GPU count implied by the timestamp gaps of consecutive rows, or None if unclear."""
    time_s = np.asarray(time_s, dtype=np.float64)
    time_s = time_s[np.isfinite(time_s)]
    gaps = np.diff(time_s)
    if len(gaps) < MIN_SNAPSHOTS * SURE_UP_TO:
        return None  # too short to rule out the common counts: a spurious small period could win
    low_gap, high_gap = (float(v) for v in np.percentile(gaps, [10, 90]))
    if high_gap > 0 and low_gap >= 0.5 * high_gap:
        return 1  # every gap is about one interval: one GPU
    for period in range(2, max_gpus + 1):
        usable = len(gaps) // period * period
        if usable // period < MIN_SNAPSHOTS:
            break
        phases = gaps[:usable].reshape(-1, period)
        low = np.percentile(phases, 10, axis=0)
        big = int(np.argmax(low))
        if low[big] <= 0:
            continue
        others = np.median(np.delete(phases, big, axis=1), axis=0)
        if low[big] >= 4.0 * float(others.max()):
            return period
    return None


def period_from_values(values: np.ndarray, max_gpus: int = MAX_GPUS) -> int | None:
    """The GPU count implied by exact repeats of a reading (board power), or None if unclear.

    A GPU's power sensor updates more slowly than people log (nvidia-smi -lms 100), so the same GPU
    often reports the very same value in consecutive snapshots - rows ``gpus`` apart - while two
    different GPUs almost never read exactly alike. The answer is the smallest period ``p`` whose rows
    repeat exactly at least half as often as at the best period (and at least 5 % of the time), provided
    every smaller period repeats at most a quarter as often.
    On the real traces this finds 8 for the H100 files and 2 for the Titan X ones, where comparing
    distances (rows ``p`` apart differ least) wrongly finds 1 because two GPUs track each other.
    """
    x = np.asarray(values, dtype=np.float64)
    if len(x) < (MIN_SNAPSHOTS + 1) * SURE_UP_TO:
        return None
    rates: list[float] = []
    repeats: list[int] = []
    for period in range(1, max_gpus + 1):
        if len(x) < period * (MIN_SNAPSHOTS + 1):
            break
        a, b = x[period:], x[:-period]
        both = np.isfinite(a) & np.isfinite(b)
        same = int(np.count_nonzero(a[both] == b[both]))
        repeats.append(same)
        rates.append(same / max(int(np.count_nonzero(both)), 1))
    if not rates:
        return None
    floor = max(0.05, max(rates) / 2)
    for index, rate in enumerate(rates):
        if rate >= floor and all(earlier <= rate / 4 for earlier in rates[:index]):
            return index + 1 if repeats[index] >= MIN_REPEATS else None
    return None


def period_from_labels(first_label: object, labels: Sequence[object]) -> int | None:
    """The GPU count from a per-row GPU label (uuid or PCI bus id): the row where the first label
    comes back, provided the labels before it are all distinct."""
    for position, label in enumerate(labels):
        if position and label == first_label:
            return position if len(set(labels[:position])) == position else None
    distinct = len(set(labels))
    return distinct if 0 < distinct == len(labels) <= MAX_GPUS else None
