"""The progress contract module (``gpu_triage.contract``) and the plain-loop session built on it:
importable without the daemon's dependencies, leases from measured durations, the flusher that keeps
a file current while the training thread blocks, fork safety, ``lease_scope`` round-tripping through
the daemon's reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_triage.contract import (
    FIELDS,
    OPTIONAL_FIELDS,
    Flusher,
    LeaseEstimator,
    LeasePolicy,
    ProgressWriter,
)
from gpu_triage.integrations import Progress
from gpu_triage.signals.progress import ProgressReader
from gpu_triage.signals.progress_model import parse_record
from tests.conftest import REPO

JOB = "tiny-job"
T0 = 1_764_681_234.5

# What a training environment with only the base install lacks: the daemon's dependencies and the
# frameworks (the framework modules themselves are imported only where the framework is).
HIDDEN = (
    "numpy",
    "psutil",
    "pyarrow",
    "matplotlib",
    "pynvml",
    "fastapi",
    "uvicorn",
    "prometheus_client",
    "httpx",
    "tqdm",
    "tomli_w",
    "torch",
    "transformers",
    "accelerate",
    "lightning",
    "pytorch_lightning",
)


class Clock:
    def __init__(self, now_s: float = T0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def read(path: Path) -> dict:
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------ imports


def test_client_side_imports_with_the_daemon_dependencies_hidden(tmp_path: Path) -> None:
    """A training environment with the base install only: the contract, the plain-loop session, the
    accelerate module and the trainer's writer import and write a file while every daemon dependency
    and framework is unimportable."""
    code = f"""
import sys
HIDDEN = {HIDDEN!r}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ImportError("hidden by the test: " + name)
        return None
sys.meta_path.insert(0, Block())
import gpu_triage.contract, gpu_triage.integrations, gpu_triage.integrations.accelerate
from gpu_triage.integrations import Progress
p = Progress.from_env("job-a", env={{"RANK": "1", "WORLD_SIZE": "2"}}, directory={str(tmp_path)!r})
with p.checkpoint():
    pass
p.close()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
daemon = sorted(m for m in sys.modules if m.startswith("gpu_triage.") and m not in (
    "gpu_triage.contract", "gpu_triage.integrations", "gpu_triage.integrations.loop",
    "gpu_triage.integrations.accelerate"))
print(loaded, daemon)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []"
    assert read(tmp_path / "job-a" / "rank-1.json")["phase"] == "done"


# ------------------------------------------------------------------------------------------- writer


def test_lease_scope_is_written_and_read_back(tmp_path: Path) -> None:
    clock = Clock()
    w = ProgressWriter(JOB, 0, 0, 2, directory=tmp_path, clock=clock, lease_scope="job", host="n")
    w.phase("checkpoint", lease_s=60)
    data = read(w.path)
    assert list(data) == [*FIELDS, *OPTIONAL_FIELDS]
    record = parse_record(w.path.read_bytes())
    assert (record.phase, record.lease_until, record.lease_scope) == ("checkpoint", T0 + 60, "job")
    plain = ProgressWriter(JOB, 1, 1, 2, directory=tmp_path, clock=clock, host="n")
    plain.phase("train")
    assert "lease_scope" not in read(plain.path)
    with pytest.raises(ValueError, match="lease_scope 'all'"):
        ProgressWriter(JOB, 0, 0, 2, directory=tmp_path, lease_scope="all")


def test_lease_from_measured_durations() -> None:
    est = LeaseEstimator(LeasePolicy(factor=2.0, slack_s=10.0, min_s=30.0, max_s=1000.0))
    assert est.lease_s("checkpoint") == 600.0  # the first save: the policy's first_s
    est.observe("checkpoint", 50.0)
    assert est.lease_s("checkpoint") == 110.0  # 2 x 50 + 10
    est.observe("checkpoint", 5.0)
    assert est.lease_s("checkpoint") == 110.0  # never below what the job already needed
    est.observe("checkpoint", 200.0)
    assert est.lease_s("checkpoint") == 410.0  # one slow save raises the next lease at once
    est.observe("checkpoint", 900.0)
    assert est.lease_s("checkpoint") == 1000.0  # clamped to max_s
    est.observe("eval", 1.0)
    assert est.lease_s("eval") == 30.0  # clamped to min_s
    assert est.keep_alive_s("eval") == 60.0
    with pytest.raises(ValueError, match="not a leased phase"):
        est.observe("train", 1.0)
    with pytest.raises(ValueError, match="factor >= 1"):
        LeasePolicy(factor=0.5)


