"""The power-only rule for offline use (pure): waits, their cadence, and suspected deadlocks.

A recording has power and utilisation only. What power can say is ``checkpoint_or_deadlock``: GPUs
spinning in a collective. A save and a hang look the same on the waiting GPUs for as long as the save
lasts, so this rule never proves a hang; it says when a wait is *out of line with what the recording
itself shows*, with its evidence, and calls that a suspected deadlock.

1. **Bursts are progress.** Each GPU's ``checkpoint_or_deadlock`` intervals (the classifier's, with
   hysteresis) are cut at the GPU's own compute bursts (:mod:`gpu_triage.triage.bursts`, raw
   samples): a training step, even one of well under a second that the hysteresis swallows. A
   deadlocked GPU draws a flat spin.
2. **Groups and waits.** Pieces of different GPUs that began within ``entry_window_s`` of each other
   and ended within it of each other (or all run to the end of the recording) are one group's *wait*:
   one job's waiting GPUs (a node can run two jobs, and one may hang while the other steps). A wait
   ends in ``progress`` (at least half of its GPUs burst or went back to work), by leaving the band
   without working (``left_band``: idle, the job gone), or is ``open`` (the recording ends).
3. **Cadence.** Waits that ended in progress are what the job survived: its save cadence. A wait is
   compared with the earlier such waits of GPUs it shares at least half of its GPUs with; it is
   *out of line* when it lasts longer than ``CADENCE_FACTOR`` times the longest of them.
4. **Suspected deadlock.** A wait that did not end in progress, lasted at least ``deadlock_after_s``
   and, where a cadence is known, is out of line with it. A GPU outside the group that looks like the
   save's writer (it was working, then sat at low utilisation for most of the wait) excuses the wait
   while no cadence is known; once the recording has shown how long this job's saves take, a wait far
   beyond them is suspected even with a writer beside it (a save that never ends).

Open waits that begin together (within ``entry_window_s``) are one finding: a writer that joins the
hang a moment later is the same deadlock.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import accumulate, pairwise
from statistics import median
from typing import Any

from gpu_triage.triage.bursts import Bursts

ENTRY_WINDOW_S = 60.0
"""GPUs of one job enter (and leave) the band within this long of each other."""
CADENCE_FACTOR = 2.0
"""A wait longer than this many times the longest wait the job survived is out of line. Saves of one
job vary (they grow as optimizer state fills, storage is shared); twice the longest leaves room for
that and still flags a hang long before a fixed multi-minute rule would on a job with short saves."""
COINCIDENCE_S = 1.0
"""A burst this close to a wait's start or end belongs to the step that starts or ends it."""
WRITER_LOW_SHARE = 0.5
"""A writer sits at low utilisation for at least this share of the wait (checked up to the rule's
duration)."""
WORKING = frozenset({"compute", "communication"})
LOW_UTILISATION = frozenset({"idle", "data_starvation"})

Segment = tuple[float, float, str]
"""(start, end, state) of one GPU."""


class EndedBy(StrEnum):
    PROGRESS = "progress"
    LEFT_BAND = "left_band"
    OPEN = "open"


class WaitKind(StrEnum):
    CHECKPOINT = "checkpoint"
    """Ended in progress and recurs (a cadence), or a writer was seen beside it."""
    WAIT = "wait"
    """Ended (in progress or leaving the band) with nothing to name it by."""
    OPEN = "open"
    """Still waiting at the end of the recording, within the rule."""
    SUSPECTED_DEADLOCK = "suspected_deadlock"


@dataclass(frozen=True, slots=True)
class Cadence:
    """The waits a group of GPUs survived (ended in progress), as the recording shows them."""

    waits: int
    median_s: float
    longest_s: float
    every_s: float | None
    """Median time from one wait's start to the next's (None with one wait)."""
    work_s: float | None
    """Median time between a wait's end and the next one's start: the bursts or training between."""

    @property
    def limit_s(self) -> float:
        return CADENCE_FACTOR * self.longest_s

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 3)

        return {
            "waits": self.waits,
            "median_s": r(self.median_s),
            "longest_s": r(self.longest_s),
            "every_s": r(self.every_s),
            "work_s": r(self.work_s),
            "limit_s": r(self.limit_s),
        }


