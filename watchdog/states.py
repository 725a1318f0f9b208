"""The vocabulary shared by the classifier, the detector, triage, REST and metrics."""

from __future__ import annotations

from enum import StrEnum


class GpuState(StrEnum):
    """What one GPU is doing, from its power band (and utilisation/memory as secondary evidence)."""

    IDLE = "idle"
    COMPUTE = "compute"
    COMMUNICATION = "communication"
    DATA_STARVATION = "data_starvation"
    CHECKPOINT_OR_DEADLOCK = "checkpoint_or_deadlock"
    UNKNOWN = "unknown"


#: Order used in tables, plots and metrics (one-hot ``gpu_watchdog_state``).
GPU_STATES: tuple[GpuState, ...] = tuple(GpuState)


class Verdict(StrEnum):
    """What the detector concludes about one job on this node."""

    HEALTHY = "healthy"
    CHECKPOINT = "checkpoint"
    DEADLOCK_SUSPECTED = "deadlock_suspected"
    DEADLOCK_CONFIRMED = "deadlock_confirmed"
    DATA_STARVATION = "data_starvation"
    STALLED_CHECKPOINT = "stalled_checkpoint"
    TELEMETRY_LOST = "telemetry_lost"


VERDICTS: tuple[Verdict, ...] = tuple(Verdict)
DEADLOCK_VERDICTS = frozenset({Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED})


class Mode(StrEnum):
    """How far the daemon may act: record only, add alerts, add signals (needs arming)."""

    OBSERVE = "observe"
    ALERT = "alert"
    KILL = "kill"
