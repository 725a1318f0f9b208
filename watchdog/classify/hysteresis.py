"""Per-GPU state with hysteresis and a vote, in two equivalent forms.

The rule, for each sample of one GPU in time order:

1. ``candidate`` = the current state if the sample lies in its (widened) exit box, else the sample's
   raw band (:func:`gpu_triage.classify.bands.raw_state`). Exit boxes wider than enter boxes are the
   hysteresis: a GPU hovering on a boundary keeps its state.
2. The candidates since the last change form the *history*. When the current sample's candidate ``C``
   differs from the state, the GPU takes ``C`` if the history covers at least ``C``'s dwell and ``C``
   was the candidate of at least ``vote_share`` of the samples in the last ``dwell_s(C)`` seconds
   (``[t - dwell, t]``). The change is dated back to ``C``'s first sample in that window (``since``):
   the state began when its signature began, not when we were sure of it. The history restarts.

A failed read (NaN power, candidate ``unknown``) is no vote: it counts neither for nor against another
state, so one NVML timeout in four cannot hold a hung GPU in ``compute``; only ``unknown`` itself
counts them (the GPU goes ``unknown`` when most reads of its dwell fail).

With ``vote_share = 1`` this is "the candidate persisted for its whole dwell"; below 1 a bursty
signal (utilisation at 10 Hz flickers between kernels) still settles, while a single-sample spike
never changes the state (it is one vote in a window of several). A short dwell for ``compute`` makes
leaving the spin band for real work quick.

:class:`GpuClassifier` applies the rule one sample at a time (the daemon). :func:`classify_series`
applies it to whole arrays (triage): candidate codes, windows and vote counts are computed with numpy
(cumulative sums and ``searchsorted``), and Python loops only over state changes, not samples. It
carries its state across chunks through :class:`Carry`. The two forms give identical answers (a
property test feeds them random streams cut into random chunks).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpu_triage.classify.bands import CODE, UNKNOWN_CODE, raw_state, raw_states, stays_in, stays_mask
from gpu_triage.classify.power_table import Box, PowerTable
from gpu_triage.model.states import GPU_STATES, GpuState

_FIRST_BLOCK = 64
"""Samples :func:`_first_change` examines first (then fourfold more each round)."""
_EMPTY_F = np.empty(0, dtype=np.float64)
_EMPTY_I = np.empty(0, dtype=np.int8)


@dataclass(frozen=True, slots=True)
class Carry:
    """Classifier state between chunks of one GPU."""

    state: GpuState
    since_s: float
    since_pos: float = 0.0
    """Caller-defined position of ``since`` (triage: covered GPU-seconds), carried with it."""
    history_start_s: float | None = None
    """Time of the first sample after the last change (None: no sample since)."""
    hist_t: np.ndarray = field(default_factory=lambda: _EMPTY_F)
    hist_cand: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    hist_pos: np.ndarray = field(default_factory=lambda: _EMPTY_F)
    """The recent history (within the longest dwell) of candidates since the last change."""


@dataclass(frozen=True, slots=True)
class Switch:
    """The GPU took ``state`` at sample ``index`` (of this series), dated back to ``since_s``."""

    index: int
    state: GpuState
    since_s: float
    since_pos: float


def _max_dwell(table: PowerTable) -> float:
    return max(table.dwell_s(s) for s in GPU_STATES)


def _dwells(table: PowerTable) -> np.ndarray:
    """Each state's dwell in seconds, indexed by its code."""
    return np.array([table.dwell_s(s) for s in GPU_STATES], dtype=np.float64)


