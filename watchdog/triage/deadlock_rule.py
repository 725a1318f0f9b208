"""The power-only deadlock rule for offline use (pure).

A recording has power and utilisation only, no progress or process signals. The one thing power can
say is ``checkpoint_or_deadlock``; what separates a deadlock from a save is time and symmetry: while a
checkpoint is written, the writer's GPU shows low utilisation, so *every* GPU in the band means no
local writer. The rule: every GPU of the recording in ``checkpoint_or_deadlock`` at once for at least
``deadlock_after_s`` gives a ``deadlock`` verdict.

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
MAX_DEADLOCK_AFTER_S = 300.0


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


def find_deadlocks(
    band_intervals: Sequence[Sequence[tuple[float, float]]], end_s: float, deadlock_after_s: float
) -> list[DeadlockFinding]:
    """Apply the rule; ``end_s`` is the end of the recording (an interval reaching it is still open)."""
    gpus = tuple(range(len(band_intervals)))
    found = []
    for a, b in all_in_band(band_intervals):
        if b - a >= deadlock_after_s:
            found.append(DeadlockFinding(gpus, a, a + deadlock_after_s, None if b >= end_s else b))
    return found
