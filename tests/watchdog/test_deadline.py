"""The deadline executor: calls come back on time or fail as data; a wedged key never wedges the caller.

Blocking calls wait on a threading.Event that every test releases at teardown, so no thread outlives
its test. Backoff runs on a hand-advanced clock: no test sleeps through one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from gpu_triage.telemetry.deadline import DeadlineExceeded, DeadlineExecutor, Wedged

DEADLINE_S = 0.1
SLACK_S = 0.15
"""Scheduling slack on a loaded 2-core machine; the point is 'bounded', not 'exact'."""


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ex(clock: ManualClock) -> Iterator[DeadlineExecutor]:
    executor = DeadlineExecutor(DEADLINE_S, backoff_s=5.0, max_backoff_s=40.0, clock=clock, name="test")
    yield executor
    executor.close()


def timed(fn, *args, **kwargs):
    start = time.monotonic()
    try:
        return fn(*args, **kwargs), time.monotonic() - start
    except Exception as exc:
        return exc, time.monotonic() - start


def test_call_returns_value_and_propagates_the_calls_own_exception(ex: DeadlineExecutor) -> None:
    assert ex.call(0, lambda a, b: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        ex.call(0, lambda: 1 / 0)
    # An exception that came back in time is not a deadline problem.
    assert not ex.health(0).wedged


def test_blocked_call_raises_deadline_exceeded_within_the_deadline(
    ex: DeadlineExecutor, gate: threading.Event
) -> None:
    error, elapsed = timed(ex.call, 7, gate.wait)
    assert isinstance(error, DeadlineExceeded) and not isinstance(error, Wedged)
    assert error.key == 7
    assert DEADLINE_S * 0.9 <= elapsed < DEADLINE_S + SLACK_S
    health = ex.health(7)
    assert health.wedged and health.consecutive_overruns == 1 and health.abandoned_alive == 1


def test_wedged_key_fails_fast_during_backoff_and_other_keys_are_unaffected(
    ex: DeadlineExecutor, gate: threading.Event
) -> None:
    with pytest.raises(DeadlineExceeded):
        ex.call("gpu3", gate.wait)
    error, elapsed = timed(ex.call, "gpu3", lambda: "never run")
    assert isinstance(error, Wedged)
    assert "retrying in" in str(error)
    assert elapsed < 0.05
    assert ex.call("gpu4", lambda: "fine") == "fine"


def test_after_backoff_a_fresh_worker_serves_the_key(
    ex: DeadlineExecutor, clock: ManualClock, gate: threading.Event
) -> None:
    with pytest.raises(DeadlineExceeded):
        ex.call(1, gate.wait)
    clock.now += 5.0
    assert ex.call(1, lambda: 42) == 42
    assert not ex.health(1).wedged
    # The abandoned thread is still stuck until its call returns; then it exits by itself.
    assert ex.abandoned_alive() == 1
    gate.set()
    deadline = time.monotonic() + 2.0
    while ex.abandoned_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ex.abandoned_alive() == 0


def test_backoff_doubles_per_consecutive_overrun_up_to_the_cap(
    ex: DeadlineExecutor, clock: ManualClock, gate: threading.Event
) -> None:
    waits = []
    for _ in range(2):  # max_abandoned_per_key=2 allows two stuck threads
        with pytest.raises(DeadlineExceeded):
            ex.call(0, gate.wait)
        waits.append(ex.health(0).retry_in_s)
        clock.now += waits[-1]
    assert waits == [5.0, 10.0]


def test_permanently_wedged_key_cannot_leak_threads(clock: ManualClock, gate: threading.Event) -> None:
    ex = DeadlineExecutor(0.05, backoff_s=1.0, max_abandoned_per_key=2, clock=clock)
    threads_before = threading.active_count()
    try:
        outcomes = []
        for _ in range(10):
            try:
                ex.call(0, gate.wait)
                outcomes.append("ok")
            except Wedged:
                outcomes.append("wedged")
            except DeadlineExceeded:
                outcomes.append("timeout")
            clock.now += 1000.0  # backoff always over: only the cap holds the line
        assert outcomes[:2] == ["timeout", "timeout"]
        assert set(outcomes[2:]) == {"wedged"}
        assert ex.abandoned_alive() == 2
        assert threading.active_count() - threads_before <= 2
        health = ex.health(0)
        assert health.abandoned_alive == 2
    finally:
        gate.set()
        ex.close()


def test_cap_message_says_why(clock: ManualClock, gate: threading.Event) -> None:
    ex = DeadlineExecutor(0.05, backoff_s=0.0, max_abandoned_per_key=1, clock=clock)
    try:
        with pytest.raises(DeadlineExceeded):
            ex.call(0, gate.wait)
        with pytest.raises(Wedged, match="still stuck"):
            ex.call(0, lambda: None)
    finally:
        gate.set()
        ex.close()


def test_wait_all_shares_one_deadline_across_keys(ex: DeadlineExecutor, gate: threading.Event) -> None:
    pendings = [ex.submit(k, gate.wait if k == 2 else (lambda k=k: k * 10)) for k in range(4)]
    outcomes, elapsed = timed(ex.wait_all, pendings)
    assert elapsed < DEADLINE_S + SLACK_S
    assert [o.value for o in outcomes if o.ok] == [0, 10, 30]
    assert outcomes[2].timed_out and not outcomes[2].ok
    with pytest.raises(DeadlineExceeded):
        outcomes[2].unwrap()


def test_several_hung_keys_still_cost_one_deadline(ex: DeadlineExecutor, gate: threading.Event) -> None:
    pendings = [ex.submit(k, gate.wait) for k in range(6)]
    outcomes, elapsed = timed(ex.wait_all, pendings)
    assert all(o.timed_out for o in outcomes)
    assert elapsed < DEADLINE_S + SLACK_S


def test_calls_queued_behind_a_stuck_call_fail_instead_of_waiting_forever(
    ex: DeadlineExecutor, gate: threading.Event
) -> None:
    stuck = ex.submit(0, gate.wait)
    queued = ex.submit(0, lambda: "late")
    assert ex.wait(stuck).timed_out
    outcome, elapsed = timed(ex.wait, queued, 1.0)
    assert isinstance(outcome.error, Wedged)
    assert elapsed < 0.05


def test_zero_timeout_polls_without_blocking(ex: DeadlineExecutor, gate: threading.Event) -> None:
    outcome, elapsed = timed(ex.wait, ex.submit(0, gate.wait), 0.0)
    assert outcome.timed_out
    assert elapsed < 0.05


def test_sleeping_function_under_the_deadline_returns(ex: DeadlineExecutor) -> None:
    assert ex.call(0, lambda: time.sleep(0.01) or "slept", deadline_s=1.0) == "slept"


def test_closed_executor_refuses_work_and_close_is_idempotent(clock: ManualClock) -> None:
    ex = DeadlineExecutor(0.1, clock=clock)
    ex.call(0, lambda: None)
    ex.close()
    ex.close()
    with pytest.raises(RuntimeError, match="closed"):
        ex.submit(0, lambda: None)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        DeadlineExecutor(0)
    with pytest.raises(ValueError, match="max_abandoned_per_key"):
        DeadlineExecutor(1.0, max_abandoned_per_key=0)


def test_workers_are_daemon_threads(ex: DeadlineExecutor, gate: threading.Event) -> None:
    """A stuck call must never keep the process from exiting."""
    names_before = {t.name for t in threading.enumerate()}
    with pytest.raises(DeadlineExceeded):
        ex.call("k", gate.wait)
    new = [t for t in threading.enumerate() if t.name not in names_before]
    assert new and all(t.daemon for t in new)


# -- run_each: the healthy keys in sequence on one batch worker (issue 30) -----------------------------


def _where(log: list[str], value: object = None):
    """A call that records the thread it ran on and returns ``value``."""

    def call(key: object) -> object:
        log.append(threading.current_thread().name)
        return value if value is not None else key

    return call


def test_run_each_reads_healthy_keys_in_sequence_on_one_worker_one_handoff(ex: DeadlineExecutor) -> None:
    threads: list[str] = []
    for _ in range(3):
        before = ex.handoffs
        outcomes = ex.run_each([(k, _where(threads), (k,)) for k in range(16)])
        assert [o.value for o in outcomes] == list(range(16))
        assert ex.handoffs - before == 1
    assert len(threads) == 48 and len(set(threads)) == 1  # one worker, kept between calls
    assert threads[0] != threading.current_thread().name


def test_run_each_keeps_each_keys_own_exception_as_its_outcome(ex: DeadlineExecutor) -> None:
    outcomes = ex.run_each([(0, lambda: 1 / 0, ()), (1, lambda: "fine", ())])
    assert isinstance(outcomes[0].error, ZeroDivisionError) and outcomes[1].value == "fine"
    assert not ex.health(0).wedged


def test_batch_stuck_in_one_key_blames_that_key_only(
    ex: DeadlineExecutor, clock: ManualClock, gate: threading.Event
) -> None:
    """Stuck in key 2 of 5: keys 0-1 keep their values, 2 overran (its own backoff, its abandoned
    thread), 3-4 time out this once and are read the next time by a fresh batch worker that no
    backoff holds back; 2 fails fast meanwhile."""

    def calls() -> list[tuple[int, object, tuple[()]]]:
        return [(k, gate.wait if k == 2 else (lambda k=k: k * 10), ()) for k in range(5)]

    outcomes, elapsed = timed(ex.run_each, calls())
    assert elapsed < DEADLINE_S + SLACK_S
    assert [o.value for o in outcomes[:2]] == [0, 10]
    assert all(o.timed_out and not isinstance(o.error, Wedged) for o in outcomes[2:])
    health = ex.health(2)
    assert health.wedged and health.consecutive_overruns == 1 and health.abandoned_alive == 1
    assert health.retry_in_s == 5.0
    assert not any(ex.health(k).wedged for k in (0, 1, 3, 4))

    before = ex.handoffs
    outcomes, elapsed = timed(ex.run_each, calls())
    assert elapsed < 0.05
    assert [o.value for o in outcomes if o.ok] == [0, 10, 30, 40]
    assert isinstance(outcomes[2].error, Wedged) and "retrying in" in str(outcomes[2].error)
    assert ex.handoffs - before == 1  # the wedged key is refused, not handed to anyone

    # after its backoff the key gets a fresh worker of its own (isolated: never back in the batch)
    clock.now += 5.0
    gate.set()
    outcomes = ex.run_each(calls())
    assert all(o.ok for o in outcomes) and not ex.health(2).wedged


def test_a_key_that_overran_on_its_own_worker_is_not_batched(
    ex: DeadlineExecutor, gate: threading.Event
) -> None:
    with pytest.raises(DeadlineExceeded):
        ex.call(1, gate.wait)
    outcomes, elapsed = timed(
        ex.run_each, [(k, gate.wait if k == 1 else (lambda: "ok"), ()) for k in range(3)]
    )
    assert elapsed < 0.05
    assert isinstance(outcomes[1].error, Wedged) and outcomes[0].ok and outcomes[2].ok


def test_a_key_stuck_in_the_batch_fails_fast_on_its_own_key_too(
    ex: DeadlineExecutor, gate: threading.Event
) -> None:
    """Health reads use the key's own worker: once the batch is stuck in the key, they back off too,
    even if the key already had an idle worker of its own."""
    assert ex.call(0, lambda: "health read") == "health read"
    ex.run_each([(0, gate.wait, ())])
    error, elapsed = timed(ex.call, 0, lambda: "never run")
    assert isinstance(error, Wedged) and elapsed < 0.05


def test_batch_abandonments_cannot_leak_threads(clock: ManualClock, gate: threading.Event) -> None:
    """Every key wedges in turn: each abandonment isolates one more key, the cap holds per key."""
    ex = DeadlineExecutor(0.05, backoff_s=0.0, max_abandoned_per_key=2, clock=clock)
    threads_before = threading.active_count()
    try:
        for _ in range(12):
            outcomes = ex.run_each([(k, gate.wait, ()) for k in range(4)])
            assert all(o.timed_out for o in outcomes)
        assert all(ex.health(k).abandoned_alive == 2 for k in range(4))
        assert threading.active_count() - threads_before <= 4 * 2 + 1
    finally:
        gate.set()
        ex.close()
