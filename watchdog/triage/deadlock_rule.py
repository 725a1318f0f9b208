"""The power-only deadlock rule for offline use (pure).

A recording has power and utilisation only, no progress or process signals. The one thing power can
say is ``checkpoint_or_deadlock``; what separates a deadlock from a save is time and symmetry: while a
checkpoint is written, the writer's GPU shows low utilisation, so GPUs in the band with no writer
beside them means no local save. The rule works per *group* of GPUs that share the signature (a node
can run two jobs, and one may hang while the other trains):

- every GPU of the recording in ``checkpoint_or_deadlock`` at once for ``deadlock_after_s`` is a
  ``deadlock`` (the whole node hung);
- a group of GPUs that entered the band within ``entry_window_s`` of each other and stayed there for
  ``deadlock_after_s`` is a ``deadlock`` of those GPUs, unless a GPU outside the group looks like a
  checkpoint writer for them: it was working (compute or communication) shortly before the group
  entered the band and dropped to low utilisation (``idle`` or ``data_starvation``) meanwhile. GPUs
  outside the group that keep computing are another job; GPUs idle all along are unused.

Default: 300 s. On the real 8 x H100 traces the waiting GPUs sit in the band for 15-55 s per save,
but with the writer's GPU outside it; the dangerous case is a multi-node job whose writer lives on
*another* node: then every GPU of this node waits for the whole save, which for a 32B model (~460 GB
of ZeRO-3 state) takes minutes. 300 s is the contract's ceiling and the most conservative choice;
lower it with ``--deadlock-after`` where saves are known to be short.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_DEADLOCK_AFTER_S = 300.0
ENTRY_WINDOW_S = 60.0
"""GPUs of one hung job enter the band within this long of each other."""
WORKING = frozenset({"compute", "communication"})
LOW_UTILISATION = frozenset({"idle", "data_starvation"})


@dataclass(frozen=True, slots=True)
class DeadlockFinding:
    gpus: tuple[int, ...]
    onset_s: float
    """When the last GPU entered the band (every GPU in it from here)."""
    detected_s: float
    """onset + deadlock_after: when the rule fires."""
    ended_s: float | None
    """When the first GPU left the band again, or None if the recording ends inside it."""


def all_in_band(intervals: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Intervals when every GPU is inside one of its own ``[start, end)`` intervals (sweep line)."""
    n = len(intervals)
    if n == 0:
        return []
    events: list[tuple[float, int]] = []
    for gpu_intervals in intervals:
        for a, b in gpu_intervals:
            if b > a:
                events.append((a, 1))
                events.append((b, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    out: list[tuple[float, float]] = []
    depth, opened = 0, 0.0
    for t, d in events:
        depth += d
        if d == 1 and depth == n:
            opened = t
        elif d == -1 and depth == n - 1 and t > opened:
            out.append((opened, t))
    return out


Segment = tuple[float, float, str]
"""(start, end, state) of one GPU."""


def find_deadlocks(
    band_intervals: Sequence[Sequence[tuple[float, float]]],
    end_s: float,
    deadlock_after_s: float,
    segments: Sequence[Sequence[Segment]] | None = None,
    entry_window_s: float = ENTRY_WINDOW_S,
) -> list[DeadlockFinding]:
    """Apply the rule; ``end_s`` is the end of the recording (an interval reaching it is still open).
    ``segments`` (every state of every GPU) enables the per-group rule; without them only the
    whole-node rule applies."""
    n = len(band_intervals)
    gpus = tuple(range(n))
    found = []
    for a, b in all_in_band(band_intervals):
        if b - a >= deadlock_after_s:
            found.append(DeadlockFinding(gpus, a, a + deadlock_after_s, None if b >= end_s else b))
    if segments is None or n < 2:
        return found
    # Candidate groups: around each entry into the band, the GPUs that entered within the window of
    # it and stay in the band for the rule's duration from the group's onset (its last entry).
    candidates: dict[tuple[int, ...], tuple[float, float]] = {}
    for entry in sorted({a for spans in band_intervals for a, _ in spans}):
        members: list[tuple[int, float, float]] = []
        for g, spans in enumerate(band_intervals):
            for a, b in spans:
                if abs(a - entry) <= entry_window_s and a <= entry + entry_window_s:
                    members.append((g, a, b))
                    break
        if not members:
            continue
        onset = max(a for _, a, _ in members)
        held = [(g, b) for g, _, b in members if b - onset >= deadlock_after_s]
        if len(held) < len(members) or len(held) == n:
            continue  # someone left early (not one signature), or the whole node (found above)
        key = tuple(g for g, _ in held)
        ended = min(b for _, b in held)
        if key not in candidates or onset < candidates[key][0]:
            candidates[key] = (onset, ended)
    whole = [(f.onset_s - entry_window_s, f.ended_s if f.ended_s is not None else end_s) for f in found]
    for key, (onset, ended) in sorted(candidates.items(), key=lambda kv: kv[1][0]):
        if any(lo <= onset <= hi for lo, hi in whole):
            continue
        larger = [
            k for k, (o, _) in candidates.items() if set(key) < set(k) and abs(o - onset) <= entry_window_s
        ]
        if larger:
            continue
        window = (onset, onset + deadlock_after_s)
        outsiders = [g for g in range(n) if g not in key]
        if any(_looks_like_a_writer(segments[g], onset - entry_window_s, window) for g in outsiders):
            continue
        found.append(DeadlockFinding(key, onset, onset + deadlock_after_s, None if ended >= end_s else ended))
    found.sort(key=lambda f: (f.onset_s, f.gpus))
    return found


def _looks_like_a_writer(segments: Sequence[Segment], before_s: float, window: tuple[float, float]) -> bool:
    """Working shortly before ``window`` began, at low utilisation during it: a checkpoint writer."""
    start, end = window
    worked = any(state in WORKING and b > before_s and a < start for a, b, state in segments)
    low = sum(max(0.0, min(b, end) - max(a, start)) for a, b, state in segments if state in LOW_UTILISATION)
    return worked and low > 0.0
