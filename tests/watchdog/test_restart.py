"""Episodes survive a restart (issue 18, item 5), for real: a simulated job of real rank processes
reaches the epoch-end deadlock under an armed daemon subprocess; the daemon is stopped (SIGTERM, as
``systemctl restart`` does) in the middle of the episode, while the ranks' flusher keeps rewriting
their progress files, and a new daemon is started on the same state directory. The hung job is killed
exactly once: no "deterministic hang" refusal for its own interrupted episode, no ``healthy`` verdict
in between, no second evidence bundle."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_triage.demo import simjob
from tests.conftest import REPO, require_binary

JOB = "restart-test"
GPU_WATCHDOG = [sys.executable, "-m", "gpu_triage"]


def _events(state: Path) -> list[dict]:
    if not (state / "events.sqlite3").exists():
        return []
    db = sqlite3.connect(f"file:{state / 'events.sqlite3'}?mode=ro", uri=True, timeout=5)
    try:
        cols = [r[1] for r in db.execute("PRAGMA table_info(events)")]
        rows = db.execute("SELECT * FROM events ORDER BY id").fetchall() if cols else []
    except sqlite3.OperationalError:  # being created
        return []
    finally:
        db.close()
    out = []
    for row in rows:
        e = dict(zip(cols, row, strict=True))
        e["payload"] = json.loads(e["payload"]) if isinstance(e.get("payload"), str) else e.get("payload")
        out.append(e)
    return out


def _daemon(config: Path, state: Path, start: float, log: Path, job: subprocess.Popen) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *GPU_WATCHDOG,
            "run",
            "--config",
            str(config),
            "--source",
            "sim",
            "--sim-start",
            str(start),
            "--sim-job",
            str(job.pid),
            "--state-dir",
            str(state),
            "--listen",
            "127.0.0.1:0",
        ],
        cwd=REPO,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait(what: str, predicate, timeout_s: float, log: Path, *, fatal: bool = True):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.5)
    if not fatal:  # the test's assertions say what went wrong
        return None
    raise AssertionError(f"timed out waiting for {what}; daemon log:\n{log.read_text()[-4000:]}")


def _verdicts(state: Path) -> list[str | None]:
    return [e["payload"].get("to") for e in _events(state) if e["kind"] == "verdict" and e["job"] == JOB]


def _setup(
    tmp_path: Path, *, sigkill_grace_s: float, ignore_sigterm: bool
) -> tuple[Path, Path, Path, float, subprocess.Popen]:
    """The config, the state directory, the log and the simulated job (started ~15 s before its
    epoch-end deadlock)."""
    progress, state, log = tmp_path / "progress", tmp_path / "state", tmp_path / "daemon.log"
    config = tmp_path / "config.toml"
    config.write_text(
        f"""
