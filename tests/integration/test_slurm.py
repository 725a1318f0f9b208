"""Issue 13's Slurm must-show against a real one-node Slurm cluster on loopback (Debian's slurmctld,
slurmd, slurmdbd, munge, MariaDB; see :mod:`tests.integration.slurm_cluster`).

An ``sbatch`` job deadlocks (epoch-end: one rank in ``epoch_end``, one frozen in ``train``); the real
daemon (``--source none``, kill mode, ``kill_via = "slurm"``) names it by its Slurm id, cancels it
through Slurm - ``scancel <job>`` at the SIGTERM rung, ``scancel --signal=KILL --full <job>`` at the
SIGKILL rung because the job shrugs off SIGTERM - and ``sacct`` records it ``CANCELLED``. An
unrelated job on the node keeps running and stepping. The deploy/slurm prolog, epilog and task
prolog run for real (the per-job progress directory), and ``slurm-health-check --drain`` drains the
node through ``scontrol`` when the daemon reports an unreadable GPU.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpu_triage.daemon.config import load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.telemetry.none import NoneSource
from tests.conftest import REPO, in_ci
from tests.integration.slurm_cluster import NODE, SlurmCluster, missing_binaries

pytestmark = pytest.mark.slow
JOB_USER = "nobody"


def _require_cluster_parts() -> None:
    missing = missing_binaries()
    why = None
    if missing:
        why = (
            f"Slurm/MariaDB binaries missing: {', '.join(missing)} (.ci/install-system-deps.sh installs them)"
        )
    elif os.geteuid() != 0:
        why = "a real Slurm cluster needs root (slurmd, munged, mariadbd run as root here)"
    if why:
        if in_ci():
            pytest.fail(why + " (CI=true: .ci/run runs as root and installs them)")
        pytest.skip(why)


def _job_python(user: str) -> str | None:
    """An interpreter the job user can run (a venv under /root is not one)."""
    for candidate in ("/usr/bin/python3", os.path.realpath(sys.executable)):
        if not os.path.exists(candidate):
            continue
        ok = subprocess.run(
            ["runuser", "-u", user, "--", candidate, "-c", "import json"], capture_output=True, timeout=30
        )
        if ok.returncode == 0:
            return candidate
    return None


def _wrapper(path: Path, script: str, progress_root: Path) -> Path:
    """slurm.conf points at these: the deploy scripts with this cluster's progress root."""
    path.write_text(
        f"#!/bin/sh\nexport GPU_WATCHDOG_PROGRESS_ROOT={progress_root}\n"
        "export GPU_WATCHDOG_PROGRESS_GROUP=root\n"
        f'exec {REPO / "deploy" / "slurm" / script} "$@"\n'
    )
    path.chmod(0o755)
    return path


class StatusServer(BaseHTTPRequestHandler):
    document: bytes = b"{}"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(StatusServer.document)))
        self.end_headers()
        self.wfile.write(StatusServer.document)

    def log_message(self, *_args) -> None:
        pass


