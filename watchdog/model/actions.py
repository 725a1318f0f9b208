"""The action engine's vocabulary: what it does (:class:`Action`), how that went (:class:`Result`) and
the stages of a capture and of a kill.

Shared by the engine (:mod:`gpu_triage.actions`) and the log lines (:mod:`gpu_triage.journal.logs`).
Their string values are what the event store, the kv mirror, the logs, the metrics and ``/status``
carry: never rename one.
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """The ``action`` of an engine record."""

    CAPTURE = "capture"
    ALERT = "alert"
    ALERT_RESEND = "alert_resend"
    ALERT_SINK = "alert_sink"
    RESOLVE = "resolve"
    SIGTERM = "sigterm"
    SIGKILL = "sigkill"
    KILL_HOOK = "kill_hook"
    LADDER = "ladder"
    ENGINE = "engine"
    DRAIN = "drain"
    """Drain this node in Slurm (a hardware fault; ``actions.drain``)."""
    REQUEUE = "requeue"
    """Requeue a node-blamed hung Slurm job instead of cancelling it (``actions.requeue``)."""


class Result(StrEnum):
    """The ``result`` of an engine record."""

    STARTED = "started"
    OK = "ok"
    ERROR = "error"
    DRY_RUN = "dry_run"
    SKIPPED = "skipped"
    QUEUED = "queued"
    UPDATED = "updated"
    NO_SINKS = "no_sinks"
    ADOPTED = "adopted"
    SILENCED = "silenced"
    RESUMED = "resumed"
    ENDED = "ended"
    MISCONFIGURED = "misconfigured"
    NOT_ARMED = "not_armed"
    REFUSED = "refused"
    RATE_LIMITED = "rate_limited"
    WAITING_FOR_EVIDENCE = "waiting_for_evidence"
    NO_TARGETS = "no_targets"
    DISARMED = "disarmed"
    NOT_NEEDED = "not_needed"
    STILL_ALIVE = "still_alive"
    GONE = "gone"


#: Results that mean "the watchdog decided not to act" (a refusal log line).
REFUSAL_RESULTS: frozenset[Result] = frozenset(
    {
        Result.NOT_ARMED,
        Result.REFUSED,
        Result.RATE_LIMITED,
        Result.WAITING_FOR_EVIDENCE,
        Result.NO_TARGETS,
        Result.DISARMED,
    }
)
#: Actions that are a kill (SIGTERM, SIGKILL, the kill hook).
KILL_ACTIONS: frozenset[Action] = frozenset({Action.SIGTERM, Action.SIGKILL, Action.KILL_HOOK})


class CaptureState(StrEnum):
    """An episode's evidence capture (persisted in ``actions.episodes``)."""

    RUNNING = "running"
    DONE = "done"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"
    """It was running when the previous daemon stopped."""


class KillStage(StrEnum):
    """Where a job's kill stands."""

    TERM_RUNNING = "term_running"
    TERM_SENT = "term_sent"
    KILL_RUNNING = "kill_running"
    DONE = "done"


__all__ = ["KILL_ACTIONS", "REFUSAL_RESULTS", "Action", "CaptureState", "KillStage", "Result"]
