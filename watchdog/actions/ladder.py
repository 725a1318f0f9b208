"""The ladder, pure: which rungs an episode has ahead of it and when each is due.

No I/O and no clock: the state and ``now`` are passed in. :func:`episode_steps` returns the pending
rungs of an episode (:class:`Capture`, :class:`AlertStep`, :class:`Sigterm`), each with the time it
counts from and its delay;
:func:`sigkill_step` the SIGKILL rung after a SIGTERM; :func:`due` keeps those whose time has come. The
engine then runs each due step, and the step's own checks (armed, the kill budget, the
deterministic-hang breaker, evidence still being captured, silences) decide what is recorded.

Delays (``[actions]``) count from when the engine first saw the verdict; the SIGTERM delay from when
it first saw ``deadlock_confirmed``; SIGKILL from when SIGTERM was sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_triage.actions.config import ActionsConfig
from gpu_triage.actions.episode import Episode
from gpu_triage.alerts.model import Condition, rfc3339
from gpu_triage.model.health import Blame
from gpu_triage.model.snapshot import JobStatus
from gpu_triage.model.states import Mode, Verdict

#: The conditions whose episodes capture evidence.
CAPTURE_CONDITIONS = frozenset({Condition.DEADLOCK, Condition.STALLED})


@dataclass(frozen=True, slots=True)
class _Rung:
    since: float
    """When the delay started counting (the same clock as ``now``)."""
    delay_s: float

    @property
    def due_at(self) -> float:
        return self.since + self.delay_s

    def is_due(self, now: float) -> bool:
        return now - self.since >= self.delay_s


@dataclass(frozen=True, slots=True)
class Capture(_Rung):
    """Capture an evidence bundle (every mode, once per episode)."""


@dataclass(frozen=True, slots=True)
class AlertStep(_Rung):
    """Page (modes alert and kill): the first alert of the episode, or its escalation to
    ``deadlock_confirmed`` (``escalation``)."""

    escalation: bool = False


@dataclass(frozen=True, slots=True)
class Sigterm(_Rung):
    """Stop the job: SIGTERM, the kill hook or scancel (the step checks it is armed and allowed)."""


@dataclass(frozen=True, slots=True)
class Sigkill(_Rung):
    """SIGKILL what the SIGTERM rung left alive."""


Step = Capture | AlertStep | Sigterm | Sigkill


def episode_steps(ep: Episode, job: JobStatus, mode: Mode, config: ActionsConfig) -> tuple[Step, ...]:
    """The rungs still ahead of ``ep`` given the job's status this cycle, in ladder order."""
    steps: list[Step] = []
    if ep.condition in CAPTURE_CONDITIONS and ep.capture_state is None:
        steps.append(Capture(ep.first_seen, config.capture_after_s))
    if mode in (Mode.ALERT, Mode.KILL):
        escalation = (
            ep.alert_key is not None
            and ep.alerted_verdict != str(job.verdict)
            and job.verdict == Verdict.DEADLOCK_CONFIRMED
        )
        if ep.alert_key is None or escalation:
            steps.append(AlertStep(ep.first_seen, config.alert_after_s, escalation))
    if (
        ep.condition is Condition.DEADLOCK
        and not ep.kill_started
        and ep.confirmed_seen is not None
        and job.verdict == Verdict.DEADLOCK_CONFIRMED
        and job.kill_worthy
    ):
        steps.append(Sigterm(ep.confirmed_seen, config.sigterm_after_s))
    return tuple(steps)


def sigkill_step(term_time: float | None, config: ActionsConfig) -> Sigkill | None:
    """The SIGKILL rung of a kill whose SIGTERM rung went out at ``term_time`` (None: not yet)."""
    return None if term_time is None else Sigkill(term_time, config.sigkill_grace_s)


def due(steps: Iterable[Step], now: float) -> list[Step]:
    """The steps whose time has come, in order."""
    return [s for s in steps if s.is_due(now)]


def next_step_text(ep: Episode, mode: Mode, config: ActionsConfig) -> str:
    """What the watchdog will do next about ``ep``, for the alert's ``actions.next``."""
    if ep.condition is not Condition.DEADLOCK:
        return "alert only: this verdict never kills"
    if ep.repeat:
        return (
            f"deterministic hang (signature {ep.signature} seen {ep.sightings} times): the watchdog will "
            "NOT kill it; do not restart before the cause is fixed"
        )
    if mode is not Mode.KILL:
        return f"no kill: mode {mode} (arm kill mode to let the watchdog stop the job)"
    how = "run the kill hook" if config.kill_hook else "SIGTERM the job's processes"
    if not config.kill_hook and config.kill_via == "slurm":
        how = "scancel the job through Slurm"
    requeue = config.requeue and config.kill_via != "signal" and ep.last.blame is Blame.NODE
    if not config.kill_hook and requeue:
        how = "requeue the job through Slurm (scontrol requeue; cancel it where Slurm may not requeue it)"
    if config.dry_run:
        how += " (dry run: record only)"
    if ep.confirmed_seen is not None:
        return f"{how} at {rfc3339(ep.confirmed_seen + config.sigterm_after_s)} unless it recovers"
    return f"{how} {config.sigterm_after_s:g} s after the deadlock is confirmed"


__all__ = [
    "CAPTURE_CONDITIONS",
    "AlertStep",
    "Capture",
    "Sigkill",
    "Sigterm",
    "Step",
    "due",
    "episode_steps",
    "next_step_text",
    "sigkill_step",
]
