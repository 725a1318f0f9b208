"""What the once-a-second work reads from ``/proc`` (issue 30), counted on real processes: a
rediscovery reads one ``stat`` per process it has seen, a rank is measured through files kept open,
the progress reader asks whether a file's pid lives without opening a file - and none of it is fooled
by a process that runs another program, exits, or whose pid is reused."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.contract import ProgressWriter
from gpu_triage.signals import procfs
from gpu_triage.signals.processes import ProcessInspector
from gpu_triage.signals.progress import ProgressReader
from gpu_triage.signals.progress_model import StaleReason
from tests.watchdog import test_processes as shared
from tests.watchdog.test_processes import SLEEP, T0, Spawn, env_visible, rank_environ, wait_for

pytestmark = pytest.mark.skipif(not procfs.AVAILABLE, reason="reads /proc")
HOST = "node-a"
spawn, job = shared.spawn, shared.job  # the fixtures: real processes, killed at the end; a fresh job name


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[str]]]:
    """Every path opened from now on (``open`` - psutil's reads - and ``os.open`` - ours); call to
    start counting afresh and get what was opened since the last call."""
    paths: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def counted_open(file: object, *args: object, **kwargs: object) -> object:
        paths.append(os.fsdecode(file) if isinstance(file, (str, bytes, os.PathLike)) else str(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    def counted_os_open(path: object, *args: object, **kwargs: object) -> int:
        paths.append(os.fsdecode(path))  # type: ignore[arg-type]
        return real_os_open(path, *args, **kwargs)  # type: ignore[arg-type]

    # every rank kept open, however many other ranks this shared machine runs (the cap is tested apart)
    monkeypatch.setattr(procfs.ProcFiles, "max_open", 100_000)
    monkeypatch.setattr(builtins, "open", counted_open)
    monkeypatch.setattr(os, "open", counted_os_open)

    def since() -> list[str]:
        got = list(paths)
        paths.clear()
        return got

    yield since


def _of(paths: list[str], pids: list[int]) -> list[str]:
    """The paths under ``/proc/<pid>/`` of the given pids, as ``<pid>/<file>``."""
    prefixes = {f"/proc/{pid}/": str(pid) for pid in pids}
    return sorted(p[len("/proc/") :] for p in paths if any(p.startswith(k) for k in prefixes))


def _fds_on(pid: int) -> list[str]:
    """This process's descriptors open on ``/proc/<pid>/...``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"/proc/{pid}/"):
            out.append(target)
    return out


def test_a_rediscovery_reads_one_stat_per_process_it_has_seen(
    spawn: Spawn, job: str, opened: Callable[[], list[str]]
) -> None:
    """Discovery read six files and built four psutil objects per process every time (4 ms at 16
    ranks, every 10 s); what never changes for a program run in a process is kept."""
    procs = [spawn([sys.executable, "-c", SLEEP], rank_environ(job, r, 3, cvd=None)) for r in range(3)]
    for p in procs:
        wait_for(lambda p=p: env_visible(p.pid, "RANK"))
    pids = [p.pid for p in procs]
    inspector = ProcessInspector(discovery_interval_s=0, environ_scan_interval_s=0)
    first = inspector.inspect(T0)
    assert [r.pid for r in first.jobs[job]] == pids
    assert any(f.endswith("/environ") for f in _of(opened(), pids))  # read in full the first time
    for i in range(1, 4):
        view = inspector.inspect(T0 + i)
        assert view.discovered and [(r.pid, r.rank, r.alive) for r in view.jobs[job]] == [
            (pid, rank, True) for rank, pid in enumerate(pids)
        ]
        assert _of(opened(), pids) == sorted(f"{pid}/stat" for pid in pids)


def test_a_process_that_runs_another_program_is_read_again(spawn: Spawn, job: str) -> None:
    """Same pid, same start time, another program (``execve``): its environment now names a rank."""
    code = (
        "import os, sys\n"
        "sys.stdin.readline()\n"
        "env = {**os.environ, **eval(sys.argv[2])}\n"
        "os.execve(sys.executable, [sys.executable, '-c', sys.argv[1]], env)\n"
    )
    p = spawn(
        [sys.executable, "-c", code, SLEEP, repr(rank_environ(job, 0, 1, cvd=None))],
        {"NOT_A_RANK": "1"},
        stdin=subprocess.PIPE,
    )
    wait_for(lambda: env_visible(p.pid, "NOT_A_RANK"))
    inspector = ProcessInspector(discovery_interval_s=0, environ_scan_interval_s=0)
    assert job not in inspector.inspect(T0).jobs
    assert inspector.inspect(T0 + 1).jobs.get(job) is None  # seen again, still not a rank
    assert p.stdin is not None
    p.stdin.write(b"go\n")
    p.stdin.flush()
    wait_for(lambda: env_visible(p.pid, "RANK"))
    [r] = inspector.inspect(T0 + 2).jobs[job]
    assert (r.pid, r.rank, r.found_by, r.alive) == (p.pid, 0, "environ", True)


def test_ranks_are_measured_through_files_kept_open_and_closed_when_gone(
    spawn: Spawn, job: str, opened: Callable[[], list[str]]
) -> None:
    """A rank's stat and io were opened, read and closed every period (16 ranks: 64 system calls
    a second that are now 32 preads); the files name the process, so a reaped rank reads as gone."""
    procs = [spawn([sys.executable, "-c", SLEEP], rank_environ(job, r, 2, cvd=None)) for r in range(2)]
    for p in procs:
        wait_for(lambda p=p: env_visible(p.pid, "RANK"))
    inspector = ProcessInspector(discovery_interval_s=3600)
    inspector.inspect(T0)
    opened()
    for i in range(1, 4):
        ranks = inspector.inspect(T0 + i).jobs[job]
        assert all(r.alive and r.cpu_time_delta_s is not None and r.interval_s == 1.0 for r in ranks)
    assert [p for p in opened() if p.startswith("/proc/")] == []
    assert sorted(_fds_on(procs[0].pid)) == [f"/proc/{procs[0].pid}/io", f"/proc/{procs[0].pid}/stat"]
    procs[0].kill()
    procs[0].wait()
    gone, alive = inspector.inspect(T0 + 4).jobs[job]
    assert (gone.pid, gone.alive, gone.gone_since_s) == (procs[0].pid, False, T0 + 4)
    assert alive.alive and _fds_on(procs[0].pid) == []
    inspector.close()
    assert _fds_on(procs[1].pid) == []


def test_the_progress_reader_asks_whether_a_pid_lives_without_opening_a_file(
    spawn: Spawn, tmp_path: Path, opened: Callable[[], list[str]]
) -> None:
    """Each local file's pid was checked with an open/read/parse of /proc/<pid>/stat every period;
    now one pidfd_send_signal on a pidfd kept while the pid is asked about."""
    p = spawn([sys.executable, "-c", SLEEP], {})
    for rank in (0, 1):  # two files naming one process: one pidfd
        w = ProgressWriter("pidjob", rank, rank, 2, directory=tmp_path, pid=p.pid, host=HOST)
        w.phase("train")
        w.step(10)
    reader = ProgressReader(tmp_path, host=HOST)
    now = time.time()
    assert sorted(reader.read(now).jobs["pidjob"].ranks) == [0, 1]
    opened()
    for i in range(1, 4):
        assert sorted(reader.read(now + i).jobs["pidjob"].ranks) == [0, 1]
    assert [f for f in opened() if f.startswith("/proc/")] == []
    assert len([f for f in os.listdir("/proc/self/fd") if "pidfd" in _link(f)]) >= 1
    p.kill()
    p.wait()
    jp = reader.read(now + 4).jobs["pidjob"]
    assert jp.ranks == {} and {r.stale for r in jp.stale.values()} == {StaleReason.PID_GONE}


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def test_pid_check_answers_as_pid_exists_and_keeps_no_pidfd_it_is_not_asked_for(spawn: Spawn) -> None:
    p = spawn([sys.executable, "-c", SLEEP], {})
    q = spawn([sys.executable, "-c", SLEEP], {})
    check = procfs.PidCheck(max_fds=1)
    assert all(check(p.pid) for _ in range(5)) and check.fresh_checks == 1
    assert check(q.pid) and check(q.pid) and check.fresh_checks == 3  # over max_fds: asked afresh
    check.retain({q.pid})
    assert check(p.pid) and check.fresh_checks == 4
    assert not check(0) and not check(-1)
    p.kill()
    p.wait()
    assert not check(p.pid) and not check(p.pid)  # reaped: the pidfd says so, then asked afresh
    check.close()


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, 2**63), min_size=7, max_size=7), shuffle=st.randoms())
def test_io_is_parsed_alike_in_the_kernels_order_and_any_other(values: list[int], shuffle: Random) -> None:
    names = [b"rchar", b"wchar", b"syscr", b"syscw", b"read_bytes", b"write_bytes", b"cancelled_write_bytes"]
    lines = [b"%s: %d\n" % (n, v) for n, v in zip(names, values, strict=True)]
    want = (values[4], values[5], values[0], values[1])
    assert procfs._parse_io(b"".join(lines)) == want  # the kernel's order: the fast path
    shuffle.shuffle(lines)
    assert procfs._parse_io(b"".join(lines)) == want
    assert procfs._parse_io(b"".join(lines[:3])) is None  # cut short: not all four there


