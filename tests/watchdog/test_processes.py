"""The process inspector on real processes: sleepers with rank environments, a writer, a busy one,
one that exits between reads, a data-loader worker, a launcher tree, and an unprivileged inspector."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.signals.processes import ProcessInspector
from gpu_triage.signals.ranks import (
    Candidate,
    choose_gpu,
    gpu_for_local_rank,
    is_launcher,
    job_key,
    local_rank_from_cmdline,
    pick_ranks,
    rank_env,
)
from tests.spawned import wait_for_exec

T0 = 1_764_681_000.0
SLEEP = f"import time; time.sleep({120})"

Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def job() -> str:
    """A job name no other test (or engineer) on this machine uses."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start real processes; every one (and its process group) is killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], env: dict[str, str] | None = None, **kw: object) -> subprocess.Popen[bytes]:
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})}
        p = subprocess.Popen(argv, env=full_env, start_new_session=True, **kw)  # type: ignore[call-overload]
        procs.append(p)
        return wait_for_exec(p)

    yield start
    for p in procs:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


def rank_environ(job: str, rank: int, world_size: int = 2, cvd: str | None = "4,5,6,7") -> dict[str, str]:
    env = {
        "GPU_WATCHDOG_JOB": job,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    return env


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def env_visible(pid: int, key: str) -> bool:
    """Wait helper: a freshly spawned Python has exec'd once its environ shows the variable."""
    try:
        return key in psutil.Process(pid).environ()
    except psutil.Error:
        return False


# ----------------------------------------------------------------------------------------- pure


def test_rank_env_and_job_key() -> None:
    env = rank_environ("j", 3, world_size=16)
    r = rank_env(env)
    assert r is not None and (r.rank, r.local_rank, r.world_size, r.job) == (3, 3, 16, "j")
    assert rank_env({"PATH": "/bin"}) is None
    assert job_key({"SLURM_JOB_ID": "991"}) == "slurm-991"
    assert job_key({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}) == (
        "master-n1:29500"
    )
    assert job_key({"TORCHELASTIC_RUN_ID": "abc"}) == "torchelastic-abc"
    assert job_key({}) is None


def test_gpu_for_local_rank() -> None:
    assert gpu_for_local_rank(1, "4,5,6,7") == 5
    assert gpu_for_local_rank(2, None) == 2
    assert gpu_for_local_rank(3, "6") == 6  # one device per rank: its only entry
    assert gpu_for_local_rank(5, "0,1") is None
    assert gpu_for_local_rank(None, "0,1") is None
    uuids = {"GPU-aaaa-1111": 0, "GPU-bbbb-2222": 1}
    assert gpu_for_local_rank(1, "GPU-aaaa-1111,GPU-bbbb-2222", uuids) == 1
    assert gpu_for_local_rank(0, "GPU-bbbb", uuids) == 1  # a UUID prefix, as CUDA accepts
    assert gpu_for_local_rank(0, "GPU-cccc", uuids) is None


def test_cmdline_rules() -> None:
    assert local_rank_from_cmdline(["python", "-u", "train.py", "--local_rank=3"]) == 3
    assert local_rank_from_cmdline(["python", "train.py", "--local-rank", "2"]) == 2
    assert local_rank_from_cmdline(["python", "train.py"]) is None
    assert is_launcher(["/usr/bin/python3", "/opt/venv/bin/torchrun", "--nproc-per-node=8", "train.py"])
    assert is_launcher(["torchrun", "train.py"])
    assert is_launcher(["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=..."])
    assert not is_launcher(["python", "/opt/venv/bin/deepspeed", "train.py"])  # the runner, not the launcher
    assert not is_launcher(["python", "train.py", "torchrun"])


def test_pick_ranks_drops_loader_workers_and_choose_gpu() -> None:
    def cand(pid: int, ppid: int, rank: int) -> Candidate:
        return Candidate(pid, ppid, "j", rank, rank, 2, None, (), "environ")

    assert [
        c.pid for c in pick_ranks([cand(10, 1, 0), cand(11, 10, 0), cand(12, 1, 1), cand(13, 12, 0)])
    ] == [
        10,
        12,
        13,  # a child with a different rank is not a worker of its parent
    ]
    assert choose_gpu([0, 3], 3) == 3  # a stray context on GPU 0 does not move rank 3
    assert choose_gpu([2], None) == 2
    assert choose_gpu([0, 3], None) is None
    assert choose_gpu([], 5) == 5


# ------------------------------------------------------------------------------------------ real


def test_finds_ranks_by_environment(spawn: Spawn, job: str) -> None:
    procs = [spawn([sys.executable, "-c", SLEEP], rank_environ(job, r)) for r in (0, 1)]
    for p in procs:
        wait_for(lambda p=p: env_visible(p.pid, "GPU_WATCHDOG_JOB"))
    view = ProcessInspector().inspect(T0)
    ranks = view.jobs[job]
    assert [(r.rank, r.pid, r.gpu, r.found_by, r.alive) for r in ranks] == [
        (0, procs[0].pid, 4, "environ", True),
        (1, procs[1].pid, 5, "environ", True),
    ]
    for r, p in zip(ranks, procs, strict=True):
        assert r.status in ("sleeping", "running")
        assert r.pgid == p.pid  # start_new_session: each leads its own group
        assert r.world_size == 2 and r.cpu_time_delta_s is None  # no delta on a first read
    assert view.discovered


def test_nvml_pids_and_progress_files_take_precedence(spawn: Spawn, job: str) -> None:
    procs = [spawn([sys.executable, "-c", SLEEP], rank_environ(job, r)) for r in (0, 1)]
    for p in procs:
        wait_for(lambda p=p: env_visible(p.pid, "RANK"))
    inspector = ProcessInspector()
    view = inspector.inspect(
        T0,
        gpu_pids={0: [procs[0].pid, procs[1].pid], 5: [procs[1].pid], 2: [procs[0].pid]},
        progress_pids={"qwen-ft": {0: procs[0].pid}},
    )
    # The progress file names the job for the whole group; NVML places each rank; the stray contexts
    # every rank holds on GPU 0 do not move rank 1 off GPU 5 (its LOCAL_RANK says 5 too).
    assert job not in view.jobs
    r0, r1 = view.jobs["qwen-ft"]
    assert (r0.rank, r0.found_by, r0.gpus) == (0, "progress", (0, 2))
    assert r0.gpu is None  # NVML says 0 and 2, LOCAL_RANK says 4: undecidable, not guessed
    assert (r1.rank, r1.found_by, r1.gpu, r1.gpus) == (1, "nvml", 5, (0, 5))


def test_deltas_of_cpu_and_io_between_two_reads(spawn: Spawn, job: str, tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "out = open(sys.argv[1], 'wb', buffering=0)\n"
        "for line in sys.stdin:\n"
        "    if line.startswith('write'):\n"
        "        out.write(b'x' * (4 << 20)); os.fsync(out.fileno())\n"
        "    else:\n"
        "        n = 0\n"
        "        while n < 3_000_000: n += 1\n"
        "    print('done', flush=True)\n"
    )
    p = spawn(
        [sys.executable, "-c", code, str(tmp_path / "ckpt.bin")],
        rank_environ(job, 0, 1),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert p.stdin is not None and p.stdout is not None
    wait_for(lambda: env_visible(p.pid, "RANK"))
    inspector = ProcessInspector()
    inspector.inspect(T0)

    p.stdin.write(b"write\n")
    p.stdin.flush()
    assert p.stdout.readline() == b"done\n"
    [r] = inspector.inspect(T0 + 1).jobs[job]
    assert r.interval_s == 1.0
    assert r.write_chars_delta is not None and r.write_chars_delta >= 4 << 20
    assert r.write_bytes_delta is not None  # readable here (same user); may be 0 on some file systems

    p.stdin.write(b"spin\n")
    p.stdin.flush()
    assert p.stdout.readline() == b"done\n"
    [r] = inspector.inspect(T0 + 2).jobs[job]
    assert r.cpu_time_delta_s is not None and r.cpu_time_delta_s > 0.01
    assert r.write_chars_delta is not None and r.write_chars_delta < 4 << 20


def test_a_process_that_exits_between_reads_is_not_alive_then_forgotten(spawn: Spawn, job: str) -> None:
    keep = spawn([sys.executable, "-c", SLEEP], rank_environ(job, 0))
    leave = spawn([sys.executable, "-c", SLEEP], rank_environ(job, 1))
    for p in (keep, leave):
        wait_for(lambda p=p: env_visible(p.pid, "RANK"))
    inspector = ProcessInspector(discovery_interval_s=10.0, forget_after_s=30.0)
    assert [r.alive for r in inspector.inspect(T0).jobs[job]] == [True, True]
    leave.kill()
    leave.wait()
    r0, r1 = inspector.inspect(T0 + 1).jobs[job]
    assert (r0.alive, r1.alive, r1.status, r1.gone_since_s) == (True, False, None, T0 + 1)
    r0, r1 = inspector.inspect(T0 + 12).jobs[job]  # a discovery ran: the dead rank is still shown
    assert not r1.alive and r1.rank == 1
    assert [r.rank for r in inspector.inspect(T0 + 31).jobs[job]] == [0]


def test_a_zombie_is_not_alive(spawn: Spawn, job: str) -> None:
    p = spawn([sys.executable, "-c", SLEEP], rank_environ(job, 0, 1))
    wait_for(lambda: env_visible(p.pid, "RANK"))
    inspector = ProcessInspector()
    inspector.inspect(T0)
    os.kill(p.pid, signal.SIGKILL)  # not reaped yet: a zombie
    wait_for(lambda: psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE)
    [r] = inspector.inspect(T0 + 1).jobs[job]
    assert not r.alive and r.status == "zombie"


def test_loader_workers_are_not_ranks(spawn: Spawn, job: str) -> None:
    code = (
        "import subprocess, sys, time\n"
        f"w = subprocess.Popen([sys.executable, '-c', {SLEEP!r}])\n"
        "print(w.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    p = spawn([sys.executable, "-c", code], rank_environ(job, 0, 1), stdout=subprocess.PIPE)
    assert p.stdout is not None
    worker = int(p.stdout.readline())
    wait_for(lambda: env_visible(worker, "RANK"))
    [r] = ProcessInspector().inspect(T0).jobs[job]
    assert r.pid == p.pid


def write_launcher(tmp_path: Path, ranks: int, with_env: bool) -> Path:
    """A real launcher named ``torchrun`` starting ranks with ``--local_rank=N`` like deepspeed does."""
    script = tmp_path / "torchrun"
    script.write_text(
        "import os, subprocess, sys, time\n"
        "kids = []\n"
        f"for i in range({ranks}):\n"
        f"    env = dict(os.environ, RANK=str(i), LOCAL_RANK=str(i)) if {with_env} else dict(os.environ)\n"
        f"    argv = [sys.executable, '-c', {SLEEP!r}, f'--local_rank={{i}}']\n"
        "    kids.append(subprocess.Popen(argv, env=env))\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "time.sleep(120)\n"
    )
    return script


def test_launcher_children_are_ranks(spawn: Spawn, tmp_path: Path) -> None:
    launcher = spawn([sys.executable, str(write_launcher(tmp_path, 2, False))], {}, stdout=subprocess.PIPE)
    assert launcher.stdout is not None
    kids = [int(x) for x in launcher.stdout.readline().split()]
    wait_for(lambda: all(local_rank_from_cmdline(psutil.Process(k).cmdline()) is not None for k in kids))
    view = ProcessInspector().inspect(T0)
    ranks = view.jobs[f"launcher-{launcher.pid}"]
    assert [(r.pid, r.local_rank, r.found_by, r.pgid) for r in ranks] == [
        (kids[0], 0, "launcher", launcher.pid),
        (kids[1], 1, "launcher", launcher.pid),
    ]


def test_steady_state_is_cheap_and_caches_process_objects(spawn: Spawn, job: str) -> None:
    """16 ranks (twice a B300 node), measured at 1 Hz: no rediscovery, no new Process objects."""
    procs = [spawn(["sleep", "120"], rank_environ(job, r, 16, cvd=None)) for r in range(16)]
    for p in procs:
        wait_for(lambda p=p: env_visible(p.pid, "RANK"))
    inspector = ProcessInspector(discovery_interval_s=3600)
    assert len(inspector.inspect(T0).jobs[job]) == 16
    created = inspector.processes_created_total
    for i in range(1, 21):
        view = inspector.inspect(T0 + i)
    assert [r.gpu for r in view.jobs[job]] == list(range(16))
    assert all(r.cpu_time_delta_s is not None for r in view.jobs[job])
    assert inspector.processes_created_total == created and inspector.discoveries_total == 1
    # its CPU cost at 1 Hz is a budget measured by `make bench` (benchmarks/bench_daemon.py)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start an unprivileged inspector")
def test_unprivileged_inspector_counts_denied_environments(spawn: Spawn, tmp_path: Path, job: str) -> None:
    """Without CAP_SYS_PTRACE another user's environment is unreadable: the launcher tree still finds
    the ranks, and nothing raises."""
    launcher = spawn([sys.executable, str(write_launcher(tmp_path, 2, True))], {}, stdout=subprocess.PIPE)
    assert launcher.stdout is not None
    kids = [int(x) for x in launcher.stdout.readline().split()]
    wait_for(lambda: all(env_visible(k, "RANK") for k in kids))
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            view = ProcessInspector().inspect(T0)
            ranks = view.jobs.get(f"launcher-{launcher.pid}", ())
            out = {"denied": view.environ_denied, "ranks": [[r.pid, r.local_rank, r.found_by] for r in ranks]}
            os.write(write_end, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        result = json.loads(f.read() or "{}")
    os.waitpid(child, 0)
    assert result["denied"] >= 2
    assert result["ranks"] == [[kids[0], 0, "launcher"], [kids[1], 1, "launcher"]]


def test_environment_scans_are_rate_limited_and_keep_what_they_found(spawn: Spawn, job: str) -> None:
    first = spawn([sys.executable, "-c", SLEEP], rank_environ(job, 0))
    wait_for(lambda: env_visible(first.pid, "RANK"))
    inspector = ProcessInspector(discovery_interval_s=10, environ_scan_interval_s=30)
    assert [r.pid for r in inspector.inspect(T0).jobs[job]] == [first.pid]
    late = spawn([sys.executable, "-c", SLEEP], rank_environ(job, 1))
    wait_for(lambda: env_visible(late.pid, "RANK"))
    view = inspector.inspect(T0 + 12)  # a discovery, but no scan yet: the first rank is kept
    assert view.discovered and [r.pid for r in view.jobs[job]] == [first.pid]
    assert [r.pid for r in inspector.inspect(T0 + 30).jobs[job]] == [first.pid, late.pid]
    # NVML pids (here: a GPU with the first rank) switch the environment scan off: a third rank is
    # not looked for, the ranks already found stay.
    third = spawn([sys.executable, "-c", SLEEP], rank_environ(job, 2, 3))
    wait_for(lambda: env_visible(third.pid, "RANK"))
    view = inspector.inspect(T0 + 70, gpu_pids={3: [first.pid]})
    assert [(r.pid, r.gpu) for r in view.jobs[job]] == [(first.pid, 3), (late.pid, 5)]


# ------------------------------------------------------------------------ measuring through /proc


def test_measuring_reads_proc_and_gives_psutils_values(
    spawn: Spawn, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: a rank is measured with one read of /proc/<pid>/stat and one of /proc/<pid>/io -
    no psutil call - and the values are psutil's."""
    procs = [spawn([sys.executable, "-c", SLEEP], rank_environ(job, r, 2)) for r in range(2)]
    for p in procs:
        wait_for(lambda p=p: env_visible(p.pid, "RANK"))
        wait_for(lambda p=p: psutil.Process(p.pid).status() == psutil.STATUS_SLEEPING)  # in its sleep
    inspector = ProcessInspector(discovery_interval_s=3600)
    inspector.inspect(T0)
    want = {}
    for p in procs:
        ps = psutil.Process(p.pid)
        times, io = ps.cpu_times(), ps.io_counters()
        want[p.pid] = (ps.status(), times.user + times.system, os.getpgid(p.pid), io.read_chars)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("psutil called while measuring")

    for name in ("oneshot", "status", "cpu_times", "io_counters", "is_running"):
        monkeypatch.setattr(psutil.Process, name, refused)
    ranks = inspector.inspect(T0 + 1).jobs[job]
    got = {r.pid: (r.status, r.cpu_time_s, r.pgid, None) for r in ranks}
    assert {pid: w[:3] for pid, w in want.items()} == {pid: g[:3] for pid, g in got.items()}
    assert all(r.alive and r.read_chars_delta is not None and r.interval_s == 1.0 for r in ranks)


def test_a_pid_that_names_a_process_started_at_another_time_is_gone(spawn: Spawn, job: str) -> None:
    """The pid of a rank that exited may name a new process: its start time differs, and the rank is
    gone - never measured (nor signalled) as that process."""
    p = spawn([sys.executable, "-c", SLEEP], rank_environ(job, 0, 1))
    wait_for(lambda: env_visible(p.pid, "RANK"))
    inspector = ProcessInspector(discovery_interval_s=3600)
    assert [r.alive for r in inspector.inspect(T0).jobs[job]] == [True]
    inspector._tracked[p.pid].start_ticks -= 1  # what a reused pid looks like from here
    [r] = inspector.inspect(T0 + 1).jobs[job]
    assert (r.alive, r.gone_since_s, r.cpu_time_s) == (False, T0 + 1, None)


def test_the_psutil_path_where_there_is_no_proc(
    spawn: Spawn, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_triage.signals import procfs

    monkeypatch.setattr(procfs, "AVAILABLE", False)
    monkeypatch.setattr(procfs, "read_stat", lambda *a: pytest.fail("read /proc where it is absent"))
    p = spawn([sys.executable, "-c", SLEEP], rank_environ(job, 0, 1))
    wait_for(lambda: env_visible(p.pid, "RANK"))
    wait_for(lambda: psutil.Process(p.pid).status() == psutil.STATUS_SLEEPING)
    inspector = ProcessInspector()
    inspector.inspect(T0)
    [r] = inspector.inspect(T0 + 1).jobs[job]
    assert r.alive and r.pgid == p.pid and r.cpu_time_delta_s is not None and r.status == "sleeping"
    p.kill()
    p.wait()
    [r] = inspector.inspect(T0 + 2).jobs[job]
    assert not r.alive and r.gone_since_s == T0 + 2


def test_proc_stat_is_read_past_a_hostile_command_name(spawn: Spawn, tmp_path: Path) -> None:
    """The command name in /proc/<pid>/stat is the program's: spaces and parentheses in it never
    shift the fields."""
    from gpu_triage.signals import procfs

    hostile = tmp_path / "a) Z 1 2 3 4"
    hostile.symlink_to(Path(sys.executable).resolve())
    p = spawn([str(hostile), "-c", SLEEP], {})
    wait_for(lambda: psutil.Process(p.pid).name() == hostile.name[:15])
    st = procfs.read_stat(p.pid)
    ps = psutil.Process(p.pid)
    times = ps.cpu_times()
    assert (st.status, st.pgid) == (ps.status(), p.pid)
    assert abs(st.cpu_time_s - (times.user + times.system)) < 0.05
    with pytest.raises(procfs.Gone):
        procfs.read_stat(p.pid, st.start_ticks + 1)
    p.kill()
    p.wait()
    with pytest.raises(procfs.Gone):
        procfs.read_stat(p.pid)
    with pytest.raises(procfs.Gone):
        procfs.read_io(p.pid)


def test_pid_exists_is_psutils_answer_and_asks_psutil_once_per_process(
    spawn: Spawn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The progress reader asks whether each file's pid exists every process period: a thread's id is
    no process, a gone pid none; psutil's thread-group check runs once per process, not every time."""
    import threading

    from gpu_triage.signals import procfs

    p = spawn([sys.executable, "-c", SLEEP], {})
    wait_for_exec(p)
    asked: list[int] = []
    real = psutil.pid_exists

    def counted(pid: int) -> bool:
        asked.append(pid)
        return real(pid)

    monkeypatch.setattr(psutil, "pid_exists", counted)
    monkeypatch.setattr(procfs, "_leaders", {})
    assert all(procfs.pid_exists(p.pid) for _ in range(5)) and asked == [p.pid]
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert thread.native_id is not None and thread.native_id != os.getpid()
        assert not procfs.pid_exists(thread.native_id) and not procfs.pid_exists(thread.native_id)
    finally:
        stop.set()
        thread.join()
    procfs._leaders[p.pid] -= 1  # the pid now names a process started at another time: asked again
    assert procfs.pid_exists(p.pid) and asked.count(p.pid) == 2
    p.kill()
    p.wait()
    assert not procfs.pid_exists(p.pid)


@settings(max_examples=300, deadline=None)
@given(
    comm=st.binary(max_size=64).filter(lambda b: b"\0" not in b),
    state=st.sampled_from(["R", "S", "D", "Z", "T", "I", "?"]),
    numbers=st.lists(st.integers(0, 2**62), min_size=4, max_size=4),
)
def test_a_stat_line_parses_whatever_the_command_name(comm: bytes, state: str, numbers: list[int]) -> None:
    """The command name in /proc/<pid>/stat is the program's choice: no bytes in it move a field."""
    from gpu_triage.signals import procfs

    pgid, utime, stime, started = numbers
    rest = [1, pgid, 7, *[0] * 7, utime, stime, *[0] * 6, started, 123, 456]
    line = b"%d (%s) %s " % (4242, comm, state.encode()) + b" ".join(b"%d" % n for n in rest) + b"\n"
    got = procfs.parse_stat(line)
    assert got is not None
    assert (got.pgid, got.start_ticks) == (pgid, started)
    assert got.cpu_time_s == utime / procfs.CLOCK_TICKS + stime / procfs.CLOCK_TICKS
    assert got.status == procfs.STATUSES.get(state, "?")
    assert procfs.parse_stat(b"4242 (" + comm + b")") is None  # cut short: not that format


def test_ranks_are_listed_by_rank_between_discoveries_too(spawn: Spawn, job: str) -> None:
    """The view lists a job's ranks by rank (unknown ranks last): the order is set at discovery and
    kept by every measurement after it (no sort each period), whatever order the pids came in."""
    procs = [spawn([sys.executable, "-c", SLEEP], rank_environ(job, r, 3)) for r in (2, 0, 1)]
    for p in procs:
        wait_for(lambda p=p: env_visible(p.pid, "RANK"))
    inspector = ProcessInspector(discovery_interval_s=3600)
    first = inspector.inspect(T0)
    later = inspector.inspect(T0 + 1)
    assert first.discovered and not later.discovered
    for view in (first, later):
        assert [r.rank for r in view.jobs[job]] == [0, 1, 2]
    procs[1].kill()  # rank 0 exits: still listed (not alive) in its place until forgotten
    procs[1].wait()
    assert [(r.rank, r.alive) for r in inspector.inspect(T0 + 2).jobs[job]] == [
        (0, False),
        (1, True),
        (2, True),
    ]
    inspector.close()
