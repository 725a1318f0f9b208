"""Slurm identity (pure rules), the scancel canceller's refusals and argv, and the health check's
reasons. The real cluster is in tests/integration/test_slurm.py; here ``squeue``/``scancel`` are small
scripts in ``actions.slurm_bin_dir`` so every refusal path runs in milliseconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpu_triage.actions.kill_targets import SubprocessRunner
from gpu_triage.actions.slurm_cancel import SlurmCanceller, kill_argv, parse_squeue, term_argv
from gpu_triage.cli.slurm_health import drain_reason, health_reasons, node_name, probe
from gpu_triage.daemon.config import ConfigError, load_config
from gpu_triage.signals.ranks import job_key
from gpu_triage.signals.slurm import (
    SlurmIdentity,
    SlurmRankFacts,
    SlurmRefusal,
    SlurmTarget,
    identity_from_cgroup,
    identity_from_environ,
    identity_from_stepd,
    job_name,
    judge_slurm_ranks,
    read_facts,
)
from tests.spawned import wait_for_exec

JOB = SlurmIdentity("4242", "batch")


def facts(pid: int, **kw) -> SlurmRankFacts:
    base = {
        "uid": 1000,
        "proof": ("rank_env",),
        "environ": SlurmIdentity("4242", None),
        "stepd": JOB,
    }
    return SlurmRankFacts(pid, **(base | kw))


# ------------------------------------------------------------------------------------ identity


def test_identity_from_the_environment_names_job_and_numbered_step():
    assert identity_from_environ({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3"}) == SlurmIdentity("77", "3")
    assert job_name({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3"}) == "slurm-77.3"
    assert job_name({"SLURM_JOB_ID": "77"}) == "slurm-77"
    assert job_name({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "batch"}) == "slurm-77"
    for bad in ("", "12; rm -rf /", "-5", "abc", "1" * 21):
        assert identity_from_environ({"SLURM_JOB_ID": bad}) is None, bad
    assert job_key({"SLURM_JOB_ID": "991", "SLURM_STEP_ID": "0"}) == "slurm-991.0"
    assert job_key({"SLURM_JOB_ID": "x1", "MASTER_ADDR": "a", "MASTER_PORT": "1"}) == "master-a:1"
    assert (
        job_key({"GPU_WATCHDOG_JOB": "slurm-991", "SLURM_JOB_ID": "991", "SLURM_STEP_ID": "0"}) == "slurm-991"
    )


def test_identity_from_cgroup_and_slurmstepd_title():
    v1 = "4:memory:/slurm/uid_1000/job_4242/step_0/task_1\n1:cpu:/\n"
    assert identity_from_cgroup(v1) == SlurmIdentity("4242", "0")
    v2 = "0::/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0\n"
    assert identity_from_cgroup(v2) == SlurmIdentity("4242", "batch")
    assert identity_from_cgroup("0::/user.slice/session-3.scope\n") is None
    assert identity_from_stepd(["slurmstepd: [4242.batch]"]) == SlurmIdentity("4242", "batch")
    assert identity_from_stepd(["slurmstepd:", "[4242.0]"]) == SlurmIdentity("4242", "0")
    assert identity_from_stepd(["python", "slurmstepd: [1.0]"]) is None


def test_read_facts_of_a_process_outside_slurm_confirms_nothing():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], env={**env, "SLURM_JOB_ID": "4242"}
    )
    wait_for_exec(child)
    try:
        got = read_facts(child.pid, ("rank_env",))
    finally:
        child.kill()
        child.wait()
    assert got.environ == SlurmIdentity("4242", None) and got.uid == os.getuid()
    assert got.stepd is None and got.cgroup is None
    verdict = judge_slurm_ranks([got])
    assert isinstance(verdict, SlurmRefusal) and "not confirmed" in verdict.reason and verdict.slurm_claimed


# --------------------------------------------------------------------------------------- rules


def test_ranks_confirmed_by_slurmstepd_make_a_target():
    target = judge_slurm_ranks([facts(10), facts(11, cgroup=SlurmIdentity("4242", "batch"))])
    assert isinstance(target, SlurmTarget)
    assert target.identity == SlurmIdentity("4242", "batch") and target.uid == 1000
    assert target.pids == (10, 11) and sorted(set(target.confirmed_by)) == ["cgroup", "stepd"]


@pytest.mark.parametrize(
    ("ranks", "reason"),
    [
        ([], "no rank process"),
        ([facts(10, proof=("progress_file",))], "not a proven rank"),
        ([facts(10, environ=None)], "no well-formed SLURM_JOB_ID"),
        ([facts(10, environ=None, environ_readable=False)], "no readable environment"),
        ([facts(10), facts(11, environ=SlurmIdentity("9", None))], "different Slurm jobs"),
        ([facts(10, stepd=None)], "not confirmed"),
        ([facts(10, stepd=SlurmIdentity("9", "0"))], "its stepd says job 9"),
        ([facts(10, cgroup=SlurmIdentity("9", "0"))], "its cgroup says job 9"),
        ([facts(10), facts(11, uid=1001)], "owners differ"),
        ([facts(10, uid=None)], "owners differ or are unknown"),
    ],
)
def test_a_job_is_refused_unless_every_rule_holds(ranks, reason):
    verdict = judge_slurm_ranks(ranks)
    assert isinstance(verdict, SlurmRefusal) and reason in verdict.reason, verdict


def test_scancel_argv_for_job_and_step():
    job = SlurmTarget(SlurmIdentity("7", "batch"), 1000, (1,), ("stepd",))
    step = SlurmTarget(SlurmIdentity("7", "2"), 1000, (1,), ("stepd",))
    assert term_argv("scancel", job, "job") == ("scancel", "7")
    assert kill_argv("scancel", job, "job") == ("scancel", "--signal=KILL", "--full", "7")
    assert term_argv("scancel", step, "job") == ("scancel", "7")
    assert term_argv("scancel", step, "step") == ("scancel", "7.2")
    assert kill_argv("scancel", step, "step") == ("scancel", "--signal=KILL", "7.2")
    assert term_argv("scancel", job, "step") == ("scancel", "7")  # the batch step: the job
    assert parse_squeue("1000|RUNNING\n") == ("1000", "RUNNING")
    assert parse_squeue("") is None and parse_squeue("garbage\n") is None


# ----------------------------------------------------------------------------------- canceller


def _fake_slurm(tmp_path: Path, squeue_out: str, squeue_rc: int = 0) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    (bin_dir / "squeue").write_text(
        f"#!/bin/sh\necho \"squeue $*\" >> {log}\nprintf '{squeue_out}'\nexit {squeue_rc}\n"
    )
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "scancel $*" >> {log}\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def _canceller(bin_dir: Path, rank_facts: list[SlurmRankFacts], cancel: str = "job") -> SlurmCanceller:
    by_pid = {f.pid: f for f in rank_facts}
    return SlurmCanceller(
        SubprocessRunner(),
        bin_dir=bin_dir,
        cancel=cancel,
        timeout_s=10,
        facts_reader=lambda p, _pr, _u: by_pid[p],
    )


@pytest.mark.parametrize(
    ("squeue_out", "rc", "reason"),
    [
        ("1001|RUNNING\\n", 0, "belongs to uid 1001, its ranks to uid 1000"),
        ("1000|PENDING\\n", 0, "is PENDING, not running"),
        ("", 0, "Slurm lists no job 4242"),
        ("", 1, "squeue -j 4242 failed"),
    ],
)
def test_slurm_must_agree_on_owner_and_state(tmp_path, squeue_out, rc, reason):
    bin_dir = _fake_slurm(tmp_path, squeue_out, rc)
    verdict = _canceller(bin_dir, [facts(10)]).resolve([(10, ("rank_env",), 1000)])
    assert isinstance(verdict, SlurmRefusal) and reason in verdict.reason, verdict
    assert "scancel" not in (tmp_path / "calls.log").read_text()


def test_canceller_runs_scancel_of_the_confirmed_job(tmp_path):
    bin_dir = _fake_slurm(tmp_path, "1000|RUNNING\\n")
    canceller = _canceller(bin_dir, [facts(10), facts(11)])
    target = canceller.resolve([(10, ("rank_env",), 1000), (11, ("rank_env",), 1000)])
    assert isinstance(target, SlurmTarget)
    assert canceller.terminate(target, dry_run=True).result is None  # dry run: nothing is run
    term = canceller.terminate(target, dry_run=False)
    kill = canceller.kill(target, dry_run=False)
    assert term.ok and kill.ok
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls == ["squeue -h -j 4242 -o %U|%T", "scancel 4242", "scancel --signal=KILL --full 4242"]
    assert term.to_dict()["via"] == "slurm" and term.to_dict()["slurm_job"] == "4242"


def test_missing_binaries_refuse(tmp_path):
    verdict = _canceller(tmp_path, [facts(10)]).resolve([(10, ("rank_env",), 1000)])
    assert isinstance(verdict, SlurmRefusal) and "not found" in verdict.reason


# -------------------------------------------------------------------------------------- config


def test_config_keys_are_validated(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[actions]\nkill_via = "scancel"\nslurm_cancel = "node"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert list(info.value.problems) == [
        f'{path}:2: actions.kill_via: expected one of auto, signal, slurm, got "scancel"',
        f'{path}:3: actions.slurm_cancel: expected one of job, step, got "node"',
    ]
    path.write_text('[actions]\nkill_via = "slurm"\nkill_hook = ["/bin/true"]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert "actions.kill_via" in info.value.problems[0] and "choose one" in info.value.problems[0]
    path.write_text(f'[actions]\nkill_via = "slurm"\nslurm_bin_dir = "{tmp_path}"\n')
    config = load_config(path, {})
    assert (config.actions.kill_via, config.actions.slurm_bin_dir) == ("slurm", tmp_path)


# -------------------------------------------------------------------------------- health check


def test_health_reasons():
    now = 1000.0
    healthy = {"time": now, "gpus": [{"gpu": 0, "state": "compute", "power_w": 700.0}], "jobs": []}
    assert health_reasons(healthy, now_s=now) == []
    young = {"time": now, "gpus": [{"gpu": 1, "state": "unknown", "power_w": None, "state_since": now - 5}]}
    assert health_reasons(young, now_s=now) == []
    doc = {
        "time": now - 120,
        "gpus": [{"gpu": 1, "state": "unknown", "power_w": None, "state_since": now - 300}],
        "jobs": [{"job": "slurm-5", "verdict": "telemetry_lost"}, {"job": "slurm-6", "verdict": "healthy"}],
    }
    assert health_reasons(doc, now_s=now) == [
        "daemon's last cycle was 120 s ago",
        "gpu 1 unreadable for 180 s (wedged or lost)",
        "job slurm-5 telemetry_lost",
    ]
    assert drain_reason(["x" * 500]).endswith("...") and len(drain_reason(["x" * 500])) == 200
    assert node_name(None, {"SLURMD_NODENAME": "gpu-a01"}) == "gpu-a01"
    assert node_name("n1", {"SLURMD_NODENAME": "gpu-a01"}) == "n1"


class _Status(BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_a):
        pass


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpu_triage", "slurm-health-check", "--node", "n1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_health_check_cli_drains_through_scontrol(tmp_path):
    scontrol = tmp_path / "scontrol"
    log = tmp_path / "scontrol.log"
    scontrol.write_text(f'#!/bin/sh\nfor a in "$@"; do echo "$a" >> {log}; done\n')
    scontrol.chmod(0o755)
    import time

    _Status.body = json.dumps(
        {"time": time.time(), "gpus": [], "jobs": [{"job": "slurm-9", "verdict": "telemetry_lost"}]}
    ).encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        report = _check("--url", url, "--scontrol", str(scontrol))
        assert report.returncode == 1 and not log.exists()  # no --drain: report only
        drained = _check("--url", url, "--scontrol", str(scontrol), "--drain")
    finally:
        server.shutdown()
    assert drained.returncode == 1, drained.stderr
    assert log.read_text().splitlines() == [
        "update", "nodename=n1", "state=drain", "reason=gpu-watchdog: job slurm-9 telemetry_lost"
    ]  # fmt: skip
    # A dead daemon is a reason of its own; --on-unreachable ignore only reports it.
    log.unlink()
    dead = _check("--url", "http://127.0.0.1:1", "--scontrol", str(scontrol), "--drain")
    assert dead.returncode == 2 and "daemon unreachable" in log.read_text()
    log.unlink()
    ignored = _check(
        "--url", "http://127.0.0.1:1", "--scontrol", str(scontrol), "--drain", "--on-unreachable", "ignore"
    )
    assert ignored.returncode == 2 and not log.exists()


def test_health_age_comes_from_healthz_not_from_the_wall_clock():
    # the node's wall clock stepped 10 min ahead: /status's `time` looks old, /healthz says the loop is fresh
    doc = {"time": 1000.0, "gpus": [], "jobs": []}
    assert health_reasons(doc, now_s=1600.0, cycle_age_s=0.4) == []
    assert health_reasons(doc, now_s=1000.0, cycle_age_s=90.0) == ["daemon's last cycle was 90 s ago"]


def test_probe_retries_with_doubling_pauses_and_tells_an_answer_from_none():
    calls: list[str] = []
    sleeps: list[float] = []

    def flaky(url: str, timeout_s: float, path: str) -> dict:
        calls.append(path)
        if len(calls) < 3:
            raise TimeoutError("timed out")
        return {"status": "ok"}

    got = probe(
        "http://x", "/healthz", timeout_s=1.0, tries=4, backoff_s=1.0, sleep=sleeps.append, fetch=flaky
    )
    assert (got.document, got.tries, sleeps) == ({"status": "ok"}, 3, [1.0, 2.0])

    def dead(url: str, timeout_s: float, path: str) -> dict:
        raise ConnectionRefusedError(111, "Connection refused")

    sleeps.clear()
    gone = probe(
        "http://x", "/healthz", timeout_s=1.0, tries=3, backoff_s=0.5, sleep=sleeps.append, fetch=dead
    )
    assert gone.document is None and gone.tries == 3 and sleeps == [0.5, 1.0]
    assert "ConnectionRefusedError" in (gone.error or "")


class _Slow(BaseHTTPRequestHandler):
    """A daemon under a flood: the first requests answer only after the client gave up."""

    late = 0
    body = b"{}"

    def do_GET(self):
        if _Slow.late > 0:
            _Slow.late -= 1
            time.sleep(1.5)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_a):
        pass


def test_health_check_tells_a_slow_daemon_from_a_dead_one(tmp_path):
    scontrol = tmp_path / "scontrol"
    log = tmp_path / "scontrol.log"
    scontrol.write_text(f'#!/bin/sh\nfor a in "$@"; do echo "$a" >> {log}; done\n')
    scontrol.chmod(0o755)
    _Slow.body = json.dumps(
        {"status": "ok", "last_cycle_age_s": 0.3, "time": 0.0, "gpus": [], "jobs": []}
    ).encode()
    _Slow.late = 2  # the first two tries time out (0.5 s), the third gets its answer
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        slow = _check(
            "--url", url, "--scontrol", str(scontrol), "--drain", "--timeout", "0.5", "--backoff", "0.1"
        )
    finally:
        server.shutdown()
    assert slow.returncode == 0, slow.stdout + slow.stderr
    assert not log.exists(), "a slow daemon must not drain the node"
    dead = _check(
        "--url",
        "http://127.0.0.1:1",
        "--scontrol",
        str(scontrol),
        "--drain",
        "--backoff",
        "0.1",
        "--tries",
        "3",
    )
    assert dead.returncode == 2 and "daemon unreachable" in log.read_text()
    assert "3 tries" in dead.stderr