def test_past_the_files_it_may_keep_open_a_rank_is_read_afresh(
    spawn: Spawn, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Descriptors are bounded (two a rank kept open, at most ProcFiles.max_open ranks): past that a
    rank is measured as before, with a fresh open of each file - never left unmeasured."""
    procs = [spawn([sys.executable, "-c", SLEEP], rank_environ(job, r, 2, cvd=None)) for r in range(2)]
    for p in procs:
        wait_for(lambda p=p: env_visible(p.pid, "RANK"))
    before = procfs.ProcFiles.open_now
    monkeypatch.setattr(procfs.ProcFiles, "max_open", before)  # no more may be kept open
    inspector = ProcessInspector(discovery_interval_s=3600)
    inspector.inspect(T0)
    ranks = inspector.inspect(T0 + 1).jobs[job]
    assert all(r.alive and r.cpu_time_delta_s is not None and r.read_chars_delta is not None for r in ranks)
    assert procfs.ProcFiles.open_now == before and [_fds_on(p.pid) for p in procs] == [[], []]
    procs[0].kill()
    procs[0].wait()
    assert [r.alive for r in inspector.inspect(T0 + 2).jobs[job]] == [False, True]
    inspector.close()


def test_a_polled_round_asks_the_kernel_only_about_the_pids_that_exited(
    spawn: Spawn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The progress reader asks about every file's pid every period: one epoll_wait over the held
    pidfds per round, a signal only for a pid whose process exited - and the answers stay
    pid_exists's: a zombie still exists, a reaped process does not."""
    sent: list[int] = []
    real_send = procfs.signal.pidfd_send_signal
    monkeypatch.setattr(
        procfs.signal, "pidfd_send_signal", lambda fd, sig: (sent.append(fd), real_send(fd, sig))[1]
    )
    procs = [spawn([sys.executable, "-c", SLEEP], {}) for _ in range(3)]
    check = procfs.PidCheck()
    assert all(check(p.pid) for p in procs) and check.fresh_checks == 3
    check.retain({p.pid for p in procs})
    for _ in range(3):  # steady rounds: no signal at all
        check.poll()
        assert all(check(p.pid) for p in procs)
        check.retain({p.pid for p in procs})
    assert sent == [] and check.signal_checks == 0
    procs[0].kill()  # exits, not reaped yet: a zombie, which still exists
    wait_for(lambda: _state(procs[0].pid) == "Z")
    check.poll()
    assert [check(p.pid) for p in procs] == [True, True, True] and len(sent) == 1
    check.retain({p.pid for p in procs})
    procs[0].wait()  # reaped
    check.poll()
    assert [check(p.pid) for p in procs] == [False, True, True] and len(sent) == 2
    check.retain({p.pid for p in procs[1:]})
    check.close()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rfind(b")") + 2 :].split()[0].decode()
