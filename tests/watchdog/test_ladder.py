"""The pure ladder (gpu_triage.actions.ladder): which rungs an episode has ahead of it and when each is
due, from the episode's state, the job's status, the mode and ``[actions]`` - no I/O, time passed in."""

from __future__ import annotations

import pytest

from gpu_triage.actions.config import ActionsConfig
from gpu_triage.actions.episode import Episode
from gpu_triage.actions.ladder import (
    AlertStep,
    Capture,
    Sigkill,
    Sigterm,
    due,
    episode_steps,
    next_step_text,
    sigkill_step,
)
from gpu_triage.alerts.model import Condition
from gpu_triage.model.actions import CaptureState
from gpu_triage.model.snapshot import JobStatus
from gpu_triage.model.states import Mode, Verdict

CONFIG = ActionsConfig(
    capture_after_s=5.0, alert_after_s=30.0, sigterm_after_s=60.0, sigkill_grace_s=20.0, max_kills_per_hour=1
)
T0 = 1000.0


def job(verdict: Verdict, *, kill_worthy: bool = False) -> JobStatus:
    return JobStatus("train", (), verdict, onset=T0, raised=T0, kill_worthy=kill_worthy)


def episode(condition: Condition, verdict: Verdict, **state: object) -> Episode:
    ep = Episode("train", condition, T0, verdict, job(verdict))
    for name, value in state.items():
        setattr(ep, name, value)
    return ep


def test_suspected_deadlock_captures_then_alerts_and_never_terminates() -> None:
    ep = episode(Condition.DEADLOCK, Verdict.DEADLOCK_SUSPECTED)
    steps = episode_steps(ep, job(Verdict.DEADLOCK_SUSPECTED), Mode.KILL, CONFIG)
    assert steps == (Capture(T0, 5.0), AlertStep(T0, 30.0, escalation=False))
    assert [s.due_at for s in steps] == [T0 + 5.0, T0 + 30.0]
    assert due(steps, T0 + 4.9) == []
    assert due(steps, T0 + 5.0) == [Capture(T0, 5.0)]
    assert due(steps, T0 + 30.0) == list(steps)


def test_observe_mode_captures_but_does_not_alert() -> None:
    ep = episode(Condition.DEADLOCK, Verdict.DEADLOCK_SUSPECTED)
    assert episode_steps(ep, job(Verdict.DEADLOCK_SUSPECTED), Mode.OBSERVE, CONFIG) == (Capture(T0, 5.0),)


def test_one_capture_per_episode() -> None:
    for state in CaptureState:
        ep = episode(Condition.DEADLOCK, Verdict.DEADLOCK_SUSPECTED, capture_state=state)
        steps = episode_steps(ep, job(Verdict.DEADLOCK_SUSPECTED), Mode.OBSERVE, CONFIG)
        assert not any(isinstance(s, Capture) for s in steps), state


@pytest.mark.parametrize("condition", [Condition.SLOW, Condition.TELEMETRY_LOST])
def test_alert_only_conditions_neither_capture_nor_kill(condition: Condition) -> None:
    ep = episode(condition, Verdict.SLOW, confirmed_seen=T0)
    steps = episode_steps(ep, job(Verdict.DEADLOCK_CONFIRMED, kill_worthy=True), Mode.KILL, CONFIG)
    assert steps == (AlertStep(T0, 30.0),)


def test_stalled_captures_and_alerts() -> None:
    ep = episode(Condition.STALLED, Verdict.STALLED)
    steps = episode_steps(ep, job(Verdict.STALLED), Mode.ALERT, CONFIG)
    assert steps == (Capture(T0, 5.0), AlertStep(T0, 30.0))