def cadence_of(waits: Sequence[tuple[float, float]]) -> Cadence | None:
    """The cadence of ``(start_s, end_s)`` waits, or None if there are none."""
    if not waits:
        return None
    ordered = sorted(waits)
    durations = [b - a for a, b in ordered]
    starts = [a for a, _ in ordered]
    every = median(y - x for x, y in pairwise(starts)) if len(ordered) > 1 else None
    work = median(max(0.0, nxt[0] - cur[1]) for cur, nxt in pairwise(ordered)) if len(ordered) > 1 else None
    return Cadence(len(ordered), median(durations), max(durations), every, work)


@dataclass(frozen=True, slots=True)
class Wait:
    """One group's stretch in ``checkpoint_or_deadlock`` with no burst: a spin episode."""

    gpus: tuple[int, ...]
    start_s: float
    end_s: float
    ended_by: EndedBy
    kind: WaitKind
    writer_gpu: int | None = None
    out_of_line: bool = False
    """Longer than the cadence learned before it allows."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": list(self.gpus),
            "start_s": round(self.start_s, 3),
            "end_s": round(self.end_s, 3),
            "duration_s": round(self.duration_s, 3),
            "ended_by": str(self.ended_by),
            "kind": str(self.kind),
            "writer_gpu": self.writer_gpu,
            "out_of_line": self.out_of_line,
        }


@dataclass(frozen=True, slots=True)
class DeadlockFinding:
    gpus: tuple[int, ...]
    onset_s: float
    """When the wait began: every GPU of the group in the band, no burst since."""
    detected_s: float
    """When the rule fires: onset + the larger of the rule's duration and the cadence's limit."""
    ended_s: float | None
    """When the GPUs left the band (without working), or None if the recording ends inside it."""
    departed_from_cadence_s: float | None = None
    """onset + the cadence's limit: from here the wait was longer than anything the job survived."""
    cadence: Cadence | None = None
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RuleResult:
    findings: list[DeadlockFinding]
    waits: list[Wait]
    cadences: list[tuple[tuple[int, ...], Cadence]]
    """Per GPU group with waits that ended in progress: their cadence over the whole recording."""


@dataclass(frozen=True, slots=True)
class _Piece:
    """One GPU's stretch in the band with no burst of its own."""

    gpu: int
    start_s: float
    end_s: float
    ended_by: EndedBy


@dataclass(frozen=True, slots=True)
class _Group:
    gpus: tuple[int, ...]
    onset_s: float
    end_s: float
    ended_by: EndedBy


def _pieces(
    gpu: int,
    spans: Sequence[tuple[float, float]],
    bursts: Bursts,
    timeline: _Timeline,
    end_s: float,
) -> list[_Piece]:
    """``gpu``'s band intervals cut at its own bursts."""
    out: list[_Piece] = []
    # the bursts overlapping each interval (Bursts.within), found for every interval at once
    first, last = bursts.within_each(spans)
    burst_starts, burst_ends = bursts.start_s.tolist(), bursts.end_s.tolist()
    for (a, b), i, j in zip(spans, first, last, strict=True):
        if b <= a:
            continue
        cursor = a
        for s, e in zip(burst_starts[i:j], burst_ends[i:j], strict=True):
            if s > cursor:
                out.append(_Piece(gpu, cursor, s, EndedBy.PROGRESS))
            cursor = max(cursor, e)
        if b > cursor:
            if b >= end_s:
                ended = EndedBy.OPEN
            elif timeline.state_at(b) in WORKING:
                ended = EndedBy.PROGRESS
            else:
                ended = EndedBy.LEFT_BAND
            out.append(_Piece(gpu, cursor, b, ended))
    return out


