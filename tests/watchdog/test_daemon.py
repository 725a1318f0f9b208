"""The daemon for real: a subprocess on a free port checked over HTTP (the ``make run`` path with the
built-in simulation and its simulated job, and ``run`` replaying a recording with a config file,
SIGHUP and SIGTERM), and in-process with a fake NVML whose call hangs (the only fake)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from gpu_triage.contract import ProgressWriter
from gpu_triage.daemon.config import load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.model.states import GpuState, Verdict
from gpu_triage.telemetry.none import NoneSource
from gpu_triage.telemetry.nvml import NvmlSource
from tests.conftest import REPO, require_binary
from tests.ports import free_port
from tests.watchdog import fake_nvml

GPU_WATCHDOG = [sys.executable, "-m", "gpu_triage"]


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except (httpx.HTTPError, KeyError, ValueError) as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last: {last!r}")


def stop(proc: subprocess.Popen, timeout_s: float = 15) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


@pytest.mark.slow
def test_make_run_serves_8_b300_and_reports_the_epoch_end_deadlock(tmp_path: Path):
    """`make run`'s path (demo-run): health 200, 8 simulated B300 GPUs, and deadlock_suspected for the
    simulated job once the scenario reaches the epoch-end deadlock (started 100 s into its timeline).
    Beside it, processes of other runs carrying a rank environment (one even the demo job's name) are
    never listed: the demo judges its simulated job only (issue 28)."""
    from tests.corpus.live import spawn_rank

    strangers = [spawn_rank(0, 2, "another-run"), spawn_rank(3, 16, "qwen3-32b-ft")]
    port = free_port()
    proc = subprocess.Popen(
        [
            *GPU_WATCHDOG,
            "demo-run",
            "--state-dir",
            str(tmp_path / "state"),
            "--port",
            str(port),
            "--sim-skip",
            "95",
        ],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(f"{base}/healthz", timeout=2).status_code == 200, 60, "/healthz 200")
        status = httpx.get(f"{base}/status", timeout=2).json()
        assert status["source"] == "sim" and status["mode"] == "observe" and status["armed"] is False
        assert len(status["gpus"]) == 8
        assert {g["model"] for g in status["gpus"]} == {"B300"}
        assert {g["power_limit_w"] for g in status["gpus"]} == {1100.0}

        def suspected():
            jobs = httpx.get(f"{base}/status", timeout=2).json()["jobs"]
            return next(
                (
                    j
                    for j in jobs
                    if j["job"] == "qwen3-32b-ft"
                    and j["verdict"] in ("deadlock_suspected", "deadlock_confirmed")
                ),
                None,
            )

        job = wait_for(suspected, 90, "deadlock_suspected")
        assert len(job["ranks"]) == 8
        listed = httpx.get(f"{base}/status", timeout=2).json()["jobs"]
        assert [j["job"] for j in listed] == ["qwen3-32b-ft"], listed
        stranger_pids = {p.pid for p in strangers}
        assert not stranger_pids & {r.get("pid") for j in listed for r in j["ranks"]}, listed
        gpus = httpx.get(f"{base}/gpus", timeout=2).json()
        assert {g["state"] for g in gpus} == {"checkpoint_or_deadlock"}
        events = httpx.get(f"{base}/events?since=0&limit=1000", timeout=2).json()["events"]
        assert any(e["kind"] == "verdict" and e["payload"]["to"] == "deadlock_suspected" for e in events)
        wait_for(
            lambda: any(
                e["kind"] == "evidence"
                for e in httpx.get(f"{base}/events?since=0&limit=1000", timeout=2).json()["events"]
            ),
            60,
            "the evidence bundle (captured in observe mode too)",
        )
    finally:
        code = stop(proc)
        out = proc.stdout.read()
        for p in strangers:
            p.kill()
            p.wait()
    assert code == 0, out[-3000:]
    assert "SIMULATION" in out and f"curl -s 127.0.0.1:{port}/status" in out
    assert "deadlock_suspected" in out  # the one-line summary printed it
    # The daemon's log: the deadlock and its evidence, each one structured line (gpu_triage.journal.logs).
    lines = [line.partition("gpu_watchdog.events: ")[2] for line in out.splitlines()]
    verdict = [x for x in lines if x.startswith("verdict job=qwen3-32b-ft ") and "-> deadlock_suspected" in x]
    assert verdict and "signals=" in verdict[0] and "onset=" in verdict[0], out[-3000:]
    evidence = [x for x in lines if x.startswith("evidence job=qwen3-32b-ft bundle written path=")]
    assert evidence, out[-3000:]
    assert Path(evidence[0].split("path=")[1].split()[0]).is_dir()


def write_config(path: Path, state: Path, progress: Path, port: int, mode: str = "observe") -> Path:
    path.write_text(
        f'[daemon]\nnode = "test-node"\nlisten = "127.0.0.1:{port}"\nstate_dir = "{state}"\nperiod_s = 0.2\n'
        f'[progress]\ndir = "{progress}"\n[actions]\nmode = "{mode}"\n'
        # no py-spy sampling: on a shared machine it would judge other people's jobs from their stacks
        "[stacks]\nenabled = false\n"
    )
    return path


@pytest.mark.slow
@pytest.mark.isolated  # armed (alert) after the reload: a PID namespace of its own (tests/isolation.py)
def test_run_replays_a_recording_reloads_on_sighup_and_stops_on_sigterm(tmp_path: Path):
    from gpu_triage.telemetry.recording_writer import write_nvsmi_csv
    from gpu_triage.telemetry.sim import Scenario

    rec = tmp_path / "hang.csv"
    write_nvsmi_csv(
        rec,
        Scenario.symmetric_hang(20, 600, model="H100", gpus=4, power_limit_w=700.0),
        120,
        rate_hz=5,
        with_index=True,
    )
    port = free_port()
    cfg = write_config(tmp_path / "config.toml", tmp_path / "state", tmp_path / "progress", port)
    proc = subprocess.Popen(
        [*GPU_WATCHDOG, "run", "--config", str(cfg), "--source", f"replay:{rec}"],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(f"{base}/healthz", timeout=2).status_code == 200, 60, "/healthz 200")
        first = httpx.get(f"{base}/status", timeout=2).json()
        assert first["node"] == "test-node" and first["source"] == "replay" and len(first["gpus"]) == 4
        assert {g["state"] for g in first["gpus"]} == {"compute"}
        # /metrics of the live daemon is clean for promtool
        metrics = httpx.get(f"{base}/metrics", timeout=2).text
        states = [line for line in metrics.splitlines() if line.startswith("gpu_watchdog_state{")]
        assert any('gpu="0"' in line and 'Hostname="test-node"' in line for line in states), states[:3]
        promtool = require_binary("promtool", "Debian package prometheus")
        check = subprocess.run([promtool, "check", "metrics"], input=metrics, capture_output=True, text=True)
        assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check
        # SIGHUP reloads the file: the mode changes without a restart
        write_config(cfg, tmp_path / "state", tmp_path / "progress", port, mode="alert")
        os.kill(proc.pid, signal.SIGHUP)
        wait_for(lambda: httpx.get(f"{base}/status", timeout=2).json()["mode"] == "alert", 15, "mode alert")
        # the recording's hang (at 20 s, replayed in real time) puts every GPU in the spin band
        wait_for(
            lambda: (
                {g["state"] for g in httpx.get(f"{base}/gpus", timeout=2).json()}
                == {"checkpoint_or_deadlock"}
            ),
            40,
            "spin band",
        )
    finally:
        code = stop(proc)
        out = proc.stdout.read()
    assert code == 0, out[-3000:]
    assert "configuration reloaded" in out


def test_bad_config_exits_2_naming_file_key_and_value(tmp_path: Path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[daemon]\nperiod_s = "fast"\n')
    r = subprocess.run(
        [*GPU_WATCHDOG, "run", "--config", str(cfg)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2
    assert f'{cfg}:2: daemon.period_s: expected a number between 0.1 and 60, got "fast"' in r.stderr


def test_port_in_use_exits_2_with_a_clear_message(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(
            [
                *GPU_WATCHDOG,
                "run",
                "--source",
                "none",
                "--listen",
                f"127.0.0.1:{port}",
                "--state-dir",
                str(tmp_path / "s"),
                "--progress-dir",
                str(tmp_path / "p"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 2
    assert f"127.0.0.1:{port} is in use" in r.stderr


def _run_none(state: Path, progress: Path, port: int) -> list[str]:
    return [
        *GPU_WATCHDOG,
        "run",
        "--source",
        "none",
        "--listen",
        f"127.0.0.1:{port}",
        "--state-dir",
        str(state),
        "--progress-dir",
        str(progress),
    ]


def test_a_second_daemon_on_the_same_state_dir_exits_2_naming_the_first(tmp_path: Path):
    """Two daemons on one state directory would share the event store, the kill budget and the alert
    outbox: the second refuses to start (a flock on the directory's lock file), naming the holder's pid,
    and the directory is free again once the first has stopped."""
    state, progress = tmp_path / "state", tmp_path / "progress"
    port = free_port()
    first = subprocess.Popen(
        _run_none(state, progress, port),
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code, 60, "first up")
        second = subprocess.run(
            _run_none(state, progress, free_port()), cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"{state} is in use by another gpu-watchdog (pid {first.pid}" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
    finally:
        assert stop(first) == 0, first.stdout.read()[-3000:]
    # the lock died with the first: a restart on the same directory is no "second daemon"
    again = Daemon(
        override(
            load_config(None, {}),
            {"daemon.state_dir": str(state), "progress.dir": str(progress), "daemon.source": "none"},
            origin="test",
        ),
        NoneSource(),
        serve_http=False,
    )
    again.start()
    again.close()


def test_an_uncreatable_state_dir_exits_2_naming_it(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory\n")
    state = blocker / "state"
    r = subprocess.run(
        _run_none(state, tmp_path / "p", free_port()), cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"daemon.state_dir: cannot create the state directory {state}: Not a directory" in r.stderr


def test_wedged_gpu_keeps_healthz_answering_and_raises_telemetry_lost(tmp_path: Path):
    """A hung NVML call on GPU 5: every cycle still completes within the deadline, /healthz answers
    200, GPU 5 becomes unknown and the job driving it gets telemetry_lost."""
    fake = fake_nvml.hang(gpus=8, stuck=5)
    source = NvmlSource(deadline_s=0.2, nvml=fake, backoff_s=0.5)
    config = override(
        load_config(None, {}),
        {
            "daemon.listen": "127.0.0.1:0",
            "daemon.state_dir": str(tmp_path / "state"),
            "daemon.period_s": 0.3,
            "progress.dir": str(tmp_path / "progress"),
            "detector.telemetry_lost_after_s": 2.0,
        },
        origin="test",
    )
    writer = ProgressWriter("job-a", rank=5, local_rank=5, world_size=8, directory=tmp_path / "progress")
    writer.phase("train")
    writer.step(100)
    daemon = Daemon(config, source)
    daemon.start()
    loop = threading.Thread(target=daemon.run_forever, daemon=True)
    loop.start()
    try:
        base = daemon.url
        assert fake.hang_entered.wait(10), "the fake never hung"

        def lost():
            snap = daemon.snapshots.latest()
            if snap is None:
                return None
            job = next((j for j in snap.jobs if j.job == "job-a"), None)
            return job if job is not None and job.verdict is Verdict.TELEMETRY_LOST else None

        t0 = time.monotonic()
        job = wait_for(lost, 20, "telemetry_lost")
        assert time.monotonic() - t0 < 15
        assert "gpu_reads_failing:5" in job.evidence_dict()["signals"]
        r = httpx.get(f"{base}/healthz", timeout=2)
        assert r.status_code == 200 and r.json()["last_cycle_age_s"] < 2
        gpus = {g["gpu"]: g for g in httpx.get(f"{base}/gpus", timeout=2).json()}
        assert gpus[5]["state"] == GpuState.UNKNOWN and gpus[5]["power_w"] is None
        assert all(gpus[g]["state"] != GpuState.UNKNOWN for g in gpus if g != 5)
        assert daemon.stats.last_duration_s < 1.0
    finally:
        fake.release()
        daemon.stop()
        loop.join(10)
        daemon.close()


def _gpu_states(url: str) -> set[str] | None:
    """The GPU states a daemon reports, or None while it is not answering with a list yet (starting)."""
    r = httpx.get(f"{url}/gpus", timeout=2)
    body = r.json() if r.status_code == 200 else None
    return {g["state"] for g in body} if isinstance(body, list) else None


@pytest.mark.slow
def test_cluster_names_the_node_that_entered_the_spin_band_first(tmp_path: Path):
    """Two real daemons replaying different recordings: node-b's GPUs hang 15 s after node-a's."""
    from gpu_triage.telemetry.recording_writer import write_nvsmi_csv
    from gpu_triage.telemetry.sim import Scenario

    procs, urls = [], []
    try:
        for node, hang_at in (("node-b", 30), ("node-a", 15)):
            rec = tmp_path / f"{node}.csv"
            write_nvsmi_csv(
                rec,
                Scenario.symmetric_hang(hang_at, 600, model="H100", gpus=4, power_limit_w=700.0),
                120,
                rate_hz=5,
                with_index=True,
            )
            port = free_port()
            cfg = write_config(
                tmp_path / f"{node}.toml", tmp_path / node, tmp_path / f"{node}-progress", port
            )
            cfg.write_text(cfg.read_text().replace('node = "test-node"', f'node = "{node}"'))
            procs.append(
                subprocess.Popen(
                    [*GPU_WATCHDOG, "run", "--config", str(cfg), "--source", f"replay:{rec}"],
                    cwd=REPO,
                    start_new_session=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_for(
                lambda url=url: _gpu_states(url) == {"checkpoint_or_deadlock"},
                90,
                f"{url} in the spin band",
            )
        r = subprocess.run(
            [*GPU_WATCHDOG, "cluster", "--json", *urls], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        import json

        doc = json.loads(r.stdout)
        assert r.returncode == 0, r.stderr  # spinning, but no job and no deadlock verdict: exit 0
        assert doc["first_in_spin_band"]["node"] == "node-a"
        order = [n["node"] for n in doc["spin_order"]]
        assert order == ["node-a", "node-b"]
        assert 10 <= doc["spin_order"][1]["after_first_s"] <= 20
        text = subprocess.run(
            [*GPU_WATCHDOG, "cluster", *urls], cwd=REPO, capture_output=True, text=True, timeout=60
        ).stdout
        assert "Entered the spin band first: node-a" in text
    finally:
        for p in procs:
            stop(p)


def test_silences_survive_a_daemon_restart(tmp_path: Path):
    from gpu_triage.telemetry.none import NoneSource

    config = override(
        load_config(None, {}),
        {
            "daemon.state_dir": str(tmp_path / "state"),
            "progress.dir": str(tmp_path / "progress"),
        },
        origin="test",
    )
    first = Daemon(config, NoneSource(), serve_http=False)
    first.start()
    now = time.time()
    kept = first.control.add_silence({"job": "qwen3-32b-ft"}, 3600, "known issue", now)
    gone = first.control.add_silence({"job": "other"}, 3600, "deleted again", now)
    first.cycle(now)
    assert first.control.delete_silence(gone["id"])
    first.cycle(now + 1)
    first.close()

    second = Daemon(config, NoneSource(), serve_http=False)
    second.start()
    try:
        assert [s["id"] for s in second.control.list_silences(now + 2)] == [kept["id"]]
        assert (
            second.control.silences.silenced_by(
                {"job": "qwen3-32b-ft", "verdict": "deadlock_suspected"}, now + 2
            )
            is not None
        )
        assert second.control.list_silences(now + 3601) == []  # expiry is kept too
    finally:
        second.close()


def test_make_run_on_a_port_in_use_exits_2_before_its_banner(tmp_path: Path):
    """Issue 28 (5): `make run` (demo-run) whose port another program holds exits 2 naming the port,
    and prints no banner: its URLs would point at whatever owns the port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = subprocess.run(
            [*GPU_WATCHDOG, "demo-run", "--state-dir", str(tmp_path / "state"), "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 2, r.stderr
    assert f"127.0.0.1:{port} is in use" in r.stderr
    assert f"127.0.0.1:{port}/status" not in r.stdout and "Ctrl-C" not in r.stdout, r.stdout
