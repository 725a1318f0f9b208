"""Issue 28, defect 3: a daemon on the simulated source judges its simulated job and nothing else of
the machine. Real processes: the simulated job (``gpu_triage.demo.simjob``, its own session) and
strangers beside it that carry a rank environment, own progress files in the daemon's directory, or
sit in saved state - another test run's ranks, another user's job. None of them is listed, judged or
continued from state; the kernel (the session, the owner, the start time) is the proof."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from gpu_triage.contract import ProgressWriter
from gpu_triage.daemon.config import load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.daemon.record import DETECTOR_KEY, PROGRESS_KEY
from gpu_triage.demo import simjob
from gpu_triage.telemetry.sim import SimSource
from tests.corpus.live import spawn_rank
from tests.spawned import wait_for_exec

JOB = "qwen3-32b-ft"
STRANGER = "stranger-job"


def _config(tmp_path: Path, progress: Path):
    return override(
        load_config(None, {}),
        {
            "daemon.listen": "127.0.0.1:0",
            "daemon.state_dir": str(tmp_path / "state"),
            "daemon.period_s": 0.2,
            "progress.dir": str(progress),
            "stacks.enabled": False,
        },
        origin="test",
    )


def _start_job(progress: Path, ranks: int = 2) -> subprocess.Popen:
    job = simjob.start(progress, time.time() - 20.0, ranks=ranks, world_size=ranks, interval_s=0.2)
    deadline = time.monotonic() + 60
    while len(list(progress.glob(f"{JOB}/rank-*.json"))) < ranks:
        assert job.poll() is None and time.monotonic() < deadline, "the simulated job did not start"
        time.sleep(0.1)
    return job


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _sim(job: subprocess.Popen | int | None) -> SimSource:
    """The simulated source with its job attached (the attribute: the same test runs on old code)."""
    source = SimSource("reference-b300")
    source.job_session = job if job is None or isinstance(job, int) else job.pid
    return source


def _strangers(progress: Path) -> list[subprocess.Popen]:
    """A rank of another job (own session, rank environment) with its progress file in the daemon's
    directory, and a process that carries the simulated job's own name and rank environment."""
    other = spawn_rank(0, 2, STRANGER)
    ProgressWriter(STRANGER, 0, 0, 2, directory=progress, pid=other.pid).phase("train")
    namesake = spawn_rank(1, 2, JOB)
    return [other, namesake]


def _watch(daemon: Daemon, seconds: float, ranks: int) -> list[dict[str, list[int]]]:
    """Every snapshot's jobs (name: pids) for ``seconds``, at least until the simulated job's ranks
    are all seen."""
    daemon.start()
    loop = threading.Thread(target=daemon.run_forever, daemon=True)
    loop.start()
    seen: list[dict[str, list[int]]] = []
    try:
        end = time.monotonic() + seconds
        hard = time.monotonic() + 90
        while time.monotonic() < hard:
            snap = daemon.snapshots.latest()
            if snap is not None:
                seen.append({j.job: sorted(r.pid for r in j.ranks if r.pid) for j in snap.jobs})
            if time.monotonic() > end and (ranks == 0 or (seen and len(seen[-1].get(JOB, [])) == ranks)):
                break
            time.sleep(0.3)
    finally:
        daemon.stop()
        loop.join(15)
        daemon.close()
    return seen