def _groups(pieces: Sequence[_Piece], window_s: float) -> list[_Group]:
    """Pieces of different GPUs that began within ``window_s`` of each other (while the first was
    still going) and ended within it of each other (or all run to the end) are one group's wait."""
    items = sorted(pieces, key=lambda p: (p.start_s, p.gpu))
    used = [False] * len(items)
    groups: list[_Group] = []
    for i, seed in enumerate(items):
        if used[i]:
            continue
        members: dict[int, int] = {}
        j = i
        while j < len(items) and items[j].start_s <= seed.start_s + window_s:
            if not used[j] and items[j].gpu not in members and items[j].start_s < seed.end_s:
                members[items[j].gpu] = j
            j += 1
        by_end = sorted(members.values(), key=lambda k: items[k].end_s)
        clusters: list[list[_Piece]] = []
        for k in by_end:
            used[k] = True
            p = items[k]
            if clusters and (
                p.end_s - clusters[-1][-1].end_s <= window_s
                and (p.ended_by is EndedBy.OPEN) == (clusters[-1][-1].ended_by is EndedBy.OPEN)
            ):
                clusters[-1].append(p)
            else:
                clusters.append([p])
        for cluster in clusters:
            onset = max(p.start_s for p in cluster)
            end = min(p.end_s for p in cluster)
            for part in [cluster] if onset < end else [[p] for p in cluster]:
                groups.append(_group(part))
    groups.sort(key=lambda grp: (grp.onset_s, grp.gpus))
    return groups


def _group(part: Sequence[_Piece]) -> _Group:
    gpus = tuple(sorted(p.gpu for p in part))
    if all(p.ended_by is EndedBy.OPEN for p in part):
        ended = EndedBy.OPEN
    elif sum(p.ended_by is EndedBy.PROGRESS for p in part) >= _need(gpus):
        ended = EndedBy.PROGRESS
    else:
        ended = EndedBy.LEFT_BAND
    return _Group(gpus, max(p.start_s for p in part), min(p.end_s for p in part), ended)


def _need(gpus: Sequence[int]) -> int:
    """At least half of a group's GPUs (one of one)."""
    return max(1, math.ceil(len(gpus) / 2))


class _Timeline:
    """One GPU's segments, searchable by time."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = list(segments)
        self.starts = [a for a, _, _ in self.segments]

    def state_at(self, t: float) -> str | None:
        i = bisect.bisect_right(self.starts, t) - 1
        return self.segments[i][2] if i >= 0 else None

    def overlapping(self, lo: float, hi: float) -> list[Segment]:
        i = max(0, bisect.bisect_right(self.starts, lo) - 1)
        out = []
        while i < len(self.segments) and self.segments[i][0] < hi:
            if self.segments[i][1] > lo:
                out.append(self.segments[i])
            i += 1
        return out


def _writer(
    timelines: Sequence[_Timeline],
    bursts: Sequence[Bursts],
    gpus: Sequence[int],
    start_s: float,
    end_s: float,
    before_s: float,
) -> int | None:
    """A GPU outside ``gpus`` that worked (a working state or a burst) since ``start_s - before_s``,
    sat at low utilisation for most of ``[start_s, end_s]`` and did not compute meanwhile: the save's
    writer. (A GPU that keeps bursting is another job stepping, not a writer waiting for its save.)"""
    span = end_s - start_s
    if span <= 0:
        return None
    inside = set(gpus)
    for g, tl in enumerate(timelines):
        if g in inside:
            continue
        segs = tl.overlapping(start_s - before_s, end_s)
        low = sum(
            max(0.0, min(b, end_s) - max(a, start_s)) for a, b, state in segs if state in LOW_UTILISATION
        )
        if low < WRITER_LOW_SHARE * span:
            continue
        mine = bursts[g] if g < len(bursts) else Bursts()
        if len(mine.within(start_s + COINCIDENCE_S, end_s - COINCIDENCE_S)[0]):
            continue
        worked = any(state in WORKING and a < end_s for a, _, state in segs)
        if worked or len(mine.within(start_s - before_s, start_s + COINCIDENCE_S)[0]):
            return g
    return None


def _shares(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """``a`` shares at least half of ``b``'s GPUs."""
    return 2 * len(set(a) & set(b)) >= len(b)


def _fmt_gpus(gpus: Sequence[int]) -> str:
    gpus = sorted(gpus)
    if len(gpus) > 2 and gpus == list(range(gpus[0], gpus[-1] + 1)):
        return f"GPUs {gpus[0]}-{gpus[-1]}"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(map(str, gpus))


