"""Who a kill may touch (pure rules) and the executor on real child processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpu_triage.actions.kill_targets import (
    HookError,
    KillExecutor,
    KillPlan,
    ProcEntry,
    SubprocessRunner,
    plan_kill,
    process_table,
    protected_pids,
    render_hook,
    slurm_id_from,
    slurm_job_id,
)

# --------------------------------------------------------------------------------------------------
# Real processes


JOB_SCRIPT = r"""
import os, signal, subprocess, sys, time
ignore = sys.argv[1] == "ignore"
if ignore:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, sys, time\n"
if ignore:
    code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
code += "print('ready', flush=True)\ntime.sleep(600)\n"
child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
child.stdout.readline()
print(os.getpid(), child.pid, flush=True)
time.sleep(600)
"""

LAUNCHER_SCRIPT = r"""
import os, subprocess, sys, time
code = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"
kids = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(2)]
for k in kids:
    k.stdout.readline()
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(600)
"""


class Procs:
    """Spawned processes, all killed at the end of the test."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[str]] = []
        self.extra: list[int] = []

    def spawn(
        self, script: str, *args: str, new_session: bool = True
    ) -> tuple[subprocess.Popen[str], list[int]]:
        p = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=new_session,
        )
        self.popens.append(p)
        assert p.stdout is not None
        pids = [int(x) for x in p.stdout.readline().split()]
        self.extra += pids
        return p, pids

    def sleeper(self, new_session: bool = True) -> subprocess.Popen[str]:
        p, _ = self.spawn("import time\nprint(flush=True)\ntime.sleep(600)\n", new_session=new_session)
        return p

    def cleanup(self) -> None:
        for pid in self.extra:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for p in self.popens:
            with contextlib.suppress(OSError):
                p.kill()
            p.wait(5)


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    yield p
    p.cleanup()