@pytest.mark.slow
def test_a_simulated_source_judges_its_own_job_and_no_other_process(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    job = _start_job(progress)
    strangers = _strangers(progress)
    try:
        daemon = Daemon(_config(tmp_path, progress), _sim(job), serve_http=False)
        seen = _watch(daemon, 12.0, ranks=2)
        own = {p.pid for p in psutil.Process(job.pid).children()}
    finally:
        _stop(job, *strangers)
    assert seen and seen[-1].get(JOB) and set(seen[-1][JOB]) == own, seen[-1:]
    stranger_pids = {p.pid for p in strangers}
    for jobs in seen:
        assert set(jobs) == {JOB}, jobs  # the stranger's job and the namesake are never listed
        assert not stranger_pids & {pid for pids in jobs.values() for pid in pids}, jobs


@pytest.mark.slow
def test_a_simulated_source_without_its_job_judges_no_process(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    progress.mkdir()
    strangers = _strangers(progress)
    try:
        seen = _watch(Daemon(_config(tmp_path, progress), _sim(None), serve_http=False), 4.0, ranks=0)
    finally:
        _stop(*strangers)
    assert seen and all(jobs == {} for jobs in seen), seen[-1]


def test_a_simulated_job_must_lead_its_session(tmp_path: Path) -> None:
    not_a_leader = os.getpid() if os.getsid(0) != os.getpid() else os.getppid()
    with pytest.raises(ValueError, match="leads no session"):
        Daemon(_config(tmp_path, tmp_path / "p"), _sim(not_a_leader), serve_http=False)


def test_the_session_scope_believes_only_the_kernel(tmp_path: Path) -> None:
    """Session, owner and start time: a process of another session (even with the job's environment),
    one in the session under another uid, and one younger than the leader's last sighting once the
    leader is gone are all outside."""
    from gpu_triage.signals.processes import SessionScope

    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
         "o = subprocess.Popen(['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', "
         "sys.executable, '-c', 'import time; time.sleep(60)'])\n"
         "print(c.pid, o.pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    outsider = spawn_rank(0, 1, JOB)
    try:
        assert leader.stdout is not None
        child, other_uid = (int(x) for x in leader.stdout.readline().split())
        wait_for_exec(outsider)
        deadline = time.monotonic() + 10
        while psutil.Process(other_uid).uids().real != 65534:  # setpriv switches before it execs
            assert time.monotonic() < deadline
            time.sleep(0.01)
        scope = SessionScope.of_leader(leader.pid)
        scope.refresh(time.time())
        assert scope.holds_pid(leader.pid) and scope.holds_pid(child)
        assert not scope.holds_pid(outsider.pid)
        assert not scope.holds_pid(other_uid)
        assert not SessionScope.nothing().holds_pid(child)
        # the leader gone: what was there before stays believed, anything younger is not
        gone = SessionScope(scope.sid, scope.uid, scope.leader_create_time, time.time() - 3600, False)
        assert not gone.holds_pid(child)
        gone.leader_seen_s = time.time()
        assert gone.holds_pid(child)
    finally:
        _stop(leader, outsider)


def test_a_restarted_simulation_continues_only_its_own_job(tmp_path: Path) -> None:
    """The saved state holds the simulated job and a stranger (what a daemon of the old code saved
    after judging the whole machine): a restarted simulated daemon takes back the simulated job's
    step marks and memory and leaves the stranger's behind."""
    from gpu_triage.telemetry.none import NoneSource

    progress = tmp_path / "progress"
    job = _start_job(progress)
    stranger = spawn_rank(0, 2, STRANGER)
    try:
        first = Daemon(_config(tmp_path, progress), NoneSource(), serve_http=False)
        first.start()
        assert first.store is not None
        now = first.clock()
        ranks = [int(p.name.split("-")[1].split(".")[0]) for p in progress.glob(f"{JOB}/rank-*.json")]
        pids = {r: json.loads((progress / JOB / f"rank-{r}.json").read_text())["pid"] for r in ranks}
        mark = {
            "step": 7,
            "since_s": now - 5,
            "phase": "train",
            "phase_since_s": now - 50,
            "previous_phase": None,
        }
        marks = [{"job": JOB, "rank": r, "pid": pid, **mark} for r, pid in pids.items()]
        marks.append({"job": STRANGER, "rank": 0, "pid": stranger.pid, **mark})
        memory = {
            "verdict": "deadlock_suspected",
            "onset": now - 20,
            "raised": now - 10,
            "hang_since": now - 20,
        }
        boot = first.recorder.boot_id
        first.store.kv_set(PROGRESS_KEY, {"boot_id": boot, "saved_at": now, "value": marks}, now)
        first.store.kv_set(
            DETECTOR_KEY, {"boot_id": boot, "saved_at": now, "value": {JOB: memory, STRANGER: memory}}, now
        )
        first.close()
        second = Daemon(_config(tmp_path, progress), _sim(job), serve_http=False)
        second.start()
        try:
            restored = set(second.detector.export())
            restored_marks = {name for name, _rank in second.observer.progress.tracker._restored}
        finally:
            second.close()
    finally:
        _stop(job, stranger)
    assert restored == {JOB}, restored
    assert restored_marks == {JOB}, restored_marks


@pytest.mark.parametrize(
    ("source", "message"),
    [("none", "--sim-job needs a simulated source, not 'none'"), ("sim", "leads no session")],
)
def test_run_refuses_a_sim_job_it_cannot_prove(tmp_path: Path, source: str, message: str) -> None:
    """`gpu-watchdog run --sim-job PID`: exit 2 with the reason, before any cycle, when the source is
    not simulated or PID leads no session (any pid could be named; only a session is proof)."""
    not_a_leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # our session
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpu_triage", "run", "--source", source,
             "--sim-job", str(not_a_leader.pid), "--listen", "127.0.0.1:0",
             "--state-dir", str(tmp_path / "state"), "--progress-dir", str(tmp_path / "progress")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        not_a_leader.kill()
        not_a_leader.wait()
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