def analyse(
    band_intervals: Sequence[Sequence[tuple[float, float]]],
    end_s: float,
    deadlock_after_s: float,
    segments: Sequence[Sequence[Segment]],
    bursts: Sequence[Bursts] | None = None,
    entry_window_s: float = ENTRY_WINDOW_S,
) -> RuleResult:
    """Apply the rule. ``end_s``: the end of the recording (an interval reaching it is still open);
    ``segments``: every state of every GPU; ``bursts``: every GPU's compute bursts (none if omitted)."""
    n = len(band_intervals)
    bursts = list(bursts) if bursts is not None else [Bursts() for _ in range(n)]
    timelines = [_Timeline(s) for s in segments]
    pieces = [
        piece
        for g, spans in enumerate(band_intervals)
        for piece in _pieces(g, spans, bursts[g] if g < len(bursts) else Bursts(), timelines[g], end_s)
    ]
    raw = [(grp.onset_s, grp.end_s, grp.gpus, grp.ended_by) for grp in _groups(pieces, entry_window_s)]
    raw.sort(key=lambda w: (w[0], w[2]))

    survived: dict[tuple[int, ...], list[tuple[float, float]]] = {}
    for a, b, gpus, ended in raw:
        if ended is EndedBy.PROGRESS:
            survived.setdefault(gpus, []).append((a, b))
    # per group: its survived waits' ends (in order: a group's waits follow each other) and the
    # longest wait up to each, so "the longest wait survived before t" is a bisection
    ends = {key: [b for _, b in w] for key, w in survived.items()}
    longest = {key: list(accumulate((b - a for a, b in w), max)) for key, w in survived.items()}
    sharing: dict[tuple[int, ...], list[tuple[int, ...]]] = {}

    def keys_for(gpus: tuple[int, ...]) -> list[tuple[int, ...]]:
        if gpus not in sharing:
            sharing[gpus] = [key for key in survived if _shares(key, gpus)]
        return sharing[gpus]

    def longest_before(gpus: tuple[int, ...], before_s: float) -> float | None:
        best: float | None = None
        for key in keys_for(gpus):
            k = bisect.bisect_right(ends[key], before_s)
            if k:
                best = longest[key][k - 1] if best is None else max(best, longest[key][k - 1])
        return best

    def learned(gpus: tuple[int, ...], before_s: float) -> list[tuple[float, float]]:
        return [w for key in keys_for(gpus) for w in survived[key] if w[1] <= before_s]

    waits: list[Wait] = []
    candidates: list[DeadlockFinding] = []
    for a, b, gpus, ended in raw:
        duration = b - a
        survived_longest = longest_before(gpus, a)
        limit = None if survived_longest is None else CADENCE_FACTOR * survived_longest
        out_of_line = limit is not None and duration > limit
        writer = _writer(timelines, bursts, gpus, a, min(b, a + deadlock_after_s), entry_window_s)
        if ended is EndedBy.PROGRESS:
            recurs = sum(len(survived[key]) for key in keys_for(gpus)) >= 2
            kind = WaitKind.CHECKPOINT if (recurs or writer is not None) else WaitKind.WAIT
            waits.append(Wait(gpus, a, b, ended, kind, writer, out_of_line))
            continue
        threshold = max(deadlock_after_s, limit or 0.0)
        quiet = WaitKind.OPEN if ended is EndedBy.OPEN else WaitKind.WAIT
        if duration < threshold:
            waits.append(Wait(gpus, a, b, ended, quiet, writer, out_of_line))
            continue
        if writer is not None and limit is None:
            waits.append(Wait(gpus, a, b, ended, WaitKind.CHECKPOINT, writer, out_of_line))
            continue
        waits.append(Wait(gpus, a, b, ended, WaitKind.SUSPECTED_DEADLOCK, writer, out_of_line))
        cadence = cadence_of(learned(gpus, a))
        candidates.append(
            DeadlockFinding(
                gpus=gpus,
                onset_s=a,
                detected_s=a + threshold,
                ended_s=None if ended is EndedBy.OPEN else b,
                departed_from_cadence_s=None if limit is None else a + limit,
                cadence=cadence,
                evidence=_evidence(gpus, a, b, ended, n, cadence, writer, deadlock_after_s),
            )
        )
    findings = _merge_open(candidates, entry_window_s)
    cadences = [(gpus, c) for gpus, w in sorted(survived.items()) if (c := cadence_of(w)) is not None]
    return RuleResult(findings, waits, cadences)


