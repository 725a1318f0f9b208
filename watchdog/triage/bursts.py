"""Compute bursts of one GPU, found on the raw samples (pure, streaming).

The classifier's hysteresis is right for accounting time, but it swallows what matters most in a long
wait: a job that checkpoints every step spends most of its time with the waiting GPUs spinning in a
collective (100 % utilisation at spin power) and computes in bursts of well under a second between
saves. On an H100 the board power is a one-second average, so such a burst reads as a short rise from
~0.21 to ~0.33-0.37 of the limit - above the spin band, below the compute floor, over in fewer samples
than any state's dwell. A deadlocked GPU does not do that: its spin draw is flat. So a burst is
progress, and triage looks for it on the raw samples:

* a *burst* is a run of consecutive samples at or above the spin band's power ceiling (the band's
  ``power_max``: no spinning kernel draws that much) whose highest sample rises at least the band's
  ``margin_power`` above the lowest of the ``BASE_SAMPLES`` samples before the run - so a hang whose
  flat spin draw sits on the ceiling and flickers across it is no burst;
* runs less than ``MERGE_GAP_S`` apart are one burst (this also bounds the memory a flickering GPU
  can take).

:class:`BurstTracker` is fed the chunks of one GPU in time order and carries an open run and the last
samples across chunk boundaries, so the bursts do not depend on the chunk size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

#: Samples before a run whose lowest power is the level the burst rises from (about one second at
#: nvidia-smi's usual 10 Hz: a one-second-averaged sensor ramps up over several samples).
BASE_SAMPLES = 10
#: Runs closer than this are one burst.
MERGE_GAP_S = 1.0

_EMPTY = np.empty(0, dtype=np.float64)


@dataclass(slots=True)
class Bursts:
    """Bursts of one GPU: ``start_s[i] .. end_s[i]`` (first and last sample above the ceiling)."""

    start_s: np.ndarray = field(default_factory=lambda: _EMPTY)
    end_s: np.ndarray = field(default_factory=lambda: _EMPTY)

    def __len__(self) -> int:
        return len(self.start_s)

    def within(self, lo_s: float, hi_s: float) -> tuple[np.ndarray, np.ndarray]:
        """The bursts that overlap ``[lo_s, hi_s]``."""
        a = int(np.searchsorted(self.end_s, lo_s, side="left"))
        b = int(np.searchsorted(self.start_s, hi_s, side="right"))
        return self.start_s[a:b], self.end_s[a:b]

    def within_each(self, spans: Sequence[tuple[float, float]]) -> tuple[list[int], list[int]]:
        """:meth:`within` of every ``(lo_s, hi_s)`` of ``spans`` at once, as index ranges: the bursts
        overlapping span ``k`` are ``first[k]:last[k]`` (one search per span, not two calls)."""
        lo = np.fromiter((a for a, _ in spans), dtype=np.float64, count=len(spans))
        hi = np.fromiter((b for _, b in spans), dtype=np.float64, count=len(spans))
        first = self.end_s.searchsorted(lo, side="left").tolist()
        last = self.start_s.searchsorted(hi, side="right").tolist()
        return first, last


def merge(
    start_s: np.ndarray, end_s: np.ndarray, gap_s: float = MERGE_GAP_S
) -> tuple[np.ndarray, np.ndarray]:
    """Join sorted runs less than ``gap_s`` apart (vectorised)."""
    if len(start_s) < 2:
        return start_s, end_s
    keep = np.empty(len(start_s), dtype=bool)
    keep[0] = True
    keep[1:] = start_s[1:] - np.maximum.accumulate(end_s)[:-1] >= gap_s
    first = np.flatnonzero(keep)
    last_end = np.maximum.reduceat(end_s, first)
    return start_s[first], last_end


class BurstTracker:
    """Streaming burst finder for one GPU. ``ceiling`` and ``rise`` are fractions of the power limit."""

    def __init__(self, ceiling: float, rise: float) -> None:
        self.ceiling = float(ceiling)
        self.rise = float(rise)
        self._tail = np.full(BASE_SAMPLES, np.nan)
        """The last BASE_SAMPLES power fractions (NaN before the first sample)."""
        self._open: tuple[float, float, float] | None = None
        """(start_s, base, peak) of a run still going at the end of the last chunk."""
        self._open_end_s = 0.0
        self._starts: list[np.ndarray] = []
        self._ends: list[np.ndarray] = []

    def feed(self, time_s: np.ndarray, power_frac: np.ndarray) -> None:
        n = len(time_s)
        if n == 0:
            return
        above = power_frac >= self.ceiling  # NaN (a failed read) is not above
        was_open = self._open is not None
        if not was_open and not above.any():
            self._remember(power_frac)
            return
        flag = above.astype(np.int8)
        edges = np.diff(flag, prepend=np.int8(1 if was_open else 0))
        starts = np.flatnonzero(edges == 1)
        stops = np.flatnonzero(edges == -1)  # the first sample back under the ceiling
        ext = np.concatenate((self._tail, power_frac))
        run_start_s: list[np.ndarray] = []
        run_end_s: list[np.ndarray] = []
        if was_open:
            assert self._open is not None
            o_start, o_base, o_peak = self._open
            if len(stops):
                stop = int(stops[0])
                peak = max(o_peak, float(np.max(power_frac[:stop]))) if stop else o_peak
                end = float(time_s[stop - 1]) if stop else self._open_end_s
                if peak - o_base >= self.rise:
                    run_start_s.append(np.array([o_start]))
                    run_end_s.append(np.array([end]))
                self._open = None
                stops = stops[1:]
            else:  # the whole chunk continues the open run
                self._open = (o_start, o_base, max(o_peak, float(np.max(power_frac))))
                self._open_end_s = float(time_s[-1])
                self._remember(power_frac)
                return
        closed = starts[: len(stops)]
        if len(closed):
            bounds = np.column_stack((closed, stops[: len(closed)])).ravel()
            peaks = np.maximum.reduceat(power_frac, bounds)[::2]  # max over [start, stop) of each run
            bases = self._bases(ext, closed)
            ok = peaks - bases >= self.rise
            run_start_s.append(time_s[closed[ok]])
            run_end_s.append(time_s[stops[: len(closed)][ok] - 1])
        if len(starts) > len(stops):  # a run still going at the end of the chunk
            s = int(starts[-1])
            base = float(self._bases(ext, np.array([s]))[0])
            self._open = (float(time_s[s]), base, float(np.max(power_frac[s:])))
            self._open_end_s = float(time_s[-1])
        if run_start_s:
            a, b = merge(np.concatenate(run_start_s), np.concatenate(run_end_s))
            if len(a):
                self._starts.append(a)
                self._ends.append(b)
        self._remember(power_frac)

    def _bases(self, ext: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Lowest finite power of the BASE_SAMPLES samples before each run start (``inf`` if none: a
        run at the very start or right after a gap in the readings shows no rise, so it is no burst)."""
        windows = np.lib.stride_tricks.sliding_window_view(ext, BASE_SAMPLES)[starts]
        with np.errstate(all="ignore"):
            finite = np.where(np.isfinite(windows), windows, np.inf)
            low = finite.min(axis=1)
        return low

    def _remember(self, power_frac: np.ndarray) -> None:
        if len(power_frac) >= BASE_SAMPLES:
            self._tail = power_frac[-BASE_SAMPLES:].astype(np.float64, copy=True)
        else:
            self._tail = np.concatenate((self._tail, power_frac))[-BASE_SAMPLES:]

    def finish(self) -> Bursts:
        """The bursts of the whole series (a run still going at the end counts if it rose enough)."""
        starts, ends = list(self._starts), list(self._ends)
        if self._open is not None:
            o_start, o_base, o_peak = self._open
            if o_peak - o_base >= self.rise:
                starts.append(np.array([o_start]))
                ends.append(np.array([self._open_end_s]))
        if not starts:
            return Bursts()
        a, b = merge(np.concatenate(starts), np.concatenate(ends))
        return Bursts(a, b)
