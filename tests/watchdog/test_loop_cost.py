"""Issue 30: what the daemon's 10 Hz loop does not do. The running loop publishes each cycle's
snapshot unbuilt - made by its first reader, never for a cycle nobody reads - while a cycle driven by
hand (tests, ``on_cycle``) still builds and returns it; the rows and the snapshot are the same either way."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.daemon import loop
from gpu_triage.daemon.config import load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.model.snapshot import Snapshot
from gpu_triage.telemetry.sim import SimSource


def _config(tmp_path: Path, period_s: float = 0.1):
    return override(
        load_config(None, {}),
        {"daemon.state_dir": str(tmp_path / "state"), "progress.dir": str(tmp_path / "progress"),
         "daemon.period_s": period_s},
        origin="test",
    )  # fmt: skip


def test_the_running_loop_builds_a_snapshot_only_for_the_cycles_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []

    def counted(**fields: Any) -> Snapshot:
        built.append(fields["cycle"])
        return Snapshot(**fields)

    monkeypatch.setattr(loop, "Snapshot", counted)
    daemon = Daemon(_config(tmp_path), SimSource("reference-b300", gpus=4, start_s=0.0), serve_http=False)
    daemon.start()
    runner = threading.Thread(target=daemon.run_forever, daemon=True)
    runner.start()
    try:
        first = daemon.snapshots.wait_for_cycle(5, timeout_s=30.0)
        assert first is not None and len(first.gpus) == 4
        deadline = time.monotonic() + 30.0
        while (daemon.snapshots.latest_cycle or 0) < first.cycle + 12 and time.monotonic() < deadline:
            time.sleep(0.02)
        latest = daemon.snapshots.latest()
        assert latest is not None and latest.cycle >= first.cycle + 12
        assert daemon.snapshots.latest() is latest  # built once, kept
        assert built == [first.cycle, latest.cycle]  # the 12 and more cycles between: never built
        assert latest.counters["cycles_total"] == latest.cycle and len(latest.gpus) == 4
    finally:
        daemon.stop()
        runner.join(10)
        daemon.close()


def test_a_snapshot_built_late_holds_its_own_cycle_not_the_next(tmp_path: Path) -> None:
    """An unbuilt cycle read after later cycles ran is the cycle it was: its GPU rows, its counters."""
    source = SimSource("reference-b300", gpus=4, start_s=0.0)
    daemon = Daemon(_config(tmp_path, 0.1), source, serve_http=False)
    daemon.start()
    try:
        built = [daemon.cycle(100.0 + 0.1 * i) for i in range(3)]  # by hand: built at once
        daemon._tick(build=False)  # the running loop's way
        unbuilt = daemon.snapshots._latest
        assert not isinstance(unbuilt, Snapshot) and daemon.snapshots.latest_cycle == 4
        daemon.cycle(200.0)  # a later cycle changes every GPU's reading
        late = unbuilt.get()
        assert late.cycle == 4 and late.counters["cycles_total"] == 4.0 and len(late.gpus) == 4
        later = daemon.snapshots.latest()
        assert later is not None and later.cycle == 5
        assert [g.energy_j for g in late.gpus] != [g.energy_j for g in later.gpus]
        assert [g.energy_j for g in late.gpus] != [g.energy_j for g in built[-1].gpus]
    finally:
        daemon.close()


def test_stop_wakes_the_sleeping_loop_at_once(tmp_path: Path) -> None:
    """The loop sleeps on a lock until its next deadline; stop() from any thread ends the sleep, even
    a long one (here a 60 s period), and a second stop() is harmless."""
    daemon = Daemon(
        _config(tmp_path, 60.0), SimSource("reference-b300", gpus=2, start_s=0.0), serve_http=False
    )
    daemon.start()
    runner = threading.Thread(target=daemon.run_forever, daemon=True)
    runner.start()
    try:
        assert daemon.snapshots.wait_for_cycle(1, timeout_s=30.0) is not None
        time.sleep(0.2)  # asleep now, 60 s from its next cycle
        t0 = time.monotonic()
        daemon.stop()
        runner.join(10)
        assert not runner.is_alive() and time.monotonic() - t0 < 5.0
        daemon.stop()
    finally:
        daemon.stop()
        daemon.close()


class _Clock:
    """Wall and monotonic clocks stepped by hand, together."""

    def __init__(self) -> None:
        self.mono_s = 1_000.0

    def wall(self) -> float:
        return 1_700_000_000.0 + self.mono_s

    def monotonic(self) -> float:
        return self.mono_s


def _drive(tmp_path: Path, publish_period_s: float, seconds: float) -> tuple[Daemon, list[Any], int]:
    """The running loop's cycles (``_tick(batch=True)``) at 10 Hz over ``seconds`` of the reference
    scenario (training, a checkpoint, a data stall: state changes on every GPU) on a stepped clock:
    the daemon, its state-change events as (time, gpu, from, to, power) and how many cycles published."""
    config = override(_config(tmp_path, 0.1), {"daemon.publish_period_s": publish_period_s}, origin="test")
    clock = _Clock()
    daemon = Daemon(config, SimSource("reference-b300", gpus=4, start_s=0.0), clock=clock, serve_http=False)
    daemon.start()
    daemon.source.start_s = daemon.clock()  # the scenario starts with the first cycle
    events: list[Any] = []
    record = daemon.recorder.event

    def recorded(kind: str, payload: dict[str, Any], now: float | None = None, **kw: Any) -> None:
        if kind == "state_change":
            events.append((now, kw["gpu"], payload["from"], payload["to"], payload["power_w"]))
        record(kind, payload, now, **kw)

    daemon.recorder.event = recorded  # type: ignore[method-assign]
    published = 0
    for _ in range(int(seconds * 10)):
        before = daemon.snapshots.latest_cycle
        daemon._tick(build=False, batch=True)
        published += daemon.snapshots.latest_cycle != before
        clock.mono_s += 0.1
    return daemon, events, published


def test_the_running_loop_classifies_every_sample_at_its_time_and_publishes_at_the_publish_period(
    tmp_path: Path,
) -> None:
    """``daemon.publish_period_s``: between two published cycles the loop only reads the GPUs; the
    published cycle classifies every sample taken since, each at its own time. The state changes (their
    times, GPUs, states, power) and the GPU rows are those of a loop that publishes every cycle, with a
    fifth of the publishes at 10 Hz and 0.5 s."""
    every, every_events, every_published = _drive(tmp_path / "every", 0.0, 95.1)
    batched, batched_events, batched_published = _drive(tmp_path / "batched", 0.5, 95.1)
    try:
        assert len(every_events) >= 8  # the scenario's phases change every GPU's state
        assert batched_events == every_events
        assert every_published == 951 and batched_published == 191  # cycles 1, 6, 11, ... 951
        assert batched.stats.cycles == every.stats.cycles == 951
        # the last cycle published in both: the same rows
        rows = [every.snapshots.latest(), batched.snapshots.latest()]
        assert rows[0] is not None and rows[1] is not None and rows[0].cycle == rows[1].cycle == 951
        assert rows[1].gpus == rows[0].gpus  # every field: state, since, counters, learned floor
    finally:
        every.close()
        batched.close()


def test_healthz_judges_the_snapshot_age_against_the_publish_period(tmp_path: Path) -> None:
    """A snapshot is published every ``publish_period_s`` where that is longer than the period: /healthz
    must not call the loop stale between two publishes (stale after 3 of them, as after 3 periods)."""
    import httpx

    config = override(
        _config(tmp_path, 1.0),
        {"daemon.publish_period_s": 20.0, "daemon.listen": "127.0.0.1:0"},
        origin="test",
    )
    daemon = Daemon(config, SimSource("reference-b300", gpus=2, start_s=0.0))
    daemon.start()
    try:
        daemon.tick()
        assert daemon.url is not None
        body = httpx.get(f"{daemon.url}/healthz", timeout=10).json()
        assert body["max_age_s"] == 60.0
    finally:
        daemon.close()