def _evidence(
    gpus: tuple[int, ...],
    start_s: float,
    end_s: float,
    ended: EndedBy,
    n_gpus: int,
    cadence: Cadence | None,
    writer: int | None,
    deadlock_after_s: float,
) -> tuple[str, ...]:
    how = (
        "until the end of the recording"
        if ended is EndedBy.OPEN
        else f"until {end_s:.1f} s, when they left the band without computing"
    )
    lines = [
        f"{_fmt_gpus(gpus)} in checkpoint_or_deadlock (spinning: high utilisation at low power) with no "
        f"compute burst for {end_s - start_s:.0f} s, from {start_s:.1f} s {how}"
    ]
    if cadence is None:
        lines.append(
            "no earlier wait of these GPUs ended in progress: no save cadence to compare with, so the "
            f"fixed rule applies (>= {deadlock_after_s:g} s)"
        )
    else:
        every = f", one every {cadence.every_s:.0f} s" if cadence.every_s is not None else ""
        lines.append(
            f"{cadence.waits} earlier wait(s) of these GPUs ended in progress (median "
            f"{cadence.median_s:.1f} s, longest {cadence.longest_s:.1f} s{every}); this one departed from "
            f"that cadence at {start_s + cadence.limit_s:.1f} s ({CADENCE_FACTOR:g}x the longest)"
        )
    if writer is not None:
        lines.append(
            f"GPU {writer} looks like a checkpoint writer (it worked, then sat at low utilisation), "
            "but the wait is far longer than any save this job came back from"
        )
    elif len(gpus) < n_gpus:
        lines.append("no GPU outside the group looks like a checkpoint writer")
    else:
        lines.append("every GPU of the recording waits: a save written from another node would look the same")
    lines.append(
        "power alone cannot tell a hang from a save or a stall this long: confirm with the job's logs, "
        "stack dumps (py-spy) or the live watchdog"
    )
    return tuple(lines)


def _merge_open(findings: list[DeadlockFinding], window_s: float) -> list[DeadlockFinding]:
    """Open findings that began within ``window_s`` of each other are one deadlock."""
    closed = [f for f in findings if f.ended_s is not None]
    open_ = sorted((f for f in findings if f.ended_s is None), key=lambda f: f.onset_s)
    merged: list[DeadlockFinding] = []
    for f in open_:
        last = merged[-1] if merged else None
        if last is not None and f.onset_s - last.onset_s <= window_s:
            cadence = last.cadence if last.cadence is not None else f.cadence
            departs = [x for x in (last.departed_from_cadence_s, f.departed_from_cadence_s) if x is not None]
            evidence = last.evidence + tuple(e for e in f.evidence if e not in last.evidence)
            merged[-1] = DeadlockFinding(
                gpus=tuple(sorted(set(last.gpus) | set(f.gpus))),
                onset_s=max(last.onset_s, f.onset_s),
                detected_s=max(last.detected_s, f.detected_s),
                ended_s=None,
                departed_from_cadence_s=min(departs) if departs else None,
                cadence=cadence,
                evidence=evidence,
            )
        else:
            merged.append(f)
    out = closed + merged
    out.sort(key=lambda f: (f.onset_s, f.gpus))
    return out


def find_deadlocks(
    band_intervals: Sequence[Sequence[tuple[float, float]]],
    end_s: float,
    deadlock_after_s: float,
    segments: Sequence[Sequence[Segment]] | None = None,
    bursts: Sequence[Bursts] | None = None,
    entry_window_s: float = ENTRY_WINDOW_S,
) -> list[DeadlockFinding]:
    """The findings of :func:`analyse` (segments default to the band intervals alone)."""
    if segments is None:
        segments = [[(a, b, "checkpoint_or_deadlock") for a, b in spans] for spans in band_intervals]
    return analyse(band_intervals, end_s, deadlock_after_s, segments, bursts, entry_window_s).findings