class GpuClassifier:
    """Streaming form: feed samples in time order, read ``state`` and ``since_s``."""

    def __init__(self, table: PowerTable) -> None:
        self.table = table
        self._state: GpuState | None = None
        self._since_s: float | None = None
        self._since_pos = 0.0
        self.previous = GpuState.UNKNOWN
        """The state before the last change (what :attr:`state` was before an update returned True)."""
        self._history: deque[tuple[float, int, float]] = deque()
        self._history_start_s: float | None = None
        self._keep_s = _max_dwell(table)
        self._exit_boxes: dict[GpuState, tuple[Box, ...]] = {
            state: band.exit_boxes() for state, band in table.bands.items() if state is not GpuState.UNKNOWN
        }
        """Each band's exit boxes, computed once (the table is immutable): the daemon asks 10 times a
        second per GPU whether a sample stays in its state."""
        self._boxes: tuple[Box, ...] | None = None
        """The current state's exit boxes (None for unknown or before the first sample)."""
        self._code = UNKNOWN_CODE
        """The current state's code (bands.CODE)."""

    @property
    def state(self) -> GpuState:
        return self._state if self._state is not None else GpuState.UNKNOWN

    @property
    def since_s(self) -> float | None:
        return self._since_s

    def _enter(self, state: GpuState, since_s: float, since_pos: float) -> None:
        self.previous = self.state
        self._state, self._since_s, self._since_pos = state, since_s, since_pos
        self._boxes = self._exit_boxes.get(state)
        self._code = CODE[state]

    def update(self, time_s: float, power_frac: float, util: float, pos: float = 0.0) -> bool:
        """Classify one sample; True when the state changed. NaN means missing."""
        boxes = self._boxes
        if boxes is not None and power_frac == power_frac and util == util:  # both read (not NaN)
            # a plain loop: 16 GPUs 10 times a second (no generator per sample)
            for p_lo, p_hi, u_lo, u_hi in boxes:
                if p_lo <= power_frac < p_hi and u_lo <= util < u_hi:
                    # the sample stays in its state (nearly every sample): a vote for it, no change
                    hist = self._history
                    hist.append((time_s, self._code, pos))
                    if self._history_start_s is None:
                        self._history_start_s = time_s
                    oldest_s = time_s - self._keep_s
                    while hist[0][0] < oldest_s:  # never empties: the sample just appended is newer
                        hist.popleft()
                    return False
            stays = False
        elif self._state is None:
            self._enter(raw_state(self.table, power_frac, util), time_s, pos)
            return True
        else:  # unknown, a failed read or a missing utilisation: the general rule
            stays = stays_in(self.table, self._state, power_frac, util)
        table = self.table
        state = self._state
        assert state is not None
        cand = state if stays else raw_state(table, power_frac, util)
        code = CODE[cand]
        hist = self._history
        hist.append((time_s, code, pos))
        if self._history_start_s is None:
            self._history_start_s = time_s
        oldest_s = time_s - self._keep_s
        while hist[0][0] < oldest_s:  # never empties: the sample just appended is not older
            hist.popleft()
        if cand is state:
            return False
        dwell = table.dwell_s(cand)
        if time_s - self._history_start_s < dwell:
            return False
        lo = time_s - dwell
        votes = total = 0
        first: tuple[float, float] | None = None
        for t, c, p in hist:
            if t >= lo and (c != UNKNOWN_CODE or code == UNKNOWN_CODE):  # a failed read is no vote
                total += 1
                if c == code:
                    votes += 1
                    if first is None:
                        first = (t, p)
        if votes >= table.vote_share * total:
            assert first is not None
            self._enter(cand, first[0], first[1])
            hist.clear()
            self._history_start_s = None
            return True
        return False


def _first_change(
    t: np.ndarray,
    cand: np.ndarray,
    counts: np.ndarray,
    others: np.ndarray,
    i: int,
    h0: int,
    hist_start: float,
    share: float,
    dwell_by_code: np.ndarray,
) -> int:
    """The first sample index (from ``others[i:]``) at which a candidate state wins its vote over its
    dwell window: examined in blocks growing fourfold, so a long steady run costs a few array passes;
    every candidate of a block at once (each sample is judged for its own candidate, with that
    candidate's dwell). ``counts[c, k]``: how many of the first ``k`` samples hold candidate ``c``.
    -1 when none does."""
    # (numpy's methods and 1-D indexes: this runs once per state change, on small arrays, where the
    # call overhead is most of the cost)
    block = _FIRST_BLOCK
    flat = counts.reshape(-1)
    row = counts.shape[1]
    unknown_row = UNKNOWN_CODE * row
    while i < len(others):
        ks = others[i : i + block]
        vals = cand[ks]
        dwell = dwell_by_code[vals]
        tk = t[ks]
        wk = t.searchsorted(tk - dwell)
        np.maximum(wk, h0, out=wk)
        after = ks + 1
        mine = vals.astype(np.intp) * row
        votes = flat[mine + after] - flat[mine + wk]
        # a failed read is no vote, except for unknown itself
        abstain = flat[unknown_row + after] - flat[unknown_row + wk]
        abstain[vals == UNKNOWN_CODE] = 0
        fire = (tk - hist_start >= dwell) & (votes >= share * ((after - wk) - abstain))
        first = int(fire.argmax())
        if fire[first]:
            return int(ks[first])
        i += block
        block = min(block * 4, 1 << 16)
    return -1