def _health_check(cluster: SlurmCluster, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_triage", "slurm-health-check", "--url", url, "--node", NODE, *extra],
        env=cluster.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.isolated  # an armed daemon: a PID namespace of its own (tests/isolation.py)
def test_a_deadlocked_sbatch_job_is_cancelled_through_slurm_and_its_neighbour_keeps_running(monkeypatch):
    _require_cluster_parts()
    user = JOB_USER
    python = _job_python(user)
    if python is None:  # no interpreter the job user may run: the jobs run as root instead
        user = "root"
        python = os.path.realpath(sys.executable)
    cluster = SlurmCluster()
    progress = cluster.progress_root
    progress.mkdir(mode=0o755)
    work = cluster.base / "work"
    (work / "gpu_triage").mkdir(parents=True)
    work.chmod(0o1777)
    # The job runs the real progress writer (the contract module, standard library only), copied where
    # the job user can read it.
    shutil.copy(REPO / "watchdog" / "contract.py", work / "gpu_triage" / "contract.py")
    (work / "gpu_triage" / "__init__.py").write_text("")
    shutil.copy(Path(__file__).with_name("slurm_payload.py"), work / "slurm_payload.py")
    for p in work.rglob("*"):
        p.chmod(0o755)
    scripts = {}
    for mode in ("steady", "deadlock"):
        scripts[mode] = work / f"{mode}.sh"
        scripts[mode].write_text(f"#!/bin/sh\ncd {work}\nexec {python} {work / 'slurm_payload.py'} {mode}\n")
        scripts[mode].chmod(0o755)
    etc = cluster.base / "hooks"
    etc.mkdir(mode=0o755)
    daemon = None
    loop = None
    server = None
    outputs = ""
    try:
        cluster.start(
            prolog=_wrapper(etc / "prolog", "prolog.sh", progress),
            epilog=_wrapper(etc / "epilog", "epilog.sh", progress),
            task_prolog=_wrapper(etc / "task-prolog", "task-prolog.sh", progress),
            kill_wait_s=60,  # Slurm's own SIGKILL comes much later than the watchdog's SIGKILL rung
        )
        proctrack = cluster.proctrack
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # the daemon's squeue/scancel
        config = override(
            load_config(None, {}),
            {
                "daemon.listen": "127.0.0.1:0",
                "daemon.state_dir": str(cluster.base / "state-watchdog"),
                "daemon.period_s": 0.5,
                "progress.dir": str(progress),
                "actions.mode": "kill",
                "actions.kill_via": "slurm",
                "actions.capture_after_s": 0.0,
                "actions.alert_after_s": 0.0,
                "actions.sigterm_after_s": 1.0,
                "actions.sigkill_grace_s": 3.0,
                "actions.capture_timeout_s": 20.0,
                "detector.confirm_after_s": 4.0,
                # Only the progress-file path (K1) is under test; and on a shared machine the stack
                # sampler would attach py-spy to other people's processes the environment scan finds.
                "stacks.enabled": False,
                # Nor this machine's kernel log: another test's Xid line there would be a node fault
                # here, and blame every job (docs/detector.md, "Blame"); the health test reads its own.
                "health.kernel_log": "off",
            },
            origin="test",
        )
        daemon = Daemon(config, NoneSource())
        daemon.start()
        loop = threading.Thread(target=daemon.run_forever, daemon=True)
        loop.start()

        steady = cluster.sbatch(scripts["steady"], user=user, workdir=work)
        hung = cluster.sbatch(scripts["deadlock"], user=user, workdir=work)
        steady_name, hung_name = f"slurm-{steady}", f"slurm-{hung}"
        uid = pwd.getpwnam(user).pw_uid

        # The prolog made each job its own progress directory, owned by the job's user, mode 2750.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (progress / hung_name).is_dir():
            time.sleep(0.2)
        st = (progress / hung_name).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o2750), cluster.logs()

        seen: dict[str, list[int]] = {}
        steady_steps: list[int] = []
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            snap = daemon.snapshots.latest()
            jobs = {j.job: j for j in snap.jobs} if snap else {}
            for name in (steady_name, hung_name):
                if name in jobs and len(jobs[name].ranks) == 2 and name not in seen:
                    seen[name] = [r.pid for r in jobs[name].ranks if r.pid]
            if steady_name in jobs:
                steady_steps.append(max((r.step or 0) for r in jobs[steady_name].ranks))
            if hung_name in seen and cluster.job_state(hung) is None:
                break
            time.sleep(0.5)
        assert cluster.job_state(hung) is None, (
            f"job {hung} still {cluster.job_state(hung)}\n{cluster.logs()}"
        )
        time.sleep(3.0)  # the neighbour keeps stepping after the cancel
        snap = daemon.snapshots.latest()
        jobs = {j.job: j for j in snap.jobs}
        steady_after = max((r.step or 0) for r in jobs[steady_name].ranks)
        steady_verdict = jobs[steady_name].verdict
        events = [e.to_dict() for e in daemon.store.since(0, 5000)]

        # The daemon's view before Slurm was asked: a healthy neighbour, still healthy; now the checks
        # through the real daemon's /status: a healthy node is not drained.
        healthy = _health_check(cluster, daemon.http.url, "--drain")

        # A /status that shows a GPU unreadable for two minutes drains the node through scontrol.
        now = time.time()
        StatusServer.document = json.dumps(
            {"time": now, "gpus": [{"gpu": 3, "state": "unknown", "power_w": None, "state_since": now - 120}],
             "jobs": []}
        ).encode()  # fmt: skip
        server = ThreadingHTTPServer(("127.0.0.1", 0), StatusServer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        wedged = _health_check(cluster, f"http://127.0.0.1:{server.server_port}", "--drain")
        node_state, node_reason = cluster.node_state()
        steady_state = cluster.job_state(steady)
        sacct = {}
        deadline = time.monotonic() + 30  # accounting reaches slurmdbd asynchronously
        while time.monotonic() < deadline:
            sacct = cluster.sacct_states(hung)
            if sacct.get(hung, "").startswith("CANCELLED"):
                break
            time.sleep(0.5)
        hung_dir_left = (progress / hung_name).exists()
        hung_alive = [p for p in seen.get(hung_name, []) if _alive(p)]
        steady_alive = [p for p in seen.get(steady_name, []) if _alive(p)]
    finally:
        outputs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in work.glob("*.out")
        )
        if server is not None:
            server.shutdown()
        if daemon is not None:
            daemon.stop()
            if loop is not None:
                loop.join(15)
            daemon.close()
        cluster.stop()

    actions = [e["payload"] for e in events if e["kind"] == "action"]
    mine = [a for a in actions if a.get("job") == hung_name]
    summary = json.dumps(
        [(a["action"], a["result"], a.get("argv"), a.get("refused"), a.get("errors")) for a in actions]
    )
    # Named by its Slurm id (the task prolog's GPU_WATCHDOG_JOB and the ranks' SLURM_JOB_ID agree).
    assert set(seen) == {steady_name, hung_name}, f"{summary}\n{outputs}"
    assert any(
        e["kind"] == "verdict" and e.get("job") == hung_name and e["payload"]["to"] == "deadlock_confirmed"
        for e in events
    ), summary
    term = [a for a in mine if a["action"] == "sigterm" and a["result"] == "ok"]
    assert term, summary
    assert term[0]["via"] == "slurm" and term[0]["slurm_job"] == hung, term[0]
    assert Path(term[0]["argv"][0]).name == "scancel" and term[0]["argv"][1:] == [hung], term[0]
    assert "stepd" in term[0]["confirmed_by"] and term[0]["uid"] == uid, term[0]
    if proctrack == "cgroup":  # slurmd put the ranks in the job's cgroup: a second confirmation
        assert "cgroup" in term[0]["confirmed_by"], term[0]
    # The job ignores SIGTERM: the SIGKILL rung asked Slurm first; Slurm refuses to signal a job it is
    # already cancelling (it waits out its own KillWait), so the survivors were signalled directly.
    kill = [a for a in mine if a["action"] == "sigkill" and a["result"] == "ok"]
    assert kill and kill[0]["argv"][1:] == ["--signal=KILL", "--full", hung], summary
    assert kill[0].get("fallback") == "signal" or kill[0]["signalled"] == [f"slurm:{hung}"], kill[0]
    assert sorted(kill[0]["survivors"]) == sorted(set(kill[0]["survivors"]) | set(seen[hung_name])), kill[0]
    assert not hung_alive, "every rank of the cancelled job is gone"
    assert sacct.get(hung, "").startswith("CANCELLED"), sacct
    assert not hung_dir_left, "the epilog removed the job's progress directory"
    # The neighbour: never targeted, still running, still stepping, healthy.
    assert not [a for a in actions if a.get("job") == steady_name], summary
    assert steady_state == "RUNNING" and len(steady_alive) == 2
    assert steady_steps and steady_after > steady_steps[0], (steady_steps[:3], steady_after)
    assert str(steady_verdict) == "healthy"
    # Health checks: the real daemon says healthy (no drain), the wedged GPU drains the node.
    assert healthy.returncode == 0 and "healthy" in healthy.stdout, healthy.stderr
    assert wedged.returncode == 1, (wedged.stdout, wedged.stderr)
    assert node_state in ("drained", "draining", "drain"), (node_state, node_reason)
    assert node_reason.startswith("gpu-watchdog: gpu 3 unreadable"), node_reason


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
