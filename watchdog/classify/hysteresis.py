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
(cumulative sums and ``searchsorted``), and Python loops only over state changes, not samples. Where a
sample would win its vote does not depend on where the last change was, once the sample lies more than
the longest dwell after it (its window then holds no sample from before the change): so each state's
winning samples are found once per series (:class:`_StateScan`), and a change costs a look at the few
samples just after the last one plus a ``searchsorted``. It carries its state across chunks through
:class:`Carry`. The two forms give identical answers (property tests feed them random streams cut
into random chunks, on regular and irregular clocks).
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
_FAR_MARGIN_S = 1e-3
"""Beyond the longest dwell after the last change, plus this (far above the rounding of a time minus
a dwell), a sample's window and history test cannot depend on that change (see :class:`_StateScan`)."""
_EMPTY_F = np.empty(0, dtype=np.float64)
_EMPTY_I = np.empty(0, dtype=np.int8)
_EMPTY_IDX = np.empty(0, dtype=np.intp)
_ZERO_IDX = np.zeros(1, dtype=np.intp)


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


def _vote_test(
    t: np.ndarray,
    cand: np.ndarray,
    counts: np.ndarray,
    ks: np.ndarray,
    h0: int,
    share: float,
    dwell_by_code: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the samples ``ks`` (indices, ascending): their times, their candidates' dwells, and whether
    each candidate wins its vote over its dwell window (cut to start no earlier than ``h0``, the first
    sample since the last change). ``counts[c, k]``: how many of the first ``k`` samples hold
    candidate ``c``."""
    # (numpy's methods and 1-D indexes: this runs on small arrays, where the call overhead is most of
    # the cost)
    flat = counts.reshape(-1)
    row = counts.shape[1]
    vals = cand[ks]
    dwell = dwell_by_code[vals]
    tk = t[ks]
    wk = t.searchsorted(tk - dwell)
    if h0:
        np.maximum(wk, h0, out=wk)
    after = ks + 1
    mine = vals.astype(np.intp) * row
    votes = flat[mine + after] - flat[mine + wk]
    # a failed read is no vote, except for unknown itself
    unknown_row = UNKNOWN_CODE * row
    abstain = flat[unknown_row + after] - flat[unknown_row + wk]
    abstain[vals == UNKNOWN_CODE] = 0
    return tk, dwell, votes >= share * ((after - wk) - abstain)


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
    dwell window, with a history since the last change (``hist_start``) at least that long: examined
    in blocks growing fourfold, so a long steady run costs a few array passes; every candidate of a
    block at once (each sample is judged for its own candidate, with that candidate's dwell). -1 when
    none does. The exact rule, for the samples just after a change (:meth:`_StateScan.next_change`)."""
    block = _FIRST_BLOCK
    while i < len(others):
        ks = others[i : i + block]
        tk, dwell, won = _vote_test(t, cand, counts, ks, h0, share, dwell_by_code)
        fire = (tk - hist_start >= dwell) & won
        first = int(fire.argmax())
        if fire[first]:
            return int(ks[first])
        i += block
        block = min(block * 4, 1 << 16)
    return -1


class _StateScan:
    """One state's view of one series, computed once: each sample's candidate while in that state
    (``cand``), the running vote counts (``counts[c, k]``: how many of the first ``k`` samples hold
    candidate ``c``), the samples whose candidate is another state (``others``: the only places a
    change can fire), and where those samples win their vote over a window not cut by a change.

    A sample more than the longest dwell after the last change (and after the history's start) has a
    window wholly after that change and a history long enough for any candidate, so whether it fires
    does not depend on where the change was. Only the samples closer than that are judged by the exact
    rule (:func:`_first_change`); beyond, the answer is looked up. To find those wins, only the head of
    each run of one candidate is examined (``wins``): from the first sample whose window lies wholly in
    its run (``tail_start``) to the run's end (``tail_end``) every sample wins, its whole window voting
    for it. So a change costs a look at a few samples and a few ``searchsorted``, and a scan a few
    passes over the series and a vote per run head, not per sample.

    Times that are not all finite take the exact rule everywhere (``wins`` is None). ``counts`` holds
    no row for the state itself (unless unknown): its own votes are never asked for."""

    __slots__ = ("cand", "counts", "others", "t_others", "tail_end", "tail_start", "wins")

    def __init__(
        self,
        t: np.ndarray,
        cand: np.ndarray,
        code: int,
        share: float,
        dwell_by_code: np.ndarray,
        finite: bool,
    ) -> None:
        n = len(t)
        self.cand = cand
        # only another state's votes are ever counted, and failed reads (abstentions)
        counts = np.zeros((len(GPU_STATES), n + 1), dtype=np.int32 if n < 1 << 31 else np.int64)
        for c in np.flatnonzero(np.bincount(cand, minlength=len(GPU_STATES))):
            if c != code or c == UNKNOWN_CODE:
                np.cumsum(cand == c, out=counts[c, 1:])
        self.counts = counts
        self.others = others = np.flatnonzero(cand != code)
        self.t_others = t[others]
        self.wins: np.ndarray | None = None
        self.tail_start = self.tail_end = _EMPTY_IDX
        if not len(others) or not finite:
            return
        # runs of one candidate, other than this state
        starts = np.flatnonzero(cand[1:] != cand[:-1]) + 1
        starts = np.concatenate((_ZERO_IDX, starts))
        ends = np.append(starts[1:], n)
        keep = cand[starts] != code
        starts, ends = starts[keep], ends[keep]
        # the first sample whose window starts inside its run: a sample before the run lies more than
        # the dwell (plus a margin far above rounding) before it
        reach = t[np.maximum(starts - 1, 0)] + dwell_by_code[cand[starts]]
        reach += _FAR_MARGIN_S + np.abs(reach) * 1e-12
        sure = np.where(starts == 0, 0, t.searchsorted(reach, side="right"))
        sure = np.minimum(np.maximum(sure, starts), ends)
        # examine each run's head up to and with its first sure sample
        lengths = np.minimum(sure + 1, ends) - starts
        shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        heads = np.arange(len(shift)) + shift
        _, _, won = _vote_test(t, cand, counts, heads, 0, share, dwell_by_code)
        self.wins = heads[won]
        tailed = sure < ends
        self.tail_start, self.tail_end = sure[tailed], ends[tailed]

    def next_change(
        self,
        t: np.ndarray,
        i: int,
        h0: int,
        hist_start: float,
        share: float,
        dwell_by_code: np.ndarray,
        max_dwell_s: float,
    ) -> int:
        """:func:`_first_change` over ``others[i:]`` (``h0``: the first sample since the last change,
        ``hist_start``: the history's start time), by the exact rule only where the change can matter."""
        others = self.others
        wins = self.wins
        if wins is None:
            return _first_change(t, self.cand, self.counts, others, i, h0, hist_start, share, dwell_by_code)
        # (the history starts after the last change: at or after the time of the sample before it)
        near_end = hist_start + max_dwell_s
        near_end += _FAR_MARGIN_S + abs(near_end) * 1e-12
        j = int(self.t_others.searchsorted(near_end))
        if i < j:
            k = _first_change(t, self.cand, self.counts, others[:j], i, h0, hist_start, share, dwell_by_code)
            if k >= 0:
                return k
            i = j
        if i >= len(others):
            return -1
        x = int(others[i])
        run = int(self.tail_start.searchsorted(x, side="right")) - 1
        if run >= 0 and x < self.tail_end[run]:
            return x
        w = int(wins.searchsorted(x))
        return int(wins[w]) if w < len(wins) else -1


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
    max_dwell_s = float(dwell_by_code.max())
    finite = bool(np.isfinite(t).all())
    scans: dict[GpuState, _StateScan] = {}

    def scan_for(s: GpuState) -> _StateScan:
        got = scans.get(s)
        if got is None:
            mine = np.where(stays_mask(table, s, power_frac, util, raw_new), np.int8(CODE[s]), raw_new)
            if h:
                head = carry.hist_cand if s is carry.state else np.full(h, UNKNOWN_CODE, np.int8)
                mine = np.concatenate((head, mine))
            got = scans[s] = _StateScan(
                t, mine.astype(np.int8, copy=False), CODE[s], share, dwell_by_code, finite
            )
        return got

    while h0 < n:
        if hist_start is None:
            hist_start = float(t[h0])
        scan = scan_for(state)
        i = int(scan.others.searchsorted(max(h0, h)))  # carried samples were judged in their own chunk
        fired_k = scan.next_change(t, i, h0, hist_start, share, dwell_by_code, max_dwell_s)
        if fired_k < 0:
            break
        cand = scan.cand
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
        keep_from = max(h0, int(np.searchsorted(t, t[-1] - max_dwell_s, side="left")))
        cand = scan_for(state).cand
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