def classify_series(
    table: PowerTable,
    time_s: np.ndarray,
    power_frac: np.ndarray,
    util: np.ndarray,
    carry: Carry | None = None,
    pos: np.ndarray | None = None,
) -> tuple[list[Switch], Carry]:
    """Vectorised form of :class:`GpuClassifier` over one GPU's samples (``time_s`` non-decreasing).

    Returns the switches in order (the first sample of a fresh series always yields one) and the carry
    for the next chunk. ``pos`` is an optional per-sample coordinate reported with each ``since``.
    """
    n_new = len(time_s)
    if n_new == 0:
        if carry is None:
            raise ValueError("classify_series needs at least one sample when there is no carry")
        return [], carry
    if pos is None:
        pos = np.zeros(n_new)
    raw_new = raw_states(table, power_frac, util)
    switches: list[Switch] = []
    if carry is None:
        first = GPU_STATES[int(raw_new[0])]
        carry = Carry(first, float(time_s[0]), float(pos[0]))
        switches.append(Switch(0, first, float(time_s[0]), float(pos[0])))
        skip = 1  # the first sample set the state; the history starts after it
    else:
        skip = 0
    h = len(carry.hist_t)
    t = np.concatenate((carry.hist_t, time_s)) if h else np.asarray(time_s, dtype=np.float64)
    ps = np.concatenate((carry.hist_pos, pos)) if h else np.asarray(pos, dtype=np.float64)
    n = len(t)
    state = carry.state
    since_t, since_p = carry.since_s, carry.since_pos
    hist_start = carry.history_start_s
    h0 = 0 if h else skip  # first index of the current history (a carried history is this state's)
    share = table.vote_share
    dwell_by_code = _dwells(table)
    cand_cache: dict[GpuState, np.ndarray] = {}

    def cand_for(s: GpuState) -> np.ndarray:
        got = cand_cache.get(s)
        if got is None:
            mine = np.where(stays_mask(table, s, power_frac, util, raw_new), np.int8(CODE[s]), raw_new)
            if h:
                head = carry.hist_cand if s is carry.state else np.full(h, UNKNOWN_CODE, np.int8)
                mine = np.concatenate((head, mine))
            got = cand_cache[s] = mine.astype(np.int8, copy=False)
        return got

    count_cache: dict[GpuState, np.ndarray] = {}

    def counts_for(s: GpuState) -> np.ndarray:
        """(codes, n + 1): how many of the first k samples hold each candidate while in state s."""
        got = count_cache.get(s)
        if got is None:
            cand = cand_for(s)
            got = np.zeros((len(GPU_STATES), n + 1), dtype=np.int64)
            for c in np.flatnonzero(np.bincount(cand, minlength=len(GPU_STATES))):
                np.cumsum(cand == c, out=got[c, 1:])
            count_cache[s] = got
        return got

    other_cache: dict[GpuState, np.ndarray] = {}

    def others_for(s: GpuState) -> np.ndarray:
        """Indices whose candidate (while in state s) is another state: the only places a change can fire."""
        got = other_cache.get(s)
        if got is None:
            got = other_cache[s] = np.flatnonzero(cand_for(s) != CODE[s])
        return got

    while h0 < n:
        if hist_start is None:
            hist_start = float(t[h0])
        cand = cand_for(state)
        others = others_for(state)
        i = int(others.searchsorted(max(h0, h)))  # carried samples were judged in their own chunk
        fired_k = _first_change(t, cand, counts_for(state), others, i, h0, hist_start, share, dwell_by_code)
        if fired_k < 0:
            break
        c = int(cand[fired_k])
        lo = max(int(t.searchsorted(t[fired_k] - dwell_by_code[c])), h0)
        j = lo + int((cand[lo : fired_k + 1] == c).argmax())  # c's first sample in the window
        state = GPU_STATES[c]
        since_t, since_p = float(t[j]), float(ps[j])
        switches.append(Switch(fired_k - h, state, since_t, since_p))
        h0 = fired_k + 1
        hist_start = None
    # the history to carry: samples since the last change, within the longest dwell of the last one
    if h0 < n:
        keep_from = max(h0, int(np.searchsorted(t, t[-1] - _max_dwell(table), side="left")))
        cand = cand_for(state)
        out = Carry(
            state,
            since_t,
            since_p,
            hist_start,
            t[keep_from:].copy(),
            cand[keep_from:].copy(),
            ps[keep_from:].copy(),
        )
    else:
        out = Carry(state, since_t, since_p, None)
    return switches, out
