"""Durations on the monotonic clock (issue 18, item 6): the real daemon loop (``Daemon.tick``: store,
progress reader, process inspector, detector, action engine, silences) driven by an injected clock
whose wall time jumps +10 min, -20 min and +10 min while the monotonic clock runs on evenly. The
trainers' writers use the same wall clock, as on a real node. Nothing may move: the suspicion is
confirmed after ``confirm_after_s`` of monotonic time (not at the jump), a checkpoint keeps its lease
(remaining time unchanged, never ``stalled_checkpoint``), a 20 s-step job stays healthy, the alert
rung waits for its delay and a silence lasts its duration. The steps are logged and recorded."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_triage.contract import ProgressWriter
from gpu_triage.daemon.config import load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.model.clock import Timeline
from gpu_triage.telemetry.none import NoneSource
from tests.corpus.live import spawn_rank
from tests.watchdog.engines import build_engine

T0_WALL = 1_780_000_000.0


@dataclass
class SteppedClock:
    """Wall and monotonic clocks advancing together, except when the wall clock is stepped."""

    wall_s: float = T0_WALL
    mono_s: float = 5_000.0

    def wall(self) -> float:
        return self.wall_s

    def monotonic(self) -> float:
        return self.mono_s

    def advance(self, s: float) -> None:
        self.wall_s += s
        self.mono_s += s

    def step(self, s: float) -> None:
        self.wall_s += s


def test_the_timeline_reports_a_step_and_moves_nothing() -> None:
    clock = SteppedClock()
    line = Timeline(clock)
    t0 = line.now()
    lease_end = line.from_wall(clock.wall() + 60.0)  # a lease read from a file: 60 s from now
    clock.advance(10.0)
    assert line.check_step() is None
    clock.step(600.0)
    step = line.check_step()
    assert step is not None and step.step_s == pytest.approx(600.0)
    assert line.now() - t0 == pytest.approx(10.0)
    assert lease_end - line.now() == pytest.approx(50.0)  # the lease's remaining time did not move
    assert line.offset_s() == pytest.approx(600.0)
    assert line.check_step() is None  # reported once
    clock.step(-1200.0)
    assert line.check_step().step_s == pytest.approx(-1200.0)  # type: ignore[union-attr]
    # a time read after the step keeps its age: written 5 s ago by the (stepped) wall clock
    assert line.from_wall(clock.wall() - 5.0) == pytest.approx(line.now() - 5.0)


@pytest.mark.isolated  # an armed daemon: a PID namespace of its own (tests/isolation.py)
@pytest.mark.slow
def test_a_wall_clock_step_moves_no_verdict_lease_ladder_step_or_silence(tmp_path: Path) -> None:
    clock = SteppedClock()
    progress = tmp_path / "progress"
    host = socket.gethostname()
    jobs = {"hung": 2, "ckpt": 2, "slow": 2}
    procs = {(job, r): spawn_rank(r, n, job) for job, n in jobs.items() for r in range(n)}
    writers = {
        key: ProgressWriter(
            key[0], key[1], key[1], jobs[key[0]], directory=progress, pid=p.pid, host=host,
            clock=clock.wall, monotonic=clock.monotonic,
        )
        for key, p in procs.items()
    }  # fmt: skip
    config = override(
        load_config(None, {}),
        {
            "daemon.state_dir": str(tmp_path / "state"),
            "daemon.period_s": 1.0,
            "progress.dir": str(progress),
            "actions.mode": "alert",
            "actions.capture_after_s": 30.0,
            "actions.alert_after_s": 30.0,
            "detector.confirm_after_s": 120.0,
            "stacks.enabled": False,
        },
        origin="test",
    )
    daemon = Daemon(config, NoneSource(), serve_http=False, clock=clock)
    daemon.start()
    assert daemon.actions is not None and daemon.store is not None
    daemon.actions.close()  # the same engine without py-spy: a rank in tracing-stop reads "suspended"
    daemon.actions = build_engine(
        daemon.store,
        tmp_path / "state",
        clock=daemon.clock,
        node=daemon.node,
        actions=config.actions,
        alerts=config.alerts,
    )
    silence = daemon.control.add_silence({"job": "hung"}, 90.0, "known issue", daemon.clock())
    assert silence["id"]
    seen: dict[int, dict[str, str]] = {}
    leases: dict[int, float] = {}
    offsets: dict[int, float] = {}
    try:
        for w in writers.values():
            w.phase("train")
        for t in range(0, 171):
            if t <= 10:
                for r in (0, 1):
                    writers[("hung", r)].step(t)
            if t == 10:  # the epoch-end deadlock: rank 0 out of batches, rank 1 waits in train
                writers[("hung", 0)].phase("epoch_end", lease_s=600.0)
            if t == 2:
                for r in (0, 1):
                    writers[("ckpt", r)].step(1)
            if t == 5:
                for r in (0, 1):
                    writers[("ckpt", r)].phase("checkpoint", lease_s=120.0)  # back by t = 125
            if t % 20 == 0:
                for r in (0, 1):
                    writers[("slow", r)].step(t // 20)
            for w in writers.values():
                w.tick(heartbeat_s=30.0)  # the trainer's flusher
            if t == 35:
                clock.step(+600.0)
            if t == 60:
                clock.step(-1200.0)
            if t == 80:
                clock.step(+600.0)
            snap = daemon.tick()
            assert snap is not None
            seen[t] = {j.job: str(j.verdict) for j in snap.jobs}
            offsets[t] = snap.clock_offset_s
            ckpt = next((j for j in snap.jobs if j.job == "ckpt"), None)
            if ckpt is not None and 6 <= t < 120:
                leases[t] = max(r.lease_until or 0.0 for r in ckpt.ranks) - snap.time
            clock.advance(1.0)
        assert daemon.store is not None
        events = [e.to_dict() for e in daemon.store.since(0, 100000)]
    finally:
        daemon.close()
        for p in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def verdicts(job: str, ts: range) -> set[str]:
        return {seen[t].get(job, "-") for t in ts}

    # frozen since t = 10, suspected after 15 s; confirmed 120 s of monotonic time later, not at a jump
    assert verdicts("hung", range(27, 140)) == {"deadlock_suspected"}, seen
    assert verdicts("hung", range(150, 171)) == {"deadlock_confirmed"}
    assert verdicts("ckpt", range(6, 120)) == {"checkpoint"}, seen
    assert verdicts("slow", range(0, 171)) == {"healthy"}, seen
    # the lease's remaining time follows the monotonic clock through every step
    assert all(abs(left - (125.0 - t)) < 1.5 for t, left in leases.items()), leases
    # the ladder: the alert rung waits alert_after_s from the suspicion; the silence lasts 90 s
    actions = [(e["time"] - daemon.started_at, e["payload"]) for e in events if e["kind"] == "action"]
    alert = [
        (round(t), a["result"]) for t, a in actions if a.get("action") == "alert" and a.get("job") == "hung"
    ]
    assert alert and alert[0][1] == "silenced" and 55 <= alert[0][0] <= 60, alert
    fired = [t for t, result in alert if result in ("queued", "no_sinks")]
    assert fired and 90 <= fired[0] <= 92, alert
    steps = [
        e["payload"] for e in events if e["kind"] == "daemon" and e["payload"].get("event") == "clock_step"
    ]
    assert [round(s["step_s"]) for s in steps] == [600, -1200, 600]
    assert (round(offsets[30]), round(offsets[40]), round(offsets[70]), round(offsets[90])) == (
        0,
        600,
        -600,
        0,
    )
