"""Kill targets are proven, not claimed - on real processes.

A progress file is a claim anyone in the training group can write. The daemon believes the process it
names only with proof (a rank environment that agrees with the file, a GPU context, a launcher parent)
and the same owner; everything else is reported as ``untrusted_progress_file`` and never signalled.
Progress files join processes across PID namespaces (a trainer in a container) through ``NSpid``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ft_trainer.progress import ProgressWriter
from gpu_triage.daemon.config import load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.daemon.observe import progress_claims
from gpu_triage.signals.processes import ProcessInspector, judge_claim
from gpu_triage.signals.progress import ProgressReader
from gpu_triage.signals.rank_process import ProgressClaim
from gpu_triage.telemetry.none import NoneSource
from gpu_triage.verdicts.fusion import job_views
from tests.conftest import in_ci
from tests.corpus.live import SLEEP, _clean_env, forged_progress_file, spawn_bystander, spawn_rank


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def reaper() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(p.pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            p.kill()
        p.wait(timeout=10)


def test_forged_progress_file_never_makes_a_bystander_a_kill_target() -> None:
    """The real reader, inspector, fusion, detector and engine (kill mode, dry run) on real processes:
    the deadlocked job's two ranks are planned for SIGTERM; the forged third file's ``setsid sleep``
    is not, and the file is reported."""
    outcome = forged_progress_file()
    assert "deadlock_confirmed" in outcome.verdicts
    assert outcome.targets == sorted(outcome.ranks)
    assert not outcome.bystander_targeted
    assert outcome.reported


@pytest.mark.slow
def test_armed_daemon_kills_the_job_and_spares_the_process_a_forged_file_names(
    tmp_path: Path, reaper: list[subprocess.Popen]
) -> None:
    """Issue 10's must-show through the real daemon loop, armed to kill (no dry run)."""
    job = "victim"
    ranks = [spawn_rank(r, 3, job) for r in range(2)]
    bystander = spawn_bystander()
    reaper.extend([*ranks, bystander])
    progress = tmp_path / "progress"
    host = socket.gethostname()
    writers = [
        ProgressWriter(job, r, r, 3, directory=progress, pid=p.pid, host=host) for r, p in enumerate(ranks)
    ]
    forged = ProgressWriter(job, 2, 2, 3, directory=progress, pid=bystander.pid, host=host)
    for w in (*writers, forged):
        w.phase("train")
    config = override(
        load_config(None, {}),
        {
            "daemon.listen": "127.0.0.1:0",
            "daemon.state_dir": str(tmp_path / "state"),
            "daemon.period_s": 0.5,
            "progress.dir": str(progress),
            "actions.mode": "kill",
            "actions.alert_after_s": 0.0,
            "actions.sigterm_after_s": 1.0,
            "actions.sigkill_grace_s": 2.0,
            "actions.capture_timeout_s": 5.0,
            "detector.fast_min_s": 2.0,
            "detector.disagree_min_s": 2.0,
            "detector.stall_min_s": 2.0,
            "detector.confirm_after_s": 3.0,
        },
        origin="test",
    )
    daemon = Daemon(config, NoneSource(), serve_http=False)
    daemon.start()
    loop = threading.Thread(target=daemon.run_forever, daemon=True)
    loop.start()
    try:
        for step in range(1, 6):
            for w in (*writers, forged):
                w.step(step)
            time.sleep(1.0)
        writers[0].phase("epoch_end", lease_s=120)  # the epoch-end deadlock: rank 1 stays in train
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(_alive(p.pid) for p in ranks):
            time.sleep(0.2)
        snap = daemon.snapshots.latest()
    finally:
        daemon.stop()
        loop.join(10)
        daemon.close()
    assert not any(_alive(p.pid) for p in ranks), "the deadlocked job's ranks were signalled"
    assert _alive(bystander.pid), "the process the forged file names survives"
    assert snap is not None
    untrusted = [u for u in snap.untrusted_progress_files if u.get("pid") == bystander.pid]
    assert untrusted and "no rank environment" in str(untrusted[0]["reason"])


def test_a_claim_is_refuted_by_a_contradicting_environment_or_another_owner(reaper) -> None:
    rank1 = spawn_rank(1, 2, "j")
    reaper.append(rank1)
    inspector = ProcessInspector()
    view = inspector.inspect(time.time(), claims=[ProgressClaim("j", 0, rank1.pid, 0, owner_uid=None)])
    assert [u.pid for u in view.untrusted] == [rank1.pid]
    assert "RANK=1" in view.untrusted[0].reason
    # the right rank, but the file belongs to another user
    view = inspector.inspect(time.time() + 20, claims=[ProgressClaim("j", 1, rank1.pid, 1, owner_uid=4242)])
    assert "uid" in view.untrusted[0].reason
    # the right rank and owner: joined, with the progress file among its proofs
    view = inspector.inspect(
        time.time() + 40, claims=[ProgressClaim("j", 1, rank1.pid, 1, owner_uid=os.getuid())]
    )
    assert view.untrusted == ()
    [r] = view.jobs["j"]
    assert r.pid == rank1.pid and "progress_file" in r.proof and "rank_env" in r.proof


