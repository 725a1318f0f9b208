"""Issue 4's must-show through the real daemon: the reference scenario's epoch-end deadlock with a
simulated job of real rank processes produces, in order, an evidence bundle, an Alertmanager v2 alert
received by a real HTTP receiver, then - only when armed - SIGTERM (and SIGKILL if needed) of exactly
the job's processes; an unrelated process survives; once the job is gone the alert resolves.

Every test here runs an armed daemon: each runs in a PID namespace of its own (tests/isolation.py), so
it never sees - let alone signals - another run's ranks or ``make run``'s simulated job."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from gpu_triage.daemon.config import SinkConfig, load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.demo import simjob
from gpu_triage.journal.logs import LOGGER_NAME
from gpu_triage.telemetry.sim import SimSource

pytestmark = pytest.mark.isolated


class Receiver(BaseHTTPRequestHandler):
    posts: ClassVar[list[tuple[float, str, object]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Receiver.posts.append((time.time(), self.path, json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args) -> None:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["kill", "alert"])
def test_suspected_deadlock_gives_evidence_then_alert_then_signals_only_when_armed(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    Receiver.posts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    start = time.time() - 100.0  # the scenario's epoch-end deadlock begins at 110 s: ~10 s from now
    progress = tmp_path / "progress"
    job = simjob.start(progress, start, interval_s=0.2)
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    config = override(
        load_config(None, {}),
        {
            "daemon.listen": "127.0.0.1:0",
            "daemon.state_dir": str(tmp_path / "state"),
            "daemon.period_s": 0.2,
            "progress.dir": str(progress),
            "actions.mode": mode,
            "actions.capture_after_s": 0.0,
            "actions.alert_after_s": 0.0,
            "actions.sigterm_after_s": 2.0,
            "actions.sigkill_grace_s": 3.0,
            "actions.capture_timeout_s": 20.0,
            "detector.confirm_after_s": 8.0,
        },
        origin="test",
    )
    sink = SinkConfig(
        kind="alertmanager", name="am", url=f"http://127.0.0.1:{server.server_port}", timeout_s=2.0
    )
    config = replace(config, alerts=replace(config.alerts, sinks=(sink,), retry_initial_s=0.2))
    daemon = Daemon(config, SimSource("reference-b300", start_s=start, job_session=job.pid))
    daemon.start()
    loop = threading.Thread(target=daemon.run_forever, daemon=True)
    loop.start()
    rank_pids: list[int] = []
    refused_at: float | None = None  # alert mode: when the SIGTERM rung was refused (not armed)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            snap = daemon.snapshots.latest()
            jobs = {j.job: j for j in snap.jobs} if snap else {}
            if "qwen3-32b-ft" in jobs and len(jobs["qwen3-32b-ft"].ranks) == 8 and not rank_pids:
                rank_pids = [r.pid for r in jobs["qwen3-32b-ft"].ranks if r.pid]
            if (
                mode == "kill"
                and job.poll() is not None
                and Receiver.posts
                and any(
                    a["endsAt"]
                    and a["endsAt"] <= time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 1))
                    for _, _, body in Receiver.posts
                    for a in body
                )
            ):
                break
            if mode == "alert" and Receiver.posts and refused_at is None:
                refused = [
                    e
                    for e in daemon.store.since(0, 1000)
                    if e.kind == "action"
                    and e.payload.get("result") == "not_armed"
                    and e.payload.get("action") == "sigterm"
                ]
                refused_at = time.monotonic() if refused else None
            if refused_at is not None and time.monotonic() - refused_at > 8.0:
                break  # the SIGTERM rung came and went unarmed; past its SIGKILL grace too
            time.sleep(0.5)
        events = [e.to_dict() for e in daemon.store.since(0, 1000)]
        alive_at_end = [_alive(p) for p in rank_pids]
    finally:
        daemon.stop()
        loop.join(15)
        daemon.close()
        server.shutdown()
        for p in (job, bystander):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    actions = [
        (e["payload"]["action"], e["payload"]["result"], e["time"]) for e in events if e["kind"] == "action"
    ]
    first = {}
    for a, r, t in actions:
        first.setdefault((a, r), t)
    evidence = [e for e in events if e["kind"] == "evidence"]
    assert evidence, actions
    bundle = Path(evidence[0]["payload"]["path"])
    assert (bundle / "index.json").exists()
    assert any(e["kind"] == "verdict" and e["payload"]["to"] == "deadlock_suspected" for e in events)
    # a real Alertmanager v2 request arrived, after the capture started
    am = [(t, body) for t, path, body in Receiver.posts if path == "/api/v2/alerts"]
    assert am, Receiver.posts
    labels = am[0][1][0]["labels"]
    assert labels["training_job"] == "qwen3-32b-ft" and labels["service"] == "gpu-watchdog"
    assert first[("capture", "started")] <= am[0][0]
    assert len(rank_pids) == 8
    if mode == "kill":
        assert first[("alert", "queued")] <= first[("sigterm", "started")]
        assert not any(alive_at_end), "every rank of the job must be gone"
        assert bystander.returncode == -signal.SIGKILL  # alive until the test killed it itself
        resolved = [a for _, body in am for a in body if a["endsAt"] and a["labels"] == labels]
        assert resolved, "the alert resolves once the job is gone"
    else:
        assert not [a for a in actions if a[0] in ("sigterm", "sigkill") and a[1] in ("started", "ok")]
        assert all(alive_at_end), "alert mode never signals"

    # Each step is one structured log line (gpu_triage.journal.logs), as journalctl shows them.
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]
    assert all("\n" not in line for line in lines)

    def line(prefix: str) -> str:
        found = [x for x in lines if x.startswith(prefix)]
        assert found, f"no line starting {prefix!r} in:\n" + "\n".join(lines)
        return found[0]

    assert "signals=" in line("verdict job=qwen3-32b-ft healthy -> deadlock_suspected")
    assert f"path={bundle}" in line("evidence job=qwen3-32b-ft bundle written")
    assert "sink=am sink_kind=alertmanager http_status=200" in line(
        "alert_delivery job=qwen3-32b-ft GpuTrainingDeadlock firing delivered"
    )
    if mode == "kill":
        term = line("kill job=qwen3-32b-ft sigterm ok")
        assert "signal=SIGTERM" in term or "signal=15" in term, term
        assert all(str(pid) in term for pid in rank_pids), term
    else:
        assert "mode=alert" in line("refusal job=qwen3-32b-ft no sigterm: not_armed")
        assert not [x for x in lines if x.startswith("kill ")]


@pytest.mark.slow
def test_a_job_the_daemon_killed_reads_killed_and_pages_nothing_new(tmp_path: Path):
    """After the kill the job is ``killed`` - never ``stalled`` (a new GpuTrainingStalled page for the
    job the daemon just ended) nor ``healthy``. The ranks are real processes with a rank environment
    that the test does not reap at once (as `make demo`'s launcher): dead, their pids linger as
    zombies and their last progress records (one rank in epoch_end, one frozen in train) stay readable.
    The receiver is a real loopback server; every page it gets is the deadlock's, fired then resolved."""
    from gpu_triage.contract import ProgressWriter
    from gpu_triage.telemetry.none import NoneSource
    from tests.corpus.live import spawn_rank

    Receiver.posts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    job = f"killed-{os.getpid()}"
    ranks = [spawn_rank(r, 2, job) for r in range(2)]
    progress = tmp_path / "progress"
    host = socket.gethostname()
    writers = [
        ProgressWriter(job, r, r, 2, directory=progress, pid=p.pid, host=host) for r, p in enumerate(ranks)
    ]
    for w in writers:
        w.phase("train")
    config = override(
        load_config(None, {}),
        {
            "daemon.listen": "127.0.0.1:0",
            "daemon.state_dir": str(tmp_path / "state"),
            "daemon.period_s": 0.5,
            "progress.dir": str(progress),
            "actions.mode": "kill",
            "actions.capture_after_s": 0.0,
            "actions.alert_after_s": 0.0,
            "actions.capture_timeout_s": 5.0,
            "actions.sigterm_after_s": 1.0,
            "actions.sigkill_grace_s": 2.0,
            "detector.fast_min_s": 2.0,
            "detector.disagree_min_s": 2.0,
            "detector.stall_min_s": 2.0,
            "detector.confirm_after_s": 3.0,
            "stacks.enabled": False,
        },
        origin="test",
    )
    sink = SinkConfig(kind="webhook", name="hook", url=f"http://127.0.0.1:{server.server_port}/hook")
    config = replace(config, alerts=replace(config.alerts, sinks=(sink,), retry_initial_s=0.2))
    daemon = Daemon(config, NoneSource(), serve_http=False)
    daemon.start()
    loop = threading.Thread(target=daemon.run_forever, daemon=True)
    loop.start()
    verdicts: list[str] = []

    def watch(seconds: float, until=lambda: False) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not until():
            snap = daemon.snapshots.latest()
            mine = [j for j in (snap.jobs if snap else ()) if j.job == job]
            if mine and (not verdicts or verdicts[-1] != mine[0].verdict):
                verdicts.append(str(mine[0].verdict))
            time.sleep(0.2)

    try:
        for step in range(1, 6):
            for w in writers:
                w.step(step)
            time.sleep(1.0)
        writers[0].phase("epoch_end", lease_s=120)  # rank 1 stays in train: the epoch-end deadlock
        watch(90, until=lambda: not any(_alive(p.pid) for p in ranks))
        assert not any(_alive(p.pid) for p in ranks), f"the daemon did not kill the job: {verdicts}"
        watch(12)  # unreaped: zombies with their last records, as the demo's ranks are
        for p in ranks:
            p.wait(timeout=10)
        watch(6)  # reaped: the files' pids are gone; the inspector still remembers the ranks
    finally:
        daemon.stop()
        loop.join(15)
        daemon.close()
        server.shutdown()
        for p in ranks:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert "deadlock_confirmed" in verdicts, verdicts
    after = verdicts[verdicts.index("deadlock_confirmed") + 1 :]
    assert after and set(after) == {"killed"}, verdicts
    pages = [body for _, _, body in Receiver.posts]
    assert pages and {p["condition"] for p in pages} == {"deadlock"}, pages
    assert pages[-1]["status"] == "resolved", pages[-1]
