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
    """What the detector concludes about one job on this node.

    Two classes (docs/detector.md): only the *hung* verdicts, ``deadlock_suspected`` and
    ``deadlock_confirmed``, rest on positive evidence of a hang from independent signals and may lead
    to a kill. Every other verdict says that progress is missing or slow (or that the watchdog cannot
    see); it is worth an alert at most, never a signal.
    """

    HEALTHY = "healthy"
    CHECKPOINT = "checkpoint"
    """A save is under way (announced by a lease, or seen as writes while the GPUs wait)."""
    DEADLOCK_SUSPECTED = "deadlock_suspected"
    DEADLOCK_CONFIRMED = "deadlock_confirmed"
    DATA_STARVATION = "data_starvation"
    STALLED_CHECKPOINT = "stalled_checkpoint"
    STALLED = "stalled"
    """No progress for longer than the job's own budget, without positive proof of a hang."""
    SLOW = "slow"
    """Past its budget, but the GPUs are working (an unannounced eval, a recompile, an overrun lease)."""
    SUSPENDED = "suspended"
    """A rank is stopped (SIGSTOP, a scheduler's suspend): nothing can advance until it resumes."""
    TELEMETRY_LOST = "telemetry_lost"
    CANNOT_JUDGE = "cannot_judge"
    """The watchdog has nothing here that could show progress or a hang for this job (no progress
    files, no GPU mapped or readable, no stacks), or only idle GPUs held by live ranks: it says so,
    with what it cannot judge and why in ``cause``, instead of ``healthy``. Alert at most."""
    DONE = "done"
    """Every rank announced the end of training (phase ``done``) and has exited or is exiting."""
    GONE = "gone"
    """Every rank of the job on this node has exited without announcing ``done`` (a crash, a cancel)."""
    KILLED = "killed"
    """The daemon's kill ladder signalled these ranks: the job is ending because the daemon ended it."""


VERDICTS: tuple[Verdict, ...] = tuple(Verdict)
DEADLOCK_VERDICTS = frozenset({Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED})
#: The only verdicts that can lead to a signal (the rest alert at most).
KILL_WORTHY_VERDICTS = DEADLOCK_VERDICTS
#: The job has ended (or is ending) on this node: never an alert, never a signal. The job leaves the
#: snapshot when the process inspector forgets its exited ranks (a minute).
ENDED_VERDICTS = frozenset({Verdict.DONE, Verdict.GONE, Verdict.KILLED})


class Mode(StrEnum):
    """How far the daemon may act: record only, add alerts, add signals (needs arming)."""

    OBSERVE = "observe"
    ALERT = "alert"
    KILL = "kill"
