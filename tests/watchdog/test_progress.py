"""The progress contract end to end: files written by the trainer's own writer, read by the daemon's
reader, on an injected clock."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ft_trainer.progress import FIELDS as WRITER_FIELDS
from ft_trainer.progress import PHASES as WRITER_PHASES
from ft_trainer.progress import ProgressWriter, progress_dir
from gpu_triage.signals.progress import (
    FIELDS,
    PHASES,
    ProgressFormatError,
    ProgressReader,
    StepTracker,
    lease_state,
    parse_record,
    stale_reason,
)
from gpu_triage.signals.progress_records import LeaseState, StaleReason
from tests.conftest import REPO

T0 = 1_764_681_234.5
HOST = "node-a"
JOB = "qwen3-32b-ft"


class Clock:
    def __init__(self, now_s: float = T0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def writer(
    tmp_path: Path, clock: Clock, rank: int = 0, world_size: int = 2, pid: int = 4242
) -> ProgressWriter:
    return ProgressWriter(JOB, rank, rank, world_size, directory=tmp_path, clock=clock, pid=pid, host=HOST)


def reader(tmp_path: Path, alive: set[int] | None = None, **kw: object) -> ProgressReader:
    live = {4242, 4243} if alive is None else alive
    return ProgressReader(tmp_path, pid_exists=live.__contains__, host=HOST, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------- writer


def test_file_has_exactly_the_contract_fields(tmp_path: Path, clock: Clock) -> None:
    w = writer(tmp_path, clock, rank=1, world_size=16)
    w.phase("train")
    w.step(1200, epoch=1, tokens=157286400)
    data = json.loads((tmp_path / JOB / "rank-1.json").read_text())
    assert list(data) == [*FIELDS, "step_time", "phase_time"]
    assert data == {
        "job": JOB,
        "rank": 1,
        "local_rank": 1,
        "world_size": 16,
        "pid": 4242,
        "host": HOST,
        "step": 0,  # the phase write; the step came within the same second
        "epoch": 0,
        "tokens": 0,
        "phase": "train",
        "lease_until": None,
        "time": T0,
        "step_time": T0,
        "phase_time": T0,
    }
    clock.advance(1.0)
    assert w.step(1201, epoch=1, tokens=157417472)
    data = json.loads((tmp_path / JOB / "rank-1.json").read_text())
    assert (data["step"], data["epoch"], data["tokens"], data["time"]) == (1201, 1, 157417472, T0 + 1)
    assert (data["step_time"], data["phase_time"]) == (T0 + 1, T0)


def test_step_time_is_when_the_step_changed_not_when_a_flusher_rewrote_it(
    tmp_path: Path, clock: Clock
) -> None:
    """A flusher's heartbeat rewrites ``time`` every 30 s while a rank is blocked; ``step_time`` keeps
    the moment the step changed, so a reader that starts in the middle of a hang dates it right."""
    w = writer(tmp_path, clock)
    w.phase("train")
    clock.advance(2.0)
    w.step(7)
    for _ in range(4):
        clock.advance(30.0)
        assert w.tick(heartbeat_s=30.0)
    data = json.loads((tmp_path / JOB / "rank-0.json").read_text())
    assert data["time"] == T0 + 122 and data["step_time"] == T0 + 2
    fresh = reader(tmp_path)  # a reader started now (a restarted daemon) sees the step frozen since T0 + 2
    job = fresh.read(T0 + 122).jobs[JOB]
    assert job.ranks[0].step_since_s == T0 + 2
    assert job.ranks[0].step_frozen_s(T0 + 122) == 120


def test_writer_and_reader_agree_on_the_vocabulary() -> None:
    # the same objects, from gpu_triage.contract: there is one vocabulary, not two copies
    assert WRITER_FIELDS is FIELDS
    assert WRITER_PHASES is PHASES


def test_steps_are_written_at_most_once_a_second_phases_always(tmp_path: Path, clock: Clock) -> None:
    w = writer(tmp_path, clock)
    assert w.phase("train")
    written = []
    for step in range(1, 41):  # 40 steps at 4 steps per second
        clock.advance(0.25)
        written.append(w.step(step))
    assert sum(written) == 10
    assert w.phase("checkpoint", lease_s=120)  # within the same second: still written
    assert w.phase("checkpoint", lease_s=120)  # a renewal is written too
    assert w.writes_total == 13
    assert json.loads(w.path.read_text())["lease_until"] == T0 + 10 + 120


def test_flush_writes_a_pending_step(tmp_path: Path, clock: Clock) -> None:
    w = writer(tmp_path, clock)
    w.phase("train")
    clock.advance(0.1)
    assert not w.step(7)
    assert json.loads(w.path.read_text())["step"] == 0
    assert w.flush()
    assert json.loads(w.path.read_text())["step"] == 7
    assert not w.flush()  # nothing new


def test_phase_rules_are_enforced(tmp_path: Path, clock: Clock) -> None:
    w = writer(tmp_path, clock)
    with pytest.raises(ValueError, match="needs lease_s"):
        w.phase("checkpoint")
    with pytest.raises(ValueError, match="no lease"):
        w.phase("train", lease_s=10)
    with pytest.raises(ValueError, match="unknown phase"):
        w.phase("saving", lease_s=10)
    with pytest.raises(ValueError, match="job name"):
        ProgressWriter("../etc", 0, 0, 1, directory=tmp_path)


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path: Path, clock: Clock) -> None:
    w = writer(tmp_path, clock)
    for step in range(20):
        clock.advance(1)
        w.step(step)
    assert sorted(p.name for p in (tmp_path / JOB).iterdir()) == ["rank-0.json"]


def test_unwritable_directory_logs_once_and_carries_on(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the directory should be")
    w = ProgressWriter(JOB, 0, 0, 1, directory=blocker / "progress", clock=clock)
    with caplog.at_level(logging.WARNING, logger="ft_trainer.progress"):
        assert not w.phase("train")
        for step in range(5):
            clock.advance(1)
            assert not w.step(step)
        assert not w.phase("checkpoint", lease_s=60)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert w.failures_total == 7
    # The directory appears later: writing resumes.
    blocker.unlink()
    clock.advance(1)
    assert w.step(99)
    assert json.loads(w.path.read_text())["step"] == 99


def test_missing_directory_is_created(tmp_path: Path, clock: Clock) -> None:
    w = ProgressWriter(JOB, 0, 0, 1, directory=tmp_path / "run" / "progress", clock=clock)
    assert w.phase("init", lease_s=600)
    assert w.path == tmp_path / "run" / "progress" / JOB / "rank-0.json"


def test_from_env_reads_the_launcher_variables(tmp_path: Path, clock: Clock) -> None:
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GPU_WATCHDOG_PROGRESS_DIR": str(tmp_path)}
    w = ProgressWriter.from_env(JOB, env=env, clock=clock)
    assert (w.record["rank"], w.record["local_rank"], w.record["world_size"]) == (5, 1, 8)
    assert w.path == tmp_path / JOB / "rank-5.json"
    assert w.record["pid"] == os.getpid()
    assert progress_dir({}) == Path("/run/gpu-watchdog/progress")


def test_trainer_progress_is_the_contract_writer() -> None:
    """One contract, not two copies: the trainer's writer is the contract module's, and importing it
    loads none of the daemon's modules (tests/watchdog/test_contract.py hides the daemon's packages)."""
    import gpu_triage.contract as contract

    assert ProgressWriter is contract.ProgressWriter
    code = (
        "import sys, ft_trainer.progress; print(sorted(m for m in sys.modules if m.startswith('gpu_triage')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "['gpu_triage', 'gpu_triage.contract']"


# ----------------------------------------------------------------------------------------- pure


def record_json(**over: object) -> str:
    base = {
        "job": JOB,
        "rank": 0,
        "local_rank": 0,
        "world_size": 2,
        "pid": 4242,
        "host": HOST,
        "step": 10,
        "epoch": 0,
        "tokens": 100,
        "phase": "train",
        "lease_until": None,
        "time": T0,
    }
    base.update(over)
    return json.dumps(base)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"step": -1}, "step: expected an integer >= 0"),
        ({"step": "10"}, "step: expected an integer"),
        ({"rank": 2}, "rank: expected below world_size 2"),
        ({"phase": "saving"}, "phase: expected one of"),
        ({"phase": "checkpoint"}, "lease_until: the checkpoint phase needs a lease"),
        ({"time": "now"}, "time: expected epoch seconds"),
        ({"pid": True}, "pid: expected an integer"),
    ],
)
def test_parse_record_names_the_bad_field(change: dict[str, object], message: str) -> None:
    with pytest.raises(ProgressFormatError, match=message):
        parse_record(record_json(**change))


def test_parse_record_rejects_non_objects_and_missing_fields() -> None:
    with pytest.raises(ProgressFormatError, match="not JSON"):
        parse_record('{"job": ')
    with pytest.raises(ProgressFormatError, match="missing field"):
        parse_record('{"job": "x"}')


def test_lease_and_staleness() -> None:
    train = parse_record(record_json())
    ckpt = parse_record(record_json(phase="checkpoint", lease_until=T0 + 100))
    assert lease_state(train, T0) is LeaseState.NONE
    assert lease_state(ckpt, T0 + 100) is LeaseState.LIVE
    assert lease_state(ckpt, T0 + 100.1) is LeaseState.EXPIRED
    assert stale_reason(train, T0, pid_alive=False) is StaleReason.PID_GONE
    assert stale_reason(train, T0 + 600, pid_alive=True) is None
    assert stale_reason(train, T0 + 601, pid_alive=True) is StaleReason.SILENT
    assert stale_reason(train, T0 + 601, pid_alive=None) is StaleReason.SILENT
    long_lease = parse_record(record_json(phase="checkpoint", lease_until=T0 + 3600))
    assert stale_reason(long_lease, T0 + 1800, pid_alive=True) is None  # a live lease keeps it fresh
    assert stale_reason(long_lease, T0 + 3601, pid_alive=True) is StaleReason.SILENT


def test_step_tracker() -> None:
    tracker = StepTracker()
    assert tracker.observe(parse_record(record_json(step=10, time=T0))).since_s == T0
    assert tracker.observe(parse_record(record_json(step=10, time=T0 + 5))).since_s == T0  # unchanged
    assert tracker.observe(parse_record(record_json(step=11, time=T0 + 6))).since_s == T0 + 6
    assert tracker.observe(parse_record(record_json(step=3, time=T0 + 9))).since_s == T0 + 9  # restart
    tracker.forget([])
    assert tracker.get(JOB, 0) is None


# --------------------------------------------------------------------------------------- reader


def test_reader_sees_ranks_steps_and_frozen_since(tmp_path: Path, clock: Clock) -> None:
    r0, r1 = writer(tmp_path, clock, 0, pid=4242), writer(tmp_path, clock, 1, pid=4243)
    rd = reader(tmp_path)
    for w in (r0, r1):
        w.phase("train")
    for step in range(1, 6):
        clock.advance(1)
        r0.step(step)
        r1.step(step)
        rd.read(clock())
    # Rank 1 stops advancing at step 5 (t0+5); rank 0 goes on.
    for step in range(6, 31):
        clock.advance(1)
        r0.step(step)
        view = rd.read(clock())
    job = view.jobs[JOB]
    assert sorted(job.ranks) == [0, 1]
    assert job.ranks[0].step == 30 and job.ranks[0].step_since_s == T0 + 30
    assert job.ranks[1].step == 5 and job.ranks[1].step_since_s == T0 + 5
    assert job.ranks[1].step_frozen_s(clock()) == 25
    assert job.ranks[1].lease is LeaseState.NONE
    assert job.pids() == {0: 4242, 1: 4243}
    assert job.phases == {"train": [0, 1]}
    assert job.world_size == 2
    assert job.steps_frozen_since_s() == T0 + 30


def test_phase_disagreement_is_visible(tmp_path: Path, clock: Clock) -> None:
    r0, r1 = writer(tmp_path, clock, 0, pid=4242), writer(tmp_path, clock, 1, pid=4243)
    r0.phase("train")
    r1.phase("train")
    clock.advance(1)
    r0.phase("epoch_end", lease_s=30)
    clock.advance(60)
    job = reader(tmp_path).read(clock()).jobs[JOB]
    assert job.phases == {"epoch_end": [0], "train": [1]}
    assert job.ranks[0].lease is LeaseState.EXPIRED
    assert job.ranks[0].lease_until == T0 + 31


def test_files_are_reread_only_when_they_change(tmp_path: Path, clock: Clock) -> None:
    w = writer(tmp_path, clock)
    w.phase("train")
    rd = reader(tmp_path)
    rd.read(clock())
    for _ in range(10):
        rd.read(clock())
    assert rd.reads_total == 1
    clock.advance(1)
    w.step(1)
    assert rd.read(clock()).jobs[JOB].ranks[0].step == 1
    assert rd.reads_total == 2


def test_stale_files_are_ignored_but_listed(tmp_path: Path, clock: Clock) -> None:
    dead = writer(tmp_path, clock, 0, pid=999_999)
    dead.phase("train")
    silent = writer(tmp_path, clock, 1, pid=4243)
    silent.phase("train")
    view = reader(tmp_path).read(clock())
    job = view.jobs[JOB]
    assert list(job.ranks) == [1]
    assert job.stale[0].stale is StaleReason.PID_GONE
    clock.advance(601)
    job = reader(tmp_path).read(clock()).jobs[JOB]
    assert job.ranks == {}
    assert job.stale[1].stale is StaleReason.SILENT


def test_other_hosts_pids_are_not_checked(tmp_path: Path, clock: Clock) -> None:
    w = ProgressWriter(JOB, 0, 0, 1, directory=tmp_path, clock=clock, pid=999_999, host="node-b")
    w.phase("train")
    assert list(reader(tmp_path).read(clock()).jobs[JOB].ranks) == [0]


def test_bad_files_are_error_entries_not_exceptions(tmp_path: Path, clock: Clock) -> None:
    writer(tmp_path, clock, 0).phase("train")
    job_dir = tmp_path / JOB
    (job_dir / "rank-1.json").write_text('{"job": ')
    (job_dir / "rank-7.json").write_text(record_json(rank=1))  # the path says 7
    (job_dir / "rank-3.json").symlink_to("/etc/hostname")
    (job_dir / "rank-4.json").write_bytes(b" " * 70_000)
    (job_dir / ".rank-0.json.4242.tmp").write_text("partial")  # a writer's temp file: not ours to read
    (job_dir / "notes.txt").write_text("ignored")
    view = reader(tmp_path).read(clock())
    assert list(view.jobs[JOB].ranks) == [0]
    errors = {e.path.name: e.error for e in view.errors}
    assert set(errors) == {"rank-1.json", "rank-3.json", "rank-4.json", "rank-7.json"}
    assert errors["rank-1.json"].startswith("not JSON")
    assert "symlink" in errors["rank-3.json"]
    assert "more than" in errors["rank-4.json"]
    assert "not its path's" in errors["rank-7.json"]


def test_missing_directory_is_an_empty_view(tmp_path: Path, clock: Clock) -> None:
    view = reader(tmp_path / "absent").read(clock())
    assert view.jobs == {} and view.errors == () and not view.directory_present


def test_a_deleted_file_drops_its_rank(tmp_path: Path, clock: Clock) -> None:
    w = writer(tmp_path, clock)
    w.phase("train")
    rd = reader(tmp_path)
    assert JOB in rd.read(clock()).jobs
    w.path.unlink()
    assert rd.read(clock()).jobs == {}
    assert rd.tracker.get(JOB, 0) is None


def test_real_pid_check_uses_psutil(tmp_path: Path, clock: Clock) -> None:
    w = ProgressWriter(JOB, 0, 0, 1, directory=tmp_path, clock=clock)  # this process's pid and host
    w.phase("train")
    assert list(ProgressReader(tmp_path).read(clock()).jobs[JOB].ranks) == [0]


def _old_writer_file(tmp_path: Path, step: int, time_s: float, pid: int = 4242) -> None:
    """A record as an older writer (no step_time) and its 30 s heartbeat write it."""
    (tmp_path / JOB).mkdir(exist_ok=True)
    record = {
        "job": JOB, "rank": 0, "local_rank": 0, "world_size": 2, "pid": pid, "host": HOST,
        "step": step, "epoch": 0, "tokens": 0, "phase": "train", "lease_until": None, "time": time_s,
    }  # fmt: skip
    (tmp_path / JOB / "rank-0.json").write_text(json.dumps(record))


def test_a_restarted_reader_keeps_the_step_time_an_earlier_one_saw(tmp_path: Path) -> None:
    """Without step_time (an older writer) only what the previous daemon saw can date the frozen step:
    its marks, restored, apply to the same pid at the same step, and never to a new process."""
    _old_writer_file(tmp_path, 7, T0)
    first = reader(tmp_path)
    assert first.read(T0 + 1).jobs[JOB].ranks[0].step_since_s == T0
    saved = json.loads(json.dumps(first.tracker.export()))
    _old_writer_file(tmp_path, 7, T0 + 90)  # the heartbeat rewrote `time` while the rank hung
    second = reader(tmp_path)
    assert second.tracker.restore(saved) == 1
    assert second.read(T0 + 91).jobs[JOB].ranks[0].step_since_s == T0
    third = reader(tmp_path, alive={4343})
    third.tracker.restore(saved)
    _old_writer_file(tmp_path, 7, T0 + 95, pid=4343)  # same job name, a new run: not the same rank
    assert third.read(T0 + 96).jobs[JOB].ranks[0].step_since_s == T0 + 95
    assert reader(tmp_path).tracker.restore([{"job": JOB}, "junk", None]) == 0


def test_times_from_files_are_placed_on_the_timeline_once(tmp_path: Path, clock: Clock) -> None:
    """The wall clock jumps 10 min between two writes of the same lease: the lease keeps its first
    placement on the daemon's timeline (its remaining time does not move)."""
    w = writer(tmp_path, clock)
    w.phase("checkpoint", lease_s=120.0)
    r = reader(tmp_path)
    now = 5000.0  # the daemon's timeline: any origin
    lease = r.read(now, wall_s=clock()).jobs[JOB].ranks[0].record.lease_until
    assert lease == pytest.approx(now + 120.0)
    clock.advance(630.0)  # 30 s later, and the wall clock stepped +600 s
    w.tick(heartbeat_s=1.0)  # rewritten with the same lease_until
    again = r.read(now + 30.0, wall_s=clock()).jobs[JOB].ranks[0]
    assert again.record.lease_until == pytest.approx(now + 120.0)
    assert again.record.time == pytest.approx(now + 30.0)
