"""Per-GPU state with hysteresis, in two equivalent forms.

The rule, for each sample of one GPU in time order:

1. ``candidate`` = the current state if the sample lies in its (widened) exit box, else the sample's
   raw band (:func:`watchdog.classify.bands.raw_state`).
2. A candidate equal to the current state clears any pending change.
3. Otherwise the candidate is *pending* from the first sample of its unbroken run; once the run has
   lasted the candidate's dwell (``t - run_start >= dwell_s``) the GPU takes the new state, dated back
   to the run's first sample (``since``): the state began when the signature began, not when we were
   sure of it.

So a single-sample spike never changes the state (any dwell > 0), a GPU hovering on a boundary does
not flap (exit box wider than the enter box), and a short dwell for ``compute`` makes leaving the spin
band for real work quick.

:class:`GpuClassifier` applies the rule one sample at a time (the daemon). :func:`classify_series`
applies it to whole arrays (triage), looping in Python only over runs of candidates that differ from
the current state, not over samples, and carries its state across chunks through :class:`Carry` - the
two give identical answers (tested property).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from watchdog.classify.bands import CODE, raw_state, raw_states, stays_in, stays_mask
from watchdog.states import GPU_STATES, GpuState
from watchdog.tables import PowerTable


@dataclass(frozen=True, slots=True)
class Carry:
    """Classifier state between samples (or chunks) of one GPU."""

    state: GpuState
    since_s: float
    pending: GpuState | None = None
    pending_since_s: float = 0.0
    since_pos: float = 0.0
    """Caller-defined position of ``since`` (triage: covered GPU-seconds), carried with it."""
    pending_pos: float = 0.0


@dataclass(frozen=True, slots=True)
class Switch:
    """The GPU took ``state`` at sample ``index`` (of this series), dated back to ``since_s``."""

    index: int
    state: GpuState
    since_s: float
    since_pos: float


class GpuClassifier:
    """Streaming form: feed samples in time order, read ``state`` and ``since_s``."""

    def __init__(self, table: PowerTable, carry: Carry | None = None) -> None:
        self.table = table
        self.carry = carry

    @property
    def state(self) -> GpuState:
        return self.carry.state if self.carry else GpuState.UNKNOWN

    @property
    def since_s(self) -> float | None:
        return self.carry.since_s if self.carry else None

    def update(self, time_s: float, power_frac: float, util: float, pos: float = 0.0) -> bool:
        """Classify one sample; True when the state changed. NaN means missing."""
        c = self.carry
        if c is None:
            self.carry = Carry(raw_state(self.table, power_frac, util), time_s, since_pos=pos)
            return True
        if stays_in(self.table, c.state, power_frac, util):
            if c.pending is not None:
                self.carry = Carry(c.state, c.since_s, since_pos=c.since_pos)
            return False
        cand = raw_state(self.table, power_frac, util)
        if c.pending is not cand:
            c = Carry(c.state, c.since_s, cand, time_s, c.since_pos, pos)
        if time_s - c.pending_since_s >= self.table.dwell_s(cand):
            self.carry = Carry(cand, c.pending_since_s, since_pos=c.pending_pos)
            return True
        self.carry = c
        return False


def classify_series(table: PowerTable, time_s: np.ndarray, power_frac: np.ndarray, util: np.ndarray,
                    carry: Carry | None = None, pos: np.ndarray | None = None) -> tuple[list[Switch], Carry]:
    """Vectorised form of :class:`GpuClassifier` over one GPU's samples (``time_s`` non-decreasing).

    Returns the switches in order (the first sample of a fresh series always yields one) and the carry
    for the next chunk. ``pos`` is an optional per-sample coordinate reported with each ``since``.
    """
    n = len(time_s)
    if n == 0:
        if carry is None:
            raise ValueError("classify_series needs at least one sample when there is no carry")
        return [], carry
    if pos is None:
        pos = np.zeros(n)
    raw = raw_states(table, power_frac, util)
    switches: list[Switch] = []
    i = 0
    if carry is None:
        first = GPU_STATES[int(raw[0])]
        carry = Carry(first, float(time_s[0]), since_pos=float(pos[0]))
        switches.append(Switch(0, first, float(time_s[0]), float(pos[0])))
        i = 1
    state = carry.state
    # A pending candidate from the previous chunk continues only if its run reaches into index 0.
    pending, pending_t, pending_p = carry.pending, carry.pending_since_s, carry.pending_pos
    since_t, since_p = carry.since_s, carry.since_pos
    runs_cache: dict[GpuState, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def runs_for(s: GpuState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Runs of the candidate sequence while in state ``s``: (starts, ends, values)."""
        got = runs_cache.get(s)
        if got is None:
            cand = np.where(stays_mask(table, s, power_frac, util, raw), np.int8(CODE[s]), raw)
            change = np.flatnonzero(cand[1:] != cand[:-1]) + 1
            starts = np.concatenate(([0], change))
            ends = np.concatenate((change, [n]))
            got = (starts, ends, cand[starts])
            runs_cache[s] = got
        return got

    while i < n:
        starts, ends, values = runs_for(state)
        r = int(np.searchsorted(starts, i, side="right")) - 1
        switched = False
        while r < len(starts):
            start = max(int(starts[r]), i)
            end = int(ends[r])
            c = GPU_STATES[int(values[r])]
            if c is state:
                pending = None
                r += 1
                continue
            if pending is c and start == 0:
                run_t, run_p = pending_t, pending_p  # the run began in the previous chunk
            else:
                run_t, run_p = float(time_s[start]), float(pos[start])
            need = run_t + table.dwell_s(c)
            k = start + int(np.searchsorted(time_s[start:end], need, side="left"))
            if k < end:
                state, since_t, since_p = c, run_t, run_p
                switches.append(Switch(k, c, run_t, run_p))
                pending = None
                i = k + 1
                switched = True
                break
            pending, pending_t, pending_p = c, run_t, run_p
            r += 1
        if not switched:
            break
    if pending is None:
        out = Carry(state, since_t, since_pos=since_p)
    else:
        out = Carry(state, since_t, pending, pending_t, since_p, pending_p)
    return switches, out