def test_judge_claim_needs_positive_proof() -> None:
    from gpu_triage.signals.processes import Candidate

    bare = Candidate(1234, 1, "j", None, None, None, None, (), "environ", proof=(), uid=1000)
    assert "no rank environment" in str(judge_claim(ProgressClaim("j", 0, 1234), bare, None))
    gpu = Candidate(1234, 1, "j", None, None, None, 0, (0,), "nvml", proof=("gpu_context",), uid=1000)
    assert judge_claim(ProgressClaim("j", 0, 1234, owner_uid=1000), gpu, None) is None
    assert judge_claim(ProgressClaim("j", 0, 1234, owner_uid=0), gpu, None) is None  # root's file
    assert "uid 1000" in str(judge_claim(ProgressClaim("j", 0, 1234, owner_uid=1001), gpu, None))


def test_a_file_owned_by_another_user_than_its_job_directory_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create files owned by another user")
    writer = ProgressWriter("j", 0, 0, 2, directory=tmp_path, pid=os.getpid())
    writer.phase("train")
    other = ProgressWriter("j", 1, 1, 2, directory=tmp_path, pid=os.getpid())
    other.phase("train")
    os.chown(other.path, 4242, 4242)
    view = ProgressReader(tmp_path).read(time.time())
    assert list(view.jobs["j"].ranks) == [0]
    [u] = view.untrusted
    assert u.rank == 1 and "uid 4242" in u.reason


def test_a_job_known_only_from_progress_files_is_never_put_on_another_jobs_gpus(
    tmp_path: Path, reaper: list[subprocess.Popen]
) -> None:
    """Job A holds GPUs 0-3 (NVML lists its pids); job B's ranks have LOCAL_RANK 0-3 but no
    CUDA_VISIBLE_DEVICES and NVML does not list them: B is unmapped, not on A's GPUs."""
    a = [spawn_rank(r, 4, "job-a") for r in range(4)]
    b = [spawn_rank(r, 4, "job-b") for r in range(4)]
    reaper.extend(a + b)
    for r, p in enumerate(b):
        ProgressWriter("job-b", r, r, 4, directory=tmp_path, pid=p.pid).phase("train")
    now = time.time()
    view = ProgressReader(tmp_path).read(now)
    pview = ProcessInspector().inspect(
        now,
        gpu_pids={g: [p.pid] for g, p in enumerate(a)},
        claims=progress_claims(view, socket.gethostname()),
    )
    jobs = {j.job: j for j in job_views(view.jobs, pview.jobs)}
    assert sorted(r.gpu for r in jobs["job-a"].ranks) == [0, 1, 2, 3]
    assert [r.gpu for r in jobs["job-b"].ranks] == [None] * 4
    assert all(r.proven for r in jobs["job-b"].ranks)


def _unshare() -> str:
    path = shutil.which("unshare")
    if path is None or os.geteuid() != 0:
        if in_ci():
            pytest.fail("unshare (util-linux) and root are expected in CI")
        pytest.skip("needs root and unshare to make a PID namespace")
    return path


def test_a_trainer_in_its_own_pid_namespace_is_one_job_not_two(
    tmp_path: Path, reaper: list[subprocess.Popen]
) -> None:
    """The rank runs in a new PID namespace (as in a container) and writes its own pid (1) and its
    container's host name; the daemon joins the file to the process through NSpid."""
    unshare = _unshare()
    env = _clean_env() | {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    proc = subprocess.Popen(
        [unshare, "--pid", "--fork", "--mount-proc", *SLEEP], env=env, start_new_session=True
    )
    reaper.append(proc)
    inner_host = "container-7f3a"
    ProgressWriter("ft", 0, 0, 1, directory=tmp_path, pid=1, host=inner_host).phase("train")
    deadline = time.monotonic() + 10
    sleeper = None
    import psutil

    while sleeper is None and time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children()
        sleeper = kids[0].pid if kids else None
        time.sleep(0.05)
    assert sleeper is not None
    now = time.time()
    view = ProgressReader(tmp_path, host=socket.gethostname()).read(now)
    inspector = ProcessInspector(always_scan_environ=True)
    pview = inspector.inspect(now, claims=progress_claims(view, socket.gethostname()))
    jobs = job_views(view.jobs, pview.jobs)
    mine = [j for j in jobs if any(r.pid == sleeper for r in j.ranks)]
    assert [j.job for j in mine] == ["ft"], [(j.job, [r.pid for r in j.ranks]) for j in jobs]
    [rank] = mine[0].ranks
    assert rank.proven and rank.step == 0 and rank.phase == "train"