[daemon]
period_s = 0.2
[progress]
dir = "{progress}"
[detector]
confirm_after_s = 20.0
[actions]
mode = "kill"
capture_after_s = 0.0
alert_after_s = 0.0
sigterm_after_s = 2.0
sigkill_grace_s = {sigkill_grace_s}
capture_timeout_s = 10.0
"""
    )
    start = time.time() - 95.0  # the scenario's epoch-end deadlock begins at 110 s: ~15 s from now
    job = simjob.start(
        progress,
        start,
        job=JOB,
        interval_s=0.2,
        heartbeat_s=2.0,  # the trainer's flusher (30 s in production): files rewritten while the ranks hang
        ignore_sigterm=ignore_sigterm,
    )
    return config, state, log, start, job


def _restart_when(tmp_path: Path, what: str, ready, *, sigkill_grace_s: float, ignore_sigterm: bool) -> None:
    """Start the job and an armed daemon; once ``ready(state)``, stop the daemon (SIGTERM, as
    ``systemctl restart`` does), let the flusher rewrite every rank file, start a new daemon on the
    same state directory and wait for the job to end."""
    config, state, log, start, job = _setup(
        tmp_path, sigkill_grace_s=sigkill_grace_s, ignore_sigterm=ignore_sigterm
    )
    first = _daemon(config, state, start, log, job)
    second: subprocess.Popen | None = None
    try:
        _wait(what, lambda: ready(state), 120, log)
        _stop(first)
        assert job.poll() is None
        time.sleep(5.0)  # the flusher rewrites every rank file (new `time`) while no daemon watches
        second = _daemon(config, state, start, log, job)
        _wait("the job to be killed", lambda: job.poll() is not None, 90, log, fatal=False)
        time.sleep(2.0)
    finally:
        for p in (first, second):
            if p is not None:
                _stop(p)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def scenario(tmp_path: Path) -> None:
    """Run inside a PID namespace of its own (see the test): the daemon sees only this job's ranks,
    never another process of the machine (an armed daemon on a shared test machine would kill them).
    Stopped mid-episode: suspected, not yet confirmed, nothing signalled."""
    _restart_when(
        tmp_path,
        "deadlock_suspected",
        lambda state: "deadlock_suspected" in _verdicts(state),
        sigkill_grace_s=3.0,
        ignore_sigterm=False,
    )


def _term_sent(state: Path) -> bool:
    return any(
        e["kind"] == "action"
        and e["payload"].get("action") == "sigterm"
        and e["payload"].get("result") == "ok"
        for e in _events(state)
    )


def scenario_between_rungs(tmp_path: Path) -> None:
    """Stopped between SIGTERM and SIGKILL, with ranks that ignore SIGTERM (its SIGKILL was due 20 s
    later and lived only in the stopped daemon's memory)."""
    _restart_when(tmp_path, "the SIGTERM", _term_sent, sigkill_grace_s=20.0, ignore_sigterm=True)


def _in_own_pid_namespace(tmp_path: Path, which: str) -> None:
    unshare = require_binary("unshare", "the armed daemon runs in a PID namespace of its own")
    if os.geteuid() != 0:
        pytest.skip("a PID namespace with its own /proc needs root (CI runs as root)")
    done = subprocess.run(
        [
            unshare,
            "--fork",
            "--pid",
            "--mount-proc",
            sys.executable,
            "-m",
            "tests.watchdog.test_restart",
            str(tmp_path),
            which,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _actions(events: list[dict]) -> list[dict]:
    return [e["payload"] for e in events if e["kind"] == "action" and e["job"] == JOB]


@pytest.mark.slow
def test_a_daemon_restarted_mid_episode_kills_the_hung_job_once(tmp_path: Path) -> None:
    _in_own_pid_namespace(tmp_path, "mid_episode")
    state = tmp_path / "state"
    events = _events(state)
    actions = _actions(events)
    term = next(
        (
            e["id"]
            for e in events
            if e["kind"] == "action"
            and e["payload"].get("action") == "sigterm"
            and e["payload"].get("result") == "started"
        ),
        None,
    )
    verdicts = [
        (e["id"], e["payload"].get("to"))
        for e in events
        if e["kind"] == "verdict" and e["job"] == JOB and (term is None or e["id"] < term)
    ]
    onset = next(i for i, (_, v) in enumerate(verdicts) if v == "deadlock_suspected")
    assert "healthy" not in [v for _, v in verdicts[onset:]], verdicts
    refused = [a for a in actions if a.get("result") == "refused"]
    assert not refused, refused
    assert not [a for a in actions if a.get("condition") == "deterministic_hang"], actions
    started = [a for a in actions if a.get("action") == "sigterm" and a.get("result") == "started"]
    assert len(started) == 1, actions
    assert [a for a in actions if a.get("action") == "ladder" and a.get("result") == "resumed"], actions
    captures = [a for a in actions if a.get("action") == "capture" and a.get("result") == "started"]
    assert len(captures) == 1, actions  # the capture rate limit held across the restart
    starts = [e for e in events if e["kind"] == "daemon" and e["payload"].get("event") == "started"]
    assert len(starts) == 2


@pytest.mark.slow
def test_a_daemon_restarted_between_sigterm_and_sigkill_finishes_the_kill(tmp_path: Path) -> None:
    """The ranks ignore SIGTERM; the daemon that sent it is stopped 20 s before its SIGKILL. The new
    daemon keeps reading the signalled ranks as ``killed`` (no new episode, no second SIGTERM, no
    refusal from the kill budget) and sends the SIGKILL rung itself, which ends the job."""
    _in_own_pid_namespace(tmp_path, "between_rungs")
    events = _events(tmp_path / "state")
    actions = _actions(events)
    starts = [e["id"] for e in events if e["kind"] == "daemon" and e["payload"].get("event") == "started"]
    assert len(starts) == 2, events
    started = [a for a in actions if a.get("action") == "sigterm" and a.get("result") == "started"]
    assert len(started) == 1, actions
    kills = [
        (e["id"], e["payload"].get("result"), e["payload"].get("resumed"))
        for e in events
        if e["kind"] == "action" and e["job"] == JOB and e["payload"].get("action") == "sigkill"
    ]
    assert [(r, resumed) for _, r, resumed in kills] == [("ok", True)], actions
    assert kills[0][0] > starts[1]
    after = [
        e["payload"].get("to")
        for e in events
        if e["kind"] == "verdict" and e["job"] == JOB and e["id"] > starts[1]
    ]
    assert not {"deadlock_suspected", "deadlock_confirmed"} & set(after), after
    assert not [a for a in actions if a.get("result") in ("refused", "rate_limited")], actions


if __name__ == "__main__":
    {"mid_episode": scenario, "between_rungs": scenario_between_rungs}[sys.argv[2]](Path(sys.argv[1]))