def alive(pid: int) -> bool:
    """Running (a zombie is dead)."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def wait_dead(pids: list[int], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.02)
    return False


# --------------------------------------------------------------------------------------------------
# Pure rules


def _table(*entries: tuple[int, int | None, int | None]) -> dict[int, ProcEntry]:
    return {pid: ProcEntry(pid, ppid, pgid, 1000.0 + pid, f"p{pid}") for pid, ppid, pgid in entries}


def test_plan_signals_a_group_made_only_of_job_processes() -> None:
    table = _table((1, 0, 1), (50, 1, 50), (100, 1, 100), (101, 100, 100), (102, 101, 100), (200, 1, 200))
    plan = plan_kill([100], table, own_pid=50)
    assert plan.groups == (100,) and plan.pids == ()
    assert set(plan.members) == {100, 101, 102}  # the rank and its descendants


def test_plan_signals_one_by_one_when_the_group_holds_a_stranger() -> None:
    # torchrun (300) leads the group; ranks 301, 302 are its children; 303 is an unrelated sibling
    table = _table((1, 0, 1), (50, 1, 50), (300, 1, 300), (301, 300, 300), (302, 300, 300), (303, 300, 300))
    plan = plan_kill([301, 302], table, own_pid=50)
    assert plan.groups == ()
    assert plan.pids == (301, 302)
    assert any("non-job processes 300" in why for _, why in plan.skipped)


def test_plan_never_touches_pid_1_the_daemon_or_its_ancestors() -> None:
    # 1 -> 10 (sshd) -> 20 (shell, group 20) -> 30 (daemon, group 20); 40 is a rank in the daemon's group
    table = _table((1, 0, 1), (10, 1, 10), (20, 10, 20), (30, 20, 20), (40, 20, 20))
    assert protected_pids(table, 30) == {0, 1, 10, 20, 30}
    plan = plan_kill([1, 10, 20, 30, 40], table, own_pid=30)
    assert plan.groups == ()  # group 20 holds the daemon
    assert plan.pids == (40,)
    assert {pid for pid, _ in plan.skipped if pid > 0} == {1, 10, 20, 30}
    assert plan_kill([30], table, own_pid=30).empty


def test_plan_descendant_in_its_own_group_is_signalled_alone() -> None:
    table = _table((1, 0, 1), (50, 1, 50), (100, 1, 100), (101, 100, 777))
    plan = plan_kill([100], table, own_pid=50)
    assert plan.groups == (100,)  # 101 left the rank's group: signalled on its own
    assert plan.pids == (101,)


def test_hook_placeholders_stay_one_argument_each() -> None:
    argv = render_hook(
        ["scancel", "--signal=TERM", "{slurm_job_id}", "--comment=job {job} on {node}", "{pids}", "{other}"],
        {"job": "evil; rm -rf /", "node": "node-a", "pids": "11,12", "slurm_job_id": "4242"},
    )
    assert argv == (
        "scancel",
        "--signal=TERM",
        "4242",
        "--comment=job evil; rm -rf / on node-a",
        "11,12",
        "{other}",
    )
    with pytest.raises(HookError, match="slurm_job_id"):
        render_hook(["scancel", "{slurm_job_id}"], {"slurm_job_id": None})
    with pytest.raises(HookError, match="begins with '-'"):
        render_hook(["scancel", "{job}"], {"job": "--all"})


def test_slurm_job_id_sources() -> None:
    cgroup = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"
    assert slurm_id_from(cgroup, {"SLURM_JOB_ID": "4242"}) == ("4242", "cgroup")
    assert slurm_id_from(cgroup, {"SLURM_JOB_ID": "999"}) == ("4242", "cgroup")  # the trusted source wins
    assert slurm_id_from("0::/user.slice\n", {"SLURM_JOB_ID": "12345"}) == ("12345", "environ")
    assert slurm_id_from(None, {"SLURM_JOB_ID": "1; rm -rf /"}) == (None, "malformed SLURM_JOB_ID")
    assert slurm_id_from(None, {}) == (None, "unknown")


# --------------------------------------------------------------------------------------------------
# Real processes


def test_job_process_group_dies_on_sigterm_and_a_stranger_survives(procs: Procs) -> None:
    _, (rank, worker) = procs.spawn(JOB_SCRIPT, "obey")
    stranger = procs.sleeper()
    executor = KillExecutor()
    outcome = executor.terminate([rank], dry_run=False, now=0.0)
    assert outcome.plan.groups == (os.getpgid(rank),)
    assert outcome.signalled == (f"group:{os.getpgid(rank)}",)
    assert wait_dead([rank, worker])
    assert executor.survivors(outcome.plan) == []
    assert alive(stranger.pid)


def test_sigterm_ignored_then_sigkill(procs: Procs) -> None:
    _, (rank, worker) = procs.spawn(JOB_SCRIPT, "ignore")
    stranger = procs.sleeper()
    executor = KillExecutor()
    term = executor.terminate([rank], dry_run=False, now=0.0)
    time.sleep(0.3)
    assert executor.survivors(term.plan) == sorted([rank, worker])  # SIGTERM ignored by both
    kill = executor.escalate(term.plan, dry_run=False, now=1.0)
    assert kill.signal == "SIGKILL" and kill.signalled
    assert wait_dead([rank, worker])
    assert alive(stranger.pid)


def test_shared_group_with_a_launcher_signals_only_the_rank(procs: Procs) -> None:
    launcher, (rank, sibling) = procs.spawn(LAUNCHER_SCRIPT)
    outcome = KillExecutor().terminate([rank], dry_run=False, now=0.0)
    assert outcome.plan.groups == ()
    assert outcome.signalled == (f"pid:{rank}",)
    assert wait_dead([rank])
    assert alive(sibling) and alive(launcher.pid)


def test_a_rank_in_the_daemons_own_group_is_signalled_alone(procs: Procs) -> None:
    child = procs.sleeper(new_session=False)  # shares pytest's process group
    assert os.getpgid(child.pid) == os.getpgid(os.getpid())
    outcome = KillExecutor().terminate([child.pid], dry_run=False, now=0.0)
    assert outcome.plan.groups == () and outcome.signalled == (f"pid:{child.pid}",)
    assert child.wait(5) == -signal.SIGTERM


def test_never_pid_1_own_pid_or_ancestors() -> None:
    me = os.getpid()
    table = process_table()
    targets = [1, me, *sorted(protected_pids(table, me) - {0})]
    outcome = KillExecutor().terminate(targets, dry_run=False, now=0.0)
    assert outcome.plan.empty and outcome.signalled == ()
    assert {pid for pid, _ in outcome.plan.skipped} >= {1, me, os.getppid()}


def test_dry_run_plans_and_signals_nothing(procs: Procs) -> None:
    _, (rank, worker) = procs.spawn(JOB_SCRIPT, "obey")
    executor = KillExecutor()
    outcome = executor.terminate([rank], dry_run=True, now=0.0)
    assert outcome.dry_run and outcome.signalled == ()
    assert outcome.plan.groups == (os.getpgid(rank),)
    kill = executor.escalate(outcome.plan, dry_run=True, now=1.0)
    assert kill.signalled == () and kill.plan.groups == (os.getpgid(rank),)
    time.sleep(0.2)
    assert alive(rank) and alive(worker)


def test_recycled_identity_is_not_signalled(procs: Procs) -> None:
    p = procs.sleeper()
    forged = KillPlan((), (p.pid,), {p.pid: 1.0})  # planned for an older process with the same pid
    outcome = KillExecutor().send(forged, signal.SIGTERM, dry_run=False, now=0.0)
    assert outcome.signalled == () and "recycled" in outcome.errors[0]
    assert alive(p.pid)


def test_hook_runs_as_an_argument_vector_never_a_shell(tmp_path: Path) -> None:
    out = tmp_path / "argv.json"
    marker = tmp_path / "pwned"
    script = "import json, sys\njson.dump(sys.argv[1:], open(sys.argv[1], 'w'))\n"
    argv = render_hook(
        [sys.executable, "-c", script, str(out), "{job}", "{pids}"],
        {"job": f"x; touch {marker}; $(touch {marker})", "pids": "1,2"},
    )
    result = SubprocessRunner().run(argv, timeout_s=10.0)
    assert result.ok, result.stderr
    assert json.loads(out.read_text()) == [str(out), f"x; touch {marker}; $(touch {marker})", "1,2"]
    assert not marker.exists()


def test_runner_timeout_kills_the_command_group() -> None:
    started = time.monotonic()
    result = SubprocessRunner().run([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.3)
    assert result.error is not None and result.error.startswith("timeout")
    assert not result.ok and time.monotonic() - started < 5.0
    missing = SubprocessRunner().run(["/nonexistent/py-spy", "dump"], timeout_s=1.0)
    assert missing.error == "not found: /nonexistent/py-spy"


def test_slurm_job_id_of_real_processes(procs: Procs) -> None:
    env = {**os.environ, "SLURM_JOB_ID": "777"}
    p = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True
    )
    procs.popens.append(p)  # type: ignore[arg-type]
    time.sleep(0.1)
    value, source = slurm_job_id([p.pid])
    assert (value, source) == ("777", "environ") or source == "cgroup"