def test_tick_writes_the_pending_step_and_renews_a_lease_only_within_keep_alive(tmp_path: Path) -> None:
    clock = Clock()
    w = ProgressWriter(JOB, 0, 0, 1, directory=tmp_path, clock=clock, host="n")
    w.phase("train")
    assert not w.step(5)  # same second: pending
    assert not w.tick()  # still within the rate limit
    clock.advance(1.0)
    assert w.tick() and read(w.path)["step"] == 5  # the flusher writes what the trainer could not
    clock.advance(5.0)
    assert not w.tick()  # nothing new and no heartbeat asked
    assert w.tick(heartbeat_s=5.0) and read(w.path)["time"] == T0 + 6  # the heartbeat

    w.phase("checkpoint", lease_s=10.0, keep_alive_s=25.0)
    start = clock()
    clock.advance(4.0)
    assert not w.tick()  # more than half the lease left
    clock.advance(2.0)
    assert w.tick() and read(w.path)["lease_until"] == start + 16.0  # renewed: now + lease
    for _ in range(10):
        clock.advance(3.0)
        w.tick()
    assert read(w.path)["lease_until"] == start + 25.0  # never past keep_alive_s from the start
    assert w.renewals_total >= 2

    w.phase("eval", lease_s=10.0)  # no keep_alive: never renewed
    until = read(w.path)["lease_until"]
    clock.advance(9.0)
    w.tick()
    assert read(w.path)["lease_until"] == until
    with pytest.raises(ValueError, match="shorter than the lease"):
        w.phase("eval", lease_s=10.0, keep_alive_s=5.0)


def test_flusher_thread_writes_while_the_main_thread_blocks_and_stops(tmp_path: Path) -> None:
    w = ProgressWriter(JOB, 0, 0, 1, directory=tmp_path, min_interval_s=0.2)
    w.phase("train")
    w.step(1)
    w.step(2)  # within the rate limit: pending
    flusher = Flusher(w, interval_s=0.2, heartbeat_s=0.5).start()
    try:
        time.sleep(1.5)  # "blocked in a collective"
        data = read(w.path)
        assert data["step"] == 2
        assert time.time() - data["time"] < 1.0  # heartbeats kept it fresh
    finally:
        t = time.monotonic()
        flusher.stop()
        assert time.monotonic() - t < 1.0 and not flusher.running


def test_a_forked_child_never_writes_the_rank_file(tmp_path: Path) -> None:
    w = ProgressWriter(JOB, 0, 0, 1, directory=tmp_path)
    w.phase("train")
    before = w.path.read_bytes()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker, say
        wrote = w.step(99) or w.phase("eval", lease_s=5) or w.flush() or w.tick(heartbeat_s=0.001)
        os._exit(1 if wrote else 0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert w.path.read_bytes() == before


# -------------------------------------------------------------------------------------- plain loop


def test_progress_phases_measure_their_duration_and_return(tmp_path: Path) -> None:
    clock, mono = Clock(), Clock(0.0)
    writer = ProgressWriter(JOB, 0, 0, 2, directory=tmp_path, clock=clock, lease_scope="job", host="n")
    policy = LeasePolicy(factor=2.0, slack_s=10.0, min_s=20.0, first_s={"checkpoint": 300.0})
    p = Progress(writer, policy=policy, flusher=False, monotonic=mono)
    assert read(p.path)["phase"] == "init"
    clock.advance(5.0)
    p.train(2, epoch=0, tokens=200)  # a resume's position goes into the train write itself
    assert (read(p.path)["phase"], read(p.path)["step"]) == ("train", 2)
    clock.advance(1.0)
    p.step(3, epoch=0, tokens=300)
    with p.checkpoint():
        data = read(p.path)
        assert (data["phase"], data["step"], data["lease_scope"]) == ("checkpoint", 3, "job")
        assert data["lease_until"] == clock() + 300.0  # the first save
        mono.advance(40.0)
        with p.eval():  # nested: back to checkpoint afterwards
            mono.advance(1.0)
        assert read(p.path)["phase"] == "checkpoint"
    assert read(p.path)["phase"] == "train"
    assert p.leases.longest_s("checkpoint") == 41.0
    with pytest.raises(RuntimeError), p.checkpoint():
        assert read(p.path)["lease_until"] == clock() + 92.0  # 2 x 41 + 10: measured
        raise RuntimeError("save failed")
    assert read(p.path)["phase"] == "train"  # back even when the block raised
    p.close()
    assert read(p.path)["phase"] == "done"


def test_progress_files_are_read_by_the_daemon_reader(tmp_path: Path) -> None:
    with Progress.from_env(JOB, env={"RANK": "0", "WORLD_SIZE": "1"}, directory=tmp_path) as p:
        p.train()
        p.step(1)
        with p.epoch_end():
            view = ProgressReader(tmp_path).read(time.time())
            job = view.jobs[JOB]
            assert not view.errors
            assert job.phases == {"epoch_end": [0]} and job.lease_scope == "job"
        assert p.flusher.running
    assert not p.flusher.running
    with pytest.raises(RuntimeError), Progress.from_env(JOB, env={}, directory=tmp_path) as p2:
        raise RuntimeError("crash")
    assert read(p2.path)["phase"] != "done"  # a crash is not "done": the vanished pid says it
