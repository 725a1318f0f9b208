"""The ladder with ``kill_via``: a job whose ranks merely *say* they are Slurm job 4242 (the
environment is the owner's to write; no slurmstepd parent, no Slurm cgroup) is never scancelled.
``kill_via = "slurm"`` then sends nothing; ``"auto"`` signals the proven processes as it would outside
Slurm and records why Slurm was not used. The scancel path itself runs against a real cluster in
tests/integration/test_slurm.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_triage.journal.eventstore import EventStore
from gpu_triage.model.states import Mode, Verdict
from tests.watchdog.snapshots import T0
from tests.watchdog.test_action_engine import Driver, make_engine, two_ranks
from tests.watchdog.test_alerts import make_job
from tests.watchdog.test_delivery import FakeClock
from tests.watchdog.test_kill import Procs, alive, wait_dead


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    yield p
    p.cleanup()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    s = EventStore(tmp_path / "state", T0)
    yield s
    s.close()


@pytest.mark.parametrize("kill_via", ["slurm", "auto"])
def test_a_forged_slurm_job_id_is_never_scancelled(
    tmp_path: Path, store: EventStore, procs: Procs, monkeypatch, kill_via: str
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # inherited by the ranks: a claim, not a proof
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    for name in ("squeue", "scancel"):  # were either ever run, the log would say so
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name} \"$@\" >> {calls}\necho '0|RUNNING'\n")
        (bin_dir / name).chmod(0o755)
    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="default")
    rank_pids = [p.pid for p in next(iter(processes.values()))]
    eng = make_engine(store, tmp_path, clock, sigterm_after_s=1.0, kill_via=kill_via, slurm_bin_dir=bin_dir)
    d = Driver(eng, clock)
    try:
        confirmed = make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=rank_pids)
        d.run(4, Mode.KILL, [confirmed], processes)
    finally:
        eng.close()
    assert not calls.exists(), calls.read_text()
    sigterm = [r for r in d.records if r["action"] == "sigterm" and r["result"] != "started"]
    assert len(sigterm) == 1, d.actions()
    if kill_via == "slurm":
        assert sigterm[0]["result"] == "refused" and "not confirmed" in sigterm[0]["refused"], sigterm[0]
        assert all(alive(p) for p in pids)
        assert store.kv_get("actions.kill_times", None) == []  # nothing sent: the hourly budget is intact
    else:
        assert sigterm[0]["result"] == "ok" and sigterm[0]["signalled"], sigterm[0]
        assert "not confirmed" in sigterm[0]["slurm_refused"]
        assert wait_dead(pids)
