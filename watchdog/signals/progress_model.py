"""The pure side of the progress contract, as the daemon reads it (no files, time passed in):

- :func:`parse_record` - validate one file's bytes into a :class:`ProgressRecord` (or raise
  :class:`ProgressFormatError` naming the field);
- :func:`lease_state` - ``none`` / ``live`` / ``expired`` at ``now``;
- :func:`stale_reason` - why a record is stale (``pid_gone``, ``silent``) or None;
- :class:`StepTracker` - when each rank's step last changed ("steps frozen since");
- :class:`RankProgress` and :class:`JobProgress` - what the reader hands the detector per rank and job.

The reader that finds and reads the files is :mod:`gpu_triage.signals.progress`."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpu_triage.contract import FIELDS, LEASE_SCOPES, MAX_FILE_BYTES, PHASES, STALE_AFTER_S
from gpu_triage.model.names import job_name_problem, printable
from gpu_triage.model.samples import quick_init

MAX_DEPTH = 4
"""Nesting of JSON arrays/objects a progress file may have (the contract's record is flat: depth 1)."""
MAX_RANK = 1_000_000
"""Largest rank (and world size) accepted; ``rank-<n>.json`` names with more digits are refused."""


class ProgressFormatError(ValueError):
    """A progress file that does not follow the contract."""


class LeaseState(StrEnum):
    NONE = "none"
    """No lease (the train phase)."""
    LIVE = "live"
    EXPIRED = "expired"


class StaleReason(StrEnum):
    PID_GONE = "pid_gone"
    SILENT = "silent"
    """Not written for ``stale_after_s`` and no live lease."""


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    """One rank's progress file, validated. Times are epoch seconds."""

    job: str
    rank: int
    local_rank: int
    world_size: int
    pid: int
    host: str
    step: int
    epoch: int
    tokens: int
    phase: str
    lease_until: float | None
    time: float
    lease_scope: str | None = None
    """Optional ``lease_scope``: ``"job"`` when the trainer announces every collective phase on every
    rank (waiting ranks included), ``"rank"`` or absent when only the ranks doing the work do."""
    step_time: float | None = None
    """Optional: when ``step`` last changed (never later than ``time``); None: not written."""
    phase_time: float | None = None
    """Optional: when ``phase`` was entered (never later than ``time``); None: not written."""

    def step_since(self) -> float:
        """When this record's step began: ``step_time``, else (an older writer) the write ``time``."""
        return self.time if self.step_time is None else self.step_time

    def phase_since(self) -> float:
        return self.time if self.phase_time is None else self.phase_time


# ------------------------------------------------------------------------------------------ pure


_INT_MAX = 2**63 - 1


def _int(data: Mapping[str, Any], name: str, low: int = 0, high: int = _INT_MAX) -> int:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        bound = f">= {low}" if high == _INT_MAX else f"between {low} and {high}"
        raise ProgressFormatError(f"{name}: expected an integer {bound}, got {_short(value)}")
    return value


def _short(value: Any) -> str:
    return printable(repr(value), 80)


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def _nesting_depth(data: bytes) -> int:
    """Deepest bracket nesting of JSON text (strings skipped); cheap, and never recursive."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return 0
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub(b'""', data)):
        if m.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise ProgressFormatError(f"not JSON: {name} is not a JSON number")


def _time(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProgressFormatError(f"{name}: expected epoch seconds, got {_short(value)}")
    return float(value)


def parse_record(data: bytes | str) -> ProgressRecord:
    """Validate one progress file's content. Raises :class:`ProgressFormatError` - and nothing else,
    whatever the bytes (bounded: at most :data:`MAX_FILE_BYTES`, nesting at most :data:`MAX_DEPTH`,
    no NaN/Infinity)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > MAX_FILE_BYTES:
        raise ProgressFormatError(f"{len(raw)} bytes, more than {MAX_FILE_BYTES}")
    depth = _nesting_depth(raw)
    if depth > MAX_DEPTH:
        raise ProgressFormatError(f"nested {depth} levels deep, more than {MAX_DEPTH}")
    try:
        obj = json.loads(raw, parse_constant=_no_constant)
    except ProgressFormatError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ProgressFormatError(f"not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProgressFormatError("expected a JSON object")
    missing = [f for f in FIELDS if f not in obj]
    if missing:
        raise ProgressFormatError(f"missing field(s): {', '.join(missing)}")
    job, host, phase = obj["job"], obj["host"], obj["phase"]
    if not isinstance(job, str) or not job:
        raise ProgressFormatError(f"job: expected a non-empty string, got {_short(job)}")
    problem = job_name_problem(job)
    if problem is not None:
        raise ProgressFormatError(f"job: {problem}, got {_short(job)}")
    if not isinstance(host, str) or len(host) > 255:
        raise ProgressFormatError(f"host: expected a string of at most 255 characters, got {_short(host)}")
    if not isinstance(phase, str) or phase not in PHASES:
        raise ProgressFormatError(f"phase: expected one of {', '.join(PHASES)}, got {_short(phase)}")
    rank, world_size = _int(obj, "rank", 0, MAX_RANK), _int(obj, "world_size", 1, MAX_RANK + 1)
    if rank >= world_size:
        raise ProgressFormatError(f"rank: expected below world_size {world_size}, got {rank}")
    lease = obj["lease_until"]
    lease_until = None if lease is None else _time(lease, "lease_until")
    scope = obj.get("lease_scope")
    if scope is not None and (not isinstance(scope, str) or scope not in LEASE_SCOPES):
        raise ProgressFormatError(
            f"lease_scope: expected one of {', '.join(LEASE_SCOPES)}, got {_short(scope)}"
        )
    if phase != "train" and lease_until is None:
        raise ProgressFormatError(f"lease_until: the {phase} phase needs a lease, got null")
    written = _time(obj["time"], "time")
    since = {}
    for name in ("step_time", "phase_time"):
        value = obj.get(name)
        since[name] = None if value is None else min(_time(value, name), written)
    return ProgressRecord(
        job=job,
        rank=rank,
        local_rank=_int(obj, "local_rank", 0, MAX_RANK),
        world_size=world_size,
        pid=_int(obj, "pid", 1, 2**31 - 1),
        host=host,
        step=_int(obj, "step"),
        epoch=_int(obj, "epoch"),
        tokens=_int(obj, "tokens"),
        phase=phase,
        lease_until=lease_until,
        time=written,
        lease_scope=scope,
        step_time=since["step_time"],
        phase_time=since["phase_time"],
    )


def lease_state(record: ProgressRecord, now_s: float) -> LeaseState:
    if record.lease_until is None:
        return LeaseState.NONE
    return LeaseState.LIVE if now_s <= record.lease_until else LeaseState.EXPIRED


def stale_reason(
    record: ProgressRecord,
    now_s: float,
    *,
    pid_alive: bool | None,
    stale_after_s: float = STALE_AFTER_S,
) -> StaleReason | None:
    """Why ``record`` is stale, or None. ``pid_alive`` None: unknown (another host's file)."""
    if pid_alive is False:
        return StaleReason.PID_GONE
    if now_s - record.time > stale_after_s and lease_state(record, now_s) is not LeaseState.LIVE:
        return StaleReason.SILENT
    return None


@dataclass(frozen=True, slots=True)
class StepMark:
    step: int
    since_s: float
    """When the rank reported this step (the writer's ``time`` of the first record showing it)."""
    phase: str = "train"
    phase_since_s: float = 0.0
    """When the rank entered ``phase`` (the ``time`` of the first record showing it)."""
    previous_phase: str | None = None
    """The phase before, when the change was seen; None when the rank was first seen in ``phase``."""


class StepTracker:
    """Remembers, per (job, rank), the step and the phase, and when each was first reported.

    The first sight of a rank uses the record's ``step_time``/``phase_time`` (when the writer says the
    step changed and the phase began) or, from an older writer, its ``time``: a file that has not
    changed since is a step not advanced since then. ``time`` alone is right only while nothing
    rewrites the file during a hang - a flusher's heartbeat does - so a daemon restarted mid-hang
    also restores what it saw before (:meth:`export` / :meth:`restore`, mirrored into the event store
    by the daemon): a rank still at the restored step with the same pid keeps the restored times. A
    step going backwards (a restart from a checkpoint) counts as a change. The phase change time is
    what lets the detector measure frozen time from a rank's *return* to ``train``, so time spent
    under a lease never counts as frozen.
    """

    def __init__(self) -> None:
        self._marks: dict[tuple[str, int], StepMark] = {}
        self._pids: dict[tuple[str, int], int] = {}
        self._restored: dict[tuple[str, int], tuple[int, StepMark]] = {}
        self.version = 0
        """Bumped whenever a mark changes (the daemon persists the marks when it moved)."""

    def observe(self, record: ProgressRecord) -> StepMark:
        key = (record.job, record.rank)
        mark = self._marks.get(key)
        if mark is None:
            restored = self._restored.pop(key, None)
            if restored is not None and restored[0] == record.pid:
                mark = restored[1]
        before = mark
        if mark is None:
            mark = StepMark(record.step, record.step_since(), record.phase, record.phase_since(), None)
        else:
            if mark.step != record.step:
                mark = replace(mark, step=record.step, since_s=record.step_since())
            if mark.phase != record.phase:
                mark = replace(
                    mark, phase=record.phase, phase_since_s=record.phase_since(), previous_phase=mark.phase
                )
        if (mark is not before and mark != before) or self._pids.get(key) != record.pid:
            self.version += 1
        self._marks[key] = mark
        self._pids[key] = record.pid
        return mark

    def get(self, job: str, rank: int) -> StepMark | None:
        return self._marks.get((job, rank))

    def forget(self, keep: Iterable[tuple[str, int]]) -> None:
        """Drop every (job, rank) not in ``keep`` (files that disappeared)."""
        keep = set(keep)
        for key in [k for k in self._marks if k not in keep]:
            del self._marks[key]
            self._pids.pop(key, None)
            self.version += 1

    def export(self, limit: int = 4096) -> list[dict[str, Any]]:
        """The marks as JSON values (at most ``limit``), for a restarted daemon's :meth:`restore`."""
        out = []
        for (job, rank), m in sorted(self._marks.items())[:limit]:
            out.append(
                {
                    "job": job,
                    "rank": rank,
                    "pid": self._pids.get((job, rank)),
                    "step": m.step,
                    "since_s": m.since_s,
                    "phase": m.phase,
                    "phase_since_s": m.phase_since_s,
                    "previous_phase": m.previous_phase,
                }
            )
        return out

    def restore(self, entries: Any) -> int:
        """Take marks a previous daemon saw; each applies once, to a rank of the same pid. Malformed
        entries are skipped (the store is the daemon's own, but a corrupt value must not stop it)."""
        count = 0
        for e in entries if isinstance(entries, list) else ():
            try:
                key = (str(e["job"]), int(e["rank"]))
                mark = StepMark(
                    int(e["step"]),
                    _time(e["since_s"], "since_s"),
                    str(e["phase"]),
                    _time(e["phase_since_s"], "phase_since_s"),
                    None if e.get("previous_phase") is None else str(e["previous_phase"]),
                )
                self._restored[key] = (int(e["pid"]), mark)
                count += 1
            except (KeyError, TypeError, ValueError):
                continue
        return count


# ------------------------------------------------------------------------------------------- view


@quick_init  # built once a rank (or a GPU) every process period
@dataclass(frozen=True, slots=True)
class RankProgress:
    record: ProgressRecord
    path: Path
    step_since_s: float
    """When ``record.step`` was first reported: steps frozen since then if they no longer advance."""
    lease: LeaseState
    stale: StaleReason | None
    phase_since_s: float | None = None
    """When the rank entered its current phase (record time)."""
    previous_phase: str | None = None
    owner_uid: int | None = None
    """The file's owner: a process named by the file must belong to the same user (or the file to root)."""

    @property
    def rank(self) -> int:
        return self.record.rank

    @property
    def step(self) -> int:
        return self.record.step

    @property
    def phase(self) -> str:
        return self.record.phase

    @property
    def lease_until(self) -> float | None:
        return self.record.lease_until

    def step_frozen_s(self, now_s: float) -> float:
        """Seconds since the step last advanced."""
        return max(0.0, now_s - self.step_since_s)


@dataclass(frozen=True, slots=True)
class JobProgress:
    job: str
    ranks: Mapping[int, RankProgress]
    """Live ranks (stale ones excluded), by rank."""
    stale: Mapping[int, RankProgress] = field(default_factory=dict)
    """Stale ranks, with :attr:`RankProgress.stale` saying why; ignored by default."""

    @property
    def world_size(self) -> int | None:
        sizes = {r.record.world_size for r in self.ranks.values()}
        return sizes.pop() if len(sizes) == 1 else None

    @property
    def lease_scope(self) -> str | None:
        """``job`` only when every live rank's file says so."""
        scopes = {r.record.lease_scope for r in self.ranks.values()}
        return "job" if scopes == {"job"} else ("rank" if scopes else None)

    @property
    def phases(self) -> dict[str, list[int]]:
        """Phase -> ranks in it (live ranks). More than one key is phase disagreement."""
        out: dict[str, list[int]] = {}
        for rank, r in sorted(self.ranks.items()):
            out.setdefault(r.phase, []).append(rank)
        return out

    def steps_frozen_since_s(self) -> float | None:
        """The latest step change over the live ranks: every rank's step has been frozen since then."""
        return max((r.step_since_s for r in self.ranks.values()), default=None)

    def pids(self) -> dict[int, int]:
        """Rank -> pid of the live ranks (for the process inspector)."""
        return {rank: r.record.pid for rank, r in self.ranks.items()}
