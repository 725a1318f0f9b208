"""Issue 27's blame must-show against the real one-node Slurm cluster (tests/integration/slurm_cluster.py).

A requeueable ``sbatch`` job (two simulated ranks writing real progress files, ranks on GPUs 0 and 1 by
``LOCAL_RANK``) runs under the real daemon (``--source none``, kill mode, ``kill_via = "slurm"``,
``[actions] drain`` and ``requeue``). An Xid 79 appears on its GPU 1, then the job deadlocks
(epoch-end: one rank in ``epoch_end``, one frozen in ``train``):

- the hang is ``deadlock_confirmed`` at once (no ``confirm_after_s`` window) with ``blame`` ``node``;
- the real Slurm drains the node (``sinfo -R`` shows ``gpu-watchdog: GPU 1 Xid 79``) and requeues the
  job (``scontrol requeue``: its ``Restarts`` rises) instead of cancelling it;
- ``slurm-health-check`` reads the same fault from the daemon's node verdict (exit 1, the same
  reason), and says healthy once the fault has aged out;
- the operator resumes the node (``scontrol update NodeName=... State=RESUME``), the fault gone; the same
  job starts again, hangs again at the same step, and is judged as today: ``deadlock_suspected``, then
  ``deadlock_confirmed`` after the window, blame ``job`` - and cancelled, not refused as a
  deterministic hang (the first hang was the GPU's, never counted against the job).

The fault comes in as a real kernel line in NVIDIA's format (``NVRM: Xid (PCI:0000:19:00): 79, ...``)
appended to the kernel log file the daemon's health signal follows (``[health] kernel_log_file``, the
seam the sim and replay sources use), read by the real reader and judged by the real Xid catalog. With
``--source none`` no GPU has a bus id of its own, so the test gives the health signal the two bus ids
of the ranks' GPUs (what NVML would list); everything after the map is the daemon's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from gpu_triage.actions.requeue import restarts
from gpu_triage.daemon import loop as loop_module
from gpu_triage.daemon.config import load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.telemetry.none import NoneSource
from tests.conftest import REPO
from tests.integration.slurm_cluster import NODE, SlurmCluster
from tests.integration.test_slurm import (
    JOB_USER,
    _health_check,
    _job_python,
    _require_cluster_parts,
    _wrapper,
)

pytestmark = pytest.mark.slow

BUS_IDS = [(0, "00000000:18:00.0"), (1, "00000000:19:00.0")]
"""The two GPUs the ranks run on (``LOCAL_RANK`` 0 and 1) and their PCI bus ids."""
XID_79 = "NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
"""NVIDIA's format of the line (docs/health.md), for GPU 1's bus id."""
HOLD_S = 45.0
"""``[health] event_hold_s``: the Xid counts this long after it was seen (the GPU 'replaced' after)."""


def test_a_hang_after_an_xid_drains_the_node_and_requeues_the_job_and_its_next_hang_is_the_jobs(monkeypatch):
    _require_cluster_parts()
    user = JOB_USER
    python = _job_python(user)
    if python is None:
        user = "root"
        python = os.path.realpath(sys.executable)
    cluster = SlurmCluster()
    progress = cluster.progress_root
    progress.mkdir(mode=0o755)
    work = cluster.base / "work"
    (work / "gpu_triage").mkdir(parents=True)
    work.chmod(0o1777)
    shutil.copy(REPO / "watchdog" / "contract.py", work / "gpu_triage" / "contract.py")
    (work / "gpu_triage" / "__init__.py").write_text("")
    shutil.copy(Path(__file__).with_name("slurm_payload.py"), work / "slurm_payload.py")
    script = work / "deadlock.sh"
    script.write_text(f"#!/bin/sh\ncd {work}\nexec {python} {work / 'slurm_payload.py'} deadlock\n")
    for p in work.rglob("*"):
        p.chmod(0o755)
    etc = cluster.base / "hooks"
    etc.mkdir(mode=0o755)
    kernel_log = cluster.base / "kern.log"
    kernel_log.write_text("")
    daemon = loop = None
    statuses: list[tuple[float, str, str, bool, int]] = []
    try:
        cluster.start(
            prolog=_wrapper(etc / "prolog", "prolog.sh", progress),
            epilog=_wrapper(etc / "epilog", "epilog.sh", progress),
            task_prolog=_wrapper(etc / "task-prolog", "task-prolog.sh", progress),
            kill_wait_s=10,
        )
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # the daemon's squeue/scancel/scontrol
        config = override(
            load_config(None, {}),
            {
                "daemon.listen": "127.0.0.1:0",
                "daemon.state_dir": str(cluster.base / "state-watchdog"),
                "daemon.period_s": 0.5,
                "progress.dir": str(progress),
                "actions.mode": "kill",
                "actions.kill_via": "slurm",
                "actions.drain": True,
                "actions.requeue": True,
                "actions.slurm_node_name": NODE,
                "actions.capture_after_s": 0.0,
                "actions.alert_after_s": 0.0,
                "actions.sigterm_after_s": 1.0,
                "actions.sigkill_grace_s": 3.0,
                "actions.capture_timeout_s": 20.0,
                "actions.max_kills_per_hour": 5,
                "detector.confirm_after_s": 20.0,
                "stacks.enabled": False,
                # Only the file: this machine's /dev/kmsg may hold other tests' Xid lines.
                "health.kernel_log": "off",
                "health.kernel_log_file": str(kernel_log),
                "health.event_hold_s": HOLD_S,
            },
            origin="test",
        )
        real_env = loop_module.signal_env
        monkeypatch.setattr(  # what NVML would list for GPUs 0 and 1: their bus ids
            loop_module, "signal_env", lambda *a: dataclasses.replace(real_env(*a), gpus=tuple(BUS_IDS))
        )
        daemon = Daemon(config, NoneSource())
        daemon.start()
        loop = threading.Thread(target=daemon.run_forever, daemon=True)
        loop.start()

        job = cluster.run(
            "sbatch", "--parsable", "--requeue", "--cpus-per-task=1", f"--chdir={work}",
            f"--output={work}/%j.out", str(script), user=user,
        ).stdout.strip().split(";")[0]  # fmt: skip
        name = f"slurm-{job}"

        def watch(until, timeout_s: float, what: str) -> None:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                snap = daemon.snapshots.latest()
                for j in snap.jobs if snap else ():
                    if j.job == name:
                        pids = sum(1 for r in j.ranks if r.alive)
                        statuses.append((time.monotonic(), str(j.verdict), str(j.blame), j.kill_worthy, pids))
                if until():
                    return
                time.sleep(0.25)
            raise AssertionError(f"timed out waiting for {what}: {statuses[-5:]}\n{cluster.logs()[-3000:]}")

        def seen_ranks() -> bool:
            snap = daemon.snapshots.latest()
            jobs = {j.job: j for j in snap.jobs} if snap else {}
            return name in jobs and sum(1 for r in jobs[name].ranks if r.gpu is not None) == 2

        watch(seen_ranks, 90, "the job's two ranks on GPUs 0 and 1")
        with kernel_log.open("a") as f:  # the GPU fails; the job hangs shortly after (step 25)
            f.write(XID_79)

        def shown(job_id: str) -> str:
            return cluster.run("scontrol", "show", "job", "-o", job_id, check=False).stdout

        watch(lambda: (restarts(shown(job)) or 0) >= 1, 120, "the requeue (Restarts=1)")
        first_hang = list(statuses)
        unhealthy_check = _health_check(cluster, daemon.http.url)  # the node verdict, report only
        node_state, node_reason = cluster.node_state()
        sinfo_r = cluster.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout.strip()

        # The operator replaces the GPU (the Xid ages out of the hold) and resumes the node; the requeued
        # job starts again.
        watch(lambda: str(daemon.node_health.level) == "healthy", HOLD_S + 60, "the node healthy again")
        healthy_check = _health_check(cluster, daemon.http.url)
        cluster.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")
        cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)  # no requeue hold-off
        mark = len(statuses)
        watch(lambda: cluster.job_state(job) is None, 240, "the second hang's cancel")
        second_hang = statuses[mark:]
        events = [e.to_dict() for e in daemon.store.since(0, 10000)]
        sacct = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sacct = cluster.sacct_states(job)
            if sacct.get(job, "").startswith("CANCELLED"):
                break
            time.sleep(0.5)
    finally:
        if daemon is not None:
            daemon.stop()
            if loop is not None:
                loop.join(15)
            daemon.close()
        cluster.stop()

    actions = [
        e["payload"] for e in events if e["kind"] == "action" and e["payload"].get("job") in (name, None)
    ]
    summary = json.dumps(
        [
            (a["action"], a["result"], a.get("argv"), a.get("reason"), a.get("requeue_refused"))
            for a in actions
        ]
    )
    verdicts = [e["payload"] for e in events if e["kind"] == "verdict" and e.get("job") == name]
    # The first hang: confirmed at once (never suspected), kill-worthy, blamed on the node.
    hung1 = [s for s in first_hang if s[1].startswith("deadlock")]
    assert hung1 and hung1[0][1] == "deadlock_confirmed" and hung1[0][2] == "node" and hung1[0][3], (
        first_hang[-8:]
    )
    first_confirmed = next(v for v in verdicts if v["to"] == "deadlock_confirmed")
    assert first_confirmed["blame"] == "node" and any(
        s.startswith("hardware_fault:gpu 1 xid 79") for s in first_confirmed["signals"]
    )
    # slurm-health-check reads the daemon's node verdict: unhealthy names the fault, healthy again is 0.
    assert unhealthy_check.returncode == 1, (unhealthy_check.stdout, unhealthy_check.stderr)
    assert "gpu-watchdog: GPU 1 Xid 79" in unhealthy_check.stdout, unhealthy_check.stdout
    assert healthy_check.returncode == 0 and "healthy" in healthy_check.stdout, healthy_check.stdout
    # The node is drained with the fault as its reason; the job requeued, not cancelled.
    assert node_state in ("drained", "draining", "drain"), (node_state, node_reason)
    assert node_reason == "gpu-watchdog: GPU 1 Xid 79", node_reason
    assert f"{NODE}|gpu-watchdog: GPU 1 Xid 79" in sinfo_r, sinfo_r
    drains = [a for a in actions if a["action"] == "drain" and a["result"] == "ok"]
    assert len(drains) == 1 and drains[0]["argv"][1:] == [
        "update",
        f"NodeName={NODE}",
        "State=DRAIN",
        "Reason=gpu-watchdog: GPU 1 Xid 79",
    ], summary
    requeued = [a for a in actions if a["action"] == "requeue" and a["result"] == "ok"]
    assert len(requeued) == 1 and requeued[0]["argv"][1:] == ["requeue", job], summary
    # The second hang, on a node with no fault: judged as today - suspected, confirmed after the
    # window, blamed on the job - and cancelled (its first sighting: not a deterministic hang).
    relaunched = next(i for i, s in enumerate(second_hang) if s[1] == "healthy")  # the requeued run
    hung2 = [s for s in second_hang[relaunched:] if s[1].startswith("deadlock")]
    assert hung2 and hung2[0][1] == "deadlock_suspected" and hung2[0][2] == "job", second_hang[-8:]
    confirmed2 = [s for s in hung2 if s[1] == "deadlock_confirmed"]
    assert confirmed2 and confirmed2[0][0] - hung2[0][0] >= 15, hung2[:3]
    assert all(s[2] == "job" for s in hung2)
    cancels = [a for a in actions if a["action"] == "sigterm" and a["result"] == "ok"]
    assert len(cancels) == 1 and cancels[0]["argv"][1:] == [job], summary
    assert not [a for a in actions if a["action"] == "sigterm" and a["result"] == "refused"], summary
    assert sacct.get(job, "").startswith("CANCELLED"), sacct
    assert len([a for a in actions if a["action"] == "drain" and a["result"] in ("started", "ok")]) == 2, (
        summary
    )
