"""The daemon's time axis: durations on the monotonic clock, wall time only to place records and show.

Every interval the daemon measures - a confirmation window, a lease's remaining time, frozen steps, the
action ladder's delays, the kill budget's hour, a silence, ``/healthz``'s age - is a difference of two
points on one :class:`Timeline`: the kernel's monotonic clock plus a constant *anchor* chosen so that
the points read like epoch seconds (the wall clock at the first daemon start of this boot). A step of
the wall clock (NTP after a VM pause, an operator's ``date -s``) therefore moves no duration: it only
changes :attr:`Timeline.offset_s`, the wall clock's distance from the timeline, which the daemon logs
(:meth:`Timeline.check_step`) and shows.

Times written by other processes (a progress record's ``time``, ``lease_until``, ``step_time``) are
wall-clock epoch seconds. They are placed on the timeline **once**, when read:
``now - (wall_now - record_time)`` (:meth:`Timeline.from_wall`, or the pure :func:`wall_to_timeline`),
so their age is right whatever the timeline's anchor, and a later clock step does not move them.

Pure apart from :class:`SystemClock`: the clock is passed in (a :class:`Clock` with ``wall()`` and
``monotonic()``), so tests step the wall clock while the monotonic one runs on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

STEP_TOLERANCE_S = 2.0
"""A change of the wall clock's offset from the timeline beyond this is a clock step (logged)."""


class Clock(Protocol):
    def wall(self) -> float:
        """Epoch seconds (may jump)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (CLOCK_MONOTONIC)."""
        ...


class SystemClock:
    """The real clocks: ``time.time`` and ``time.monotonic``."""

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass(frozen=True, slots=True)
class ClockStep:
    """The wall clock moved ``step_s`` against the monotonic one (positive: forward)."""

    step_s: float
    offset_s: float
    """The wall clock's distance from the timeline now."""
    wall_s: float
    timeline_s: float


def wall_to_timeline(record_s: float, *, now_s: float, wall_now_s: float) -> float:
    """A wall-clock time read now from a file, placed on the timeline: its age is kept."""
    return now_s - (wall_now_s - record_s)


class Timeline:
    """``now() = clock.monotonic() + anchor_s``. ``anchor_s`` None: the wall clock now (epoch-like)."""

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        anchor_s: float | None = None,
        step_tolerance_s: float = STEP_TOLERANCE_S,
    ) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        if anchor_s is None:
            anchor_s = self.clock.wall() - self.clock.monotonic()
        self.anchor_s = float(anchor_s)
        self.step_tolerance_s = step_tolerance_s
        self.last_offset_s = self.offset_s()
        """The offset at the last step seen (or at start): a step is a change of the offset from it."""
        self.steps = 0
        """Clock steps seen since start."""

    def now(self) -> float:
        return self.clock.monotonic() + self.anchor_s

    def wall(self) -> float:
        return self.clock.wall()

    def offset_s(self) -> float:
        """Wall clock minus timeline: 0 until the wall clock steps (or drifts) away from it."""
        return self.clock.wall() - self.now()

    def from_wall(
        self, record_s: float, *, now_s: float | None = None, wall_now_s: float | None = None
    ) -> float:
        """A wall-clock epoch time read now (from a file), on the timeline."""
        now = self.now() if now_s is None else now_s
        wall = self.clock.wall() if wall_now_s is None else wall_now_s
        return wall_to_timeline(record_s, now_s=now, wall_now_s=wall)

    def to_wall(self, t: float) -> float:
        """A timeline point as the wall clock reads it now (for display next to wall-clock logs)."""
        return t + self.offset_s()

    def check_step(self) -> ClockStep | None:
        """Whether the wall clock stepped since the last call (or since start). Nothing moves with it:
        the timeline stays where it was; only the offset is reported."""
        offset = self.offset_s()
        step = offset - self.last_offset_s
        if abs(step) <= self.step_tolerance_s:
            return None
        self.last_offset_s = offset
        self.steps += 1
        now = self.now()
        return ClockStep(step_s=step, offset_s=offset, wall_s=now + offset, timeline_s=now)


__all__ = ["Clock", "ClockStep", "SystemClock", "Timeline", "wall_to_timeline"]
