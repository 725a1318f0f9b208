"""How long a job's steps take, learned from its own history (pure; time passed in).

"Steps frozen" only means something against what this job normally does: a 32B model's 60 s step is
not a hang, and neither is the first step after a start (model load, ``torch.compile``, NCCL
communicator set-up, a resume) or after a save. :class:`StepTiming` keeps three things per job:

- the **steady step interval**: time between two step advances within one stretch of ``train``.
  It adapts *quickly upward* (a longer interval replaces the estimate at once: a straggler on another
  node doubles every step, and the second slow step must not look frozen) and *slowly downward*
  (each shorter interval moves the estimate by ``decay`` of the difference: one fast step after a
  slow spell does not make the next normal step look frozen);
- the **first-step durations after a start** (``init`` -> ``train``, or a step-0 record): from the
  moment the rank entered ``train`` to its first advance;
- the **first-step durations after a lease** (``checkpoint``/``eval``/``epoch_end`` -> ``train``).

Advances are timed by the progress records' own ``time`` (the writer's clock), not by when the
daemon noticed them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum


class FirstStep(StrEnum):
    AFTER_START = "after_start"
    AFTER_LEASE = "after_lease"


@dataclass(frozen=True, slots=True)
class TimingConfig:
    """Derived from ``[detector]`` (``DetectorConfig.timing()``), which holds the defaults."""

    default_interval_s: float
    """Assumed until the job's own interval is learned (one advance within a train stretch)."""
    first_step_default_s: float
    """Budget of the first step after a start while no first step of this job has been seen."""
    k_first: float
    """A first step may take this many times the longest first step seen (of the same kind)."""
    decay: float
    """Downward adaptation per observed shorter interval (0..1)."""
    post_lease_intervals: float = 2.5
    """A first step after a lease, before any was seen, may take this many steady intervals (fixed)."""


@dataclass
class StepTiming:
    config: TimingConfig
    estimate_s: float | None = None
    intervals_seen: int = 0
    first_steps: dict[FirstStep, deque[float]] = field(
        default_factory=lambda: {k: deque(maxlen=8) for k in FirstStep}
    )

    def observe_interval(self, interval_s: float) -> None:
        """A step advance ``interval_s`` after the previous one, within one train stretch."""
        if interval_s <= 0:
            return
        self.intervals_seen += 1
        if self.estimate_s is None or interval_s > self.estimate_s:
            self.estimate_s = interval_s
        else:
            self.estimate_s += self.config.decay * (interval_s - self.estimate_s)

    def observe_first_step(self, kind: FirstStep, duration_s: float) -> None:
        if duration_s > 0:
            self.first_steps[kind].append(duration_s)

    def interval_s(self) -> float:
        """The steady interval: learned, else the configured default."""
        return self.estimate_s if self.estimate_s is not None else self.config.default_interval_s

    def learned(self) -> bool:
        return self.estimate_s is not None

    def first_step_budget_s(self, kind: FirstStep) -> float:
        """How long a first step of ``kind`` may take before it counts as frozen (before the caller's
        own multiplier for steady steps is applied, this already includes a margin)."""
        seen = self.first_steps[kind]
        cfg = self.config
        steady = self.interval_s()
        if seen:
            return max(cfg.k_first * max(seen), cfg.post_lease_intervals * steady)
        if kind is FirstStep.AFTER_START:
            return max(cfg.first_step_default_s, cfg.post_lease_intervals * steady)
        return cfg.post_lease_intervals * steady

    def to_dict(self) -> dict[str, object]:
        return {
            "step_interval_s": round(self.interval_s(), 3),
            "interval_learned": self.learned(),
            "first_steps_s": {str(k): [round(x, 3) for x in v] for k, v in self.first_steps.items() if v},
        }


__all__ = ["FirstStep", "StepTiming", "TimingConfig"]