def test_sigterm_counts_from_confirmation_and_needs_kill_worthy() -> None:
    confirmed = T0 + 100.0
    ep = episode(
        Condition.DEADLOCK,
        Verdict.DEADLOCK_CONFIRMED,
        confirmed_seen=confirmed,
        capture_state=CaptureState.DONE,
        alert_key="k",
        alerted_verdict=str(Verdict.DEADLOCK_CONFIRMED),
    )
    steps = episode_steps(ep, job(Verdict.DEADLOCK_CONFIRMED, kill_worthy=True), Mode.KILL, CONFIG)
    assert steps == (Sigterm(confirmed, 60.0),)
    assert due(steps, confirmed + 59.0) == []
    assert due(steps, confirmed + 60.0) == [Sigterm(confirmed, 60.0)]
    # no positive evidence of a hang: never a SIGTERM rung, whatever the delay
    assert episode_steps(ep, job(Verdict.DEADLOCK_CONFIRMED), Mode.KILL, CONFIG) == ()
    # the rung is offered in every mode: the kill step records "not_armed" itself
    assert episode_steps(ep, job(Verdict.DEADLOCK_CONFIRMED, kill_worthy=True), Mode.OBSERVE, CONFIG) == (
        Sigterm(confirmed, 60.0),
    )


def test_no_second_sigterm_and_none_before_confirmation() -> None:
    started = episode(Condition.DEADLOCK, Verdict.DEADLOCK_CONFIRMED, confirmed_seen=T0, kill_started=True)
    worthy = job(Verdict.DEADLOCK_CONFIRMED, kill_worthy=True)
    assert not any(isinstance(s, Sigterm) for s in episode_steps(started, worthy, Mode.KILL, CONFIG))
    unconfirmed = episode(Condition.DEADLOCK, Verdict.DEADLOCK_CONFIRMED)
    assert not any(isinstance(s, Sigterm) for s in episode_steps(unconfirmed, worthy, Mode.KILL, CONFIG))


def test_an_alerted_episode_alerts_again_only_to_escalate_to_confirmed() -> None:
    ep = episode(
        Condition.DEADLOCK,
        Verdict.DEADLOCK_SUSPECTED,
        alert_key="k",
        alerted_verdict=str(Verdict.DEADLOCK_SUSPECTED),
        capture_state=CaptureState.DONE,
    )
    assert episode_steps(ep, job(Verdict.DEADLOCK_SUSPECTED), Mode.ALERT, CONFIG) == ()
    assert episode_steps(ep, job(Verdict.DEADLOCK_CONFIRMED), Mode.ALERT, CONFIG) == (
        AlertStep(T0, 30.0, escalation=True),
    )


def test_sigkill_follows_sigterm_after_the_grace() -> None:
    assert sigkill_step(None, CONFIG) is None
    step = sigkill_step(T0, CONFIG)
    assert step == Sigkill(T0, 20.0)
    assert step is not None and not step.is_due(T0 + 19.99) and step.is_due(T0 + 20.0)


def test_due_compares_elapsed_time_like_the_engine_always_did() -> None:
    # 1030.1 - 1000.1 < 30 in binary floating point, although 1000.1 + 30 == 1030.1
    step = Sigkill(1000.1, 30.0)
    assert not step.is_due(1030.1)


def test_next_step_text() -> None:
    deadlock = episode(Condition.DEADLOCK, Verdict.DEADLOCK_SUSPECTED)
    assert next_step_text(episode(Condition.SLOW, Verdict.SLOW), Mode.KILL, CONFIG).startswith("alert only")
    assert next_step_text(deadlock, Mode.ALERT, CONFIG).startswith("no kill: mode alert")
    assert next_step_text(deadlock, Mode.KILL, CONFIG) == (
        "SIGTERM the job's processes 60 s after the deadlock is confirmed"
    )
    repeat = episode(Condition.DEADLOCK, Verdict.DEADLOCK_CONFIRMED, repeat=True, signature="s", sightings=2)
    assert "will NOT kill" in next_step_text(repeat, Mode.KILL, CONFIG)
    hook = ActionsConfig(kill_hook=("scancel", "{slurm_job_id}"), dry_run=True)
    assert next_step_text(deadlock, Mode.KILL, hook).startswith("run the kill hook (dry run: record only)")
