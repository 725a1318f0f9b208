"""Issue 11: the daemon and triage under hostile and broken input lose nothing and stay honest.

Each test pins one item of the issue (the number in its name) and failed before the fix."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from gpu_triage.actions.delivery import post_json
from gpu_triage.classify.power_table import TableError
from gpu_triage.classify.table_files import load_table_file
from gpu_triage.daemon.config import ConfigError, load_config, load_secret, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.journal.eventstore import EventStore
from gpu_triage.model.samples import TelemetryUnavailable
from gpu_triage.model.states import Verdict
from gpu_triage.recordings.nvsmi_csv import NvsmiCsvReader, RecordingError
from gpu_triage.serving.metrics import make_registry, render
from gpu_triage.signals.progress import ProgressReader
from gpu_triage.signals.progress_model import ProgressFormatError, parse_record
from gpu_triage.telemetry.factory import make_source
from gpu_triage.telemetry.none import NoneSource
from gpu_triage.triage.engine import TriageInputError, TriageOptions, triage_file
from gpu_triage.verdicts.detector import Detector
from tests.conftest import REPO

HOST = socket.gethostname()


def record(job: str, rank: int, world: int = 2, **extra: object) -> dict[str, object]:
    return {
        "job": job,
        "rank": rank,
        "local_rank": rank,
        "world_size": world,
        "pid": os.getpid(),
        "host": HOST,
        "step": 3,
        "epoch": 0,
        "tokens": 0,
        "phase": "train",
        "lease_until": None,
        "time": time.time(),
        **extra,
    }


def write(progress: Path, job: str, name: str, data: bytes | dict[str, object]) -> Path:
    (progress / job).mkdir(parents=True, exist_ok=True)
    path = progress / job / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def daemon_for(tmp_path: Path, **values: object) -> Daemon:
    config = override(
        load_config(None, {}),
        {
            "daemon.listen": "127.0.0.1:0",
            "daemon.state_dir": str(tmp_path / "state"),
            "progress.dir": str(tmp_path / "progress"),
            **values,
        },
        origin="test",
    )
    return Daemon(config, NoneSource(), serve_http=False)


# ----------------------------------------------------------------------------------- item 1


def test_item1_nested_progress_file_is_a_per_file_error_not_a_blind_node(tmp_path: Path, caplog) -> None:
    progress = tmp_path / "progress"
    write(progress, "good", "rank-0.json", record("good", 0, 1))
    bad = write(progress, "evil", "rank-0.json", b"[" * 60_000)
    daemon = daemon_for(tmp_path)
    daemon.start()
    try:
        with caplog.at_level(logging.WARNING, logger="gpu_triage.signals.progress"):
            snaps = [daemon.cycle(time.time() + i) for i in range(3)]
    finally:
        daemon.close()
    snap = snaps[-1]
    jobs = {j.job for j in snap.jobs}
    assert "good" in jobs and "evil" not in jobs  # (other processes on the machine may add jobs)
    errors = [e for e in snap.input_errors if e["kind"] == "progress_file"]
    assert errors and errors[0]["where"] == str(bad) and "nested" in errors[0]["error"]
    # logged once, not every cycle
    assert sum(str(bad) in r.getMessage() for r in caplog.records) == 1
    holder = daemon.snapshots
    body, _ = render(make_registry(holder, process_metrics=False))
    assert b'gpu_watchdog_input_errors{kind="progress_file"} 1.0' in body


def test_item1_parse_record_raises_only_its_own_error_for_deep_or_constant_input() -> None:
    for data in (b"[" * 60_000, b"{" * 30_000, b'{"a":' * 20_000, b"[NaN]"):
        with pytest.raises(ProgressFormatError):
            parse_record(data)


def test_item1_a_job_the_detector_cannot_judge_stays_in_that_job(monkeypatch) -> None:
    from gpu_triage.verdicts.views import JobView, RankView

    detector = Detector()
    original = detector._job

    def flaky(now, job, *args):
        if job.job == "broken":
            raise ZeroDivisionError("boom")
        return original(now, job, *args)

    monkeypatch.setattr(detector, "_job", flaky)
    jobs = [
        JobView(name, (RankView(rank=0, pid=1, gpu=None, step=1),), has_progress=True)
        for name in ("broken", "fine")
    ]
    out = {j.job: j for j in detector.update(time.time(), [], jobs)}
    assert set(out) == {"broken", "fine"}
    assert out["broken"].cause == "detector_error" and not out["broken"].kill_worthy
    assert out["broken"].verdict is Verdict.TELEMETRY_LOST
    assert "ZeroDivisionError" in detector.job_errors["broken"]
    assert "fine" not in detector.job_errors


def test_item1_daemon_reports_a_job_it_cannot_judge_once_and_keeps_the_others(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    progress = tmp_path / "progress"
    write(progress, "good", "rank-0.json", record("good", 0, 1))
    write(progress, "cursed", "rank-0.json", record("cursed", 0, 1))
    daemon = daemon_for(tmp_path)
    original = daemon.detector._job

    def flaky(now, job, *args):
        if job.job == "cursed":
            raise KeyError("a bug in the detector")
        return original(now, job, *args)

    monkeypatch.setattr(daemon.detector, "_job", flaky)
    daemon.start()
    try:
        with caplog.at_level(logging.ERROR, logger="gpu_watchdog"):
            snaps = [daemon.cycle(time.time() + i) for i in range(3)]
    finally:
        daemon.close()
    jobs = {j.job: j for j in snaps[-1].jobs}
    assert jobs["cursed"].cause == "detector_error" and not jobs["cursed"].kill_worthy
    assert jobs["good"].cause != "detector_error"
    assert [e["where"] for e in snaps[-1].input_errors if e["kind"] == "job"] == ["cursed"]
    assert sum("could not judge job cursed" in r.getMessage() for r in caplog.records) == 1


def test_item1_healthz_turns_failing_when_the_cycle_keeps_failing(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from gpu_triage.serving.api import create_app

    daemon = daemon_for(tmp_path)
    daemon.start()
    try:
        daemon.cycle(time.time())
        app = create_app(
            snapshots=daemon.snapshots,
            events=None,
            table=dict,
            control=daemon.control,
            token=None,
            period_s=1.0,
        )
        client = TestClient(app)
        assert client.get("/healthz").status_code == 200
        for _ in range(3):
            daemon._cycle_failed(RuntimeError("the loop is broken"))
        response = client.get("/healthz")
        assert response.status_code == 503 and response.json()["status"] == "failing"
        daemon.cycle(time.time())
        daemon._cycle_failed(None)
        assert client.get("/healthz").status_code == 200
    finally:
        daemon.close()


def test_item1_a_daemon_whose_first_cycles_all_fail_is_failing_not_starting(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from gpu_triage.serving.api import create_app

    class Broken(NoneSource):
        def sample(self, now):
            raise OSError("the telemetry source is broken")

    config = daemon_for(tmp_path).config
    daemon = Daemon(config, Broken(), serve_http=False)
    daemon.start()
    app = create_app(
        snapshots=daemon.snapshots, events=None, table=dict, control=daemon.control, token=None, period_s=1.0
    )
    client = TestClient(app)
    thread = threading.Thread(target=daemon.run_forever, daemon=True)
    daemon.config = override(config, {"daemon.period_s": 0.1}, origin="test")
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and daemon.failed_cycles < 3:
            time.sleep(0.05)
        response = client.get("/healthz")
    finally:
        daemon.stop()
        thread.join(10)
        daemon.close()
    assert response.status_code == 503 and response.json()["status"] == "failing"


# ----------------------------------------------------------------------------------- item 2


def test_item2_store_falls_back_to_memory_then_reattaches_with_everything(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")  # the store cannot be created
    store = EventStore(blocker, 1000.0, memory_fallback=True, reattach_interval_s=1.0)
    assert store.memory_only and store.memory_reason
    store.append("alert", {"n": 1}, time_s=1000.0)
    store.kv_set("actions.kill_times", [999.0], 1000.0)
    item = store.outbox_put("am", "k1", {"alert": 1}, 1000.0)
    assert [e.payload.get("n") for e in store.since(0)] == [None, 1]  # the memory_only event, then ours
    assert not store.maybe_reattach(1001.5)  # still blocked
    blocker.unlink()
    assert store.maybe_reattach(1003.0)
    assert not store.memory_only
    assert (blocker / "events.sqlite3").exists()
    assert store.kv_get("actions.kill_times") == [999.0]
    assert [o.id for o in store.outbox_due(2000.0)] == [item]
    kinds = [(e.kind, e.payload.get("event"), e.payload.get("n")) for e in store.since(0)]
    assert ("alert", None, 1) in kinds and ("store", "reattached", None) in kinds
    store.close()


@pytest.mark.isolated  # an armed daemon: a PID namespace of its own (tests/isolation.py)
def test_item2_daemon_without_a_writable_store_still_has_an_action_engine(tmp_path: Path) -> None:
    # the state directory is there (an uncreatable one exits 2: test_daemon.py) but its database
    # cannot be opened - as on a disk that filled up: the store runs on memory
    (tmp_path / "state" / "events.sqlite3").mkdir(parents=True)
    daemon = daemon_for(tmp_path, **{"actions.mode": "alert"})
    daemon.start()
    try:
        assert daemon.actions is not None
        snap = daemon.cycle(time.time())
        assert [e["kind"] for e in snap.input_errors] == ["store"]
    finally:
        daemon.close()


# ----------------------------------------------------------------------------------- item 8


def test_item8_a_corrupt_store_keeps_silences_kill_budget_and_signatures(tmp_path: Path) -> None:
    store = EventStore(tmp_path, 1000.0)
    store.kv_set("control.silences", [{"job": "j", "until": 5000.0}], 1000.0)
    store.kv_set("actions.kill_times", [990.0, 995.0], 1000.0)
    store.kv_set("actions.hang_signatures", {"j": ["sig"]}, 1000.0)
    store.close()
    db = tmp_path / "events.sqlite3"
    with open(db, "r+b") as f:  # destroy the header and the first pages
        f.write(b"\x00garbage" * 2048)
    again = EventStore(tmp_path, 2000.0)
    assert list(tmp_path.glob("events.sqlite3.corrupt-*"))
    assert again.kv_get("control.silences") == [{"job": "j", "until": 5000.0}]
    assert again.kv_get("actions.kill_times") == [990.0, 995.0]
    assert again.kv_get("actions.hang_signatures") == {"j": ["sig"]}
    moved = [e for e in again.since(0) if e.payload.get("event") == "moved_aside"]
    assert moved and moved[0].payload["safety_records_restored"] == 3
    again.close()


# ----------------------------------------------------------------------------------- item 3

CSV_HEADER = "timestamp, index, power.draw [W], utilization.gpu [%]\n"


def triage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_triage", "triage", "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_item3_a_huge_gpu_index_is_a_clear_error_not_gigabytes(tmp_path: Path) -> None:
    csv = tmp_path / "big.csv"
    csv.write_text(CSV_HEADER + "2024/01/01 00:00:00.000, 1000000, 100.0 W, 50 %\n")
    result = triage(str(csv))
    assert result.returncode == 2, result.stderr
    assert f"{csv}:2:2: index: 1000000 is not below 1024" in result.stderr
    with pytest.raises(TelemetryUnavailable, match="index: 1000000"):
        make_source(f"replay:{csv}")


def test_item3_gpus_flag_and_line_length_are_bounded(tmp_path: Path) -> None:
    csv = tmp_path / "ok.csv"
    csv.write_text("timestamp, power.draw [W]\n2024/01/01 00:00:00.000, 100.0 W\n")
    result = triage("--gpus", "1000000000", str(csv))
    assert result.returncode == 2 and "--gpus: expected a GPU count in (0, 1024]" in result.stderr
    long = tmp_path / "long.csv"
    long.write_bytes(CSV_HEADER.encode() + b"2024/01/01 00:00:00.000, 0, 1" + b"0" * (3 << 20) + b"\n")
    with pytest.raises(RecordingError, match=r"long.csv:2:1: line longer than 1048576 bytes"):
        NvsmiCsvReader(long, chunk_bytes=1 << 16).read_all()


def test_item3_table_files_are_read_with_a_bound(tmp_path: Path) -> None:
    with pytest.raises(TableError, match="not a regular file"):
        load_table_file("/dev/zero")
    big = tmp_path / "big.toml"
    big.write_bytes(b"# " + b"x" * (2 << 20) + b"\n")
    with pytest.raises(TableError, match="more than 1048576"):
        load_table_file(big)
    daemon = daemon_for(tmp_path, **{"classifier.table": "/dev/zero"})
    with pytest.raises(ConfigError, match=r"classifier.table: .*not a regular file"):
        daemon.start()


# ----------------------------------------------------------------------------------- item 4


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("classifier.table", "/nonexistent/table.toml", "no such table file"),
        ("classifier.model", "Z9000", "no built-in table for model 'Z9000'"),
    ],
)
def test_item4_table_and_model_are_validated_at_start(
    tmp_path: Path, key: str, value: str, message: str
) -> None:
    daemon = daemon_for(tmp_path, **{key: value})
    with pytest.raises(ConfigError, match=f"{key}: .*{message}"):
        daemon.start()


def test_item4_run_exits_2_for_an_unreadable_table(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[classifier]\ntable = "/nonexistent/table.toml"\n')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_triage",
            "run",
            "--config",
            str(config),
            "--source",
            "none",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 2 and "classifier.table" in result.stderr, result.stderr


# ----------------------------------------------------------------------------------- item 5


def test_item5_non_finite_numbers_are_refused(tmp_path: Path) -> None:
    csv = tmp_path / "ok.csv"
    csv.write_text(CSV_HEADER + "2024/01/01 00:00:00.000, 0, 100.0 W, 50 %\n")
    for flag in ("--deadlock-after", "--power-limit"):
        for value in ("nan", "inf", "-inf"):
            result = triage(flag, value, str(csv))
            assert result.returncode == 2 and f"{flag}: expected" in result.stderr, (flag, value)
    with pytest.raises(TriageInputError, match="deadlock_after_s"):
        triage_file(csv, TriageOptions(deadlock_after_s=float("nan")))
    with pytest.raises(ConfigError, match="detector"):
        load_config(None, {"GPU_WATCHDOG_DETECTOR__FAST_MIN_S": "nan"})


def test_item5_a_written_nan_in_a_recording_is_an_error_a_missing_cell_is_not(tmp_path: Path) -> None:
    csv = tmp_path / "nan.csv"
    rows = ["2024/01/01 00:00:00.000, 0, 100.0 W, 50 %", "2024/01/01 00:00:01.000, 0, [N/A], 50 %"]
    csv.write_text(CSV_HEADER + "\n".join(rows) + "\n")
    assert len(NvsmiCsvReader(csv).read_all()) == 2
    csv.write_text(CSV_HEADER + "\n".join([*rows, "2024/01/01 00:00:02.000, 0, NaN W, 50 %"]) + "\n")
    with pytest.raises(RecordingError, match=r"nan.csv:4:3: power.draw: 'NaN W' is not finite"):
        NvsmiCsvReader(csv).read_all()


def test_item5_json_output_is_json_even_with_non_finite_values(tmp_path: Path, monkeypatch, capsys) -> None:
    from gpu_triage.cli import main as cli
    from gpu_triage.triage import engine

    csv = tmp_path / "ok.csv"
    csv.write_text(CSV_HEADER + "2024/01/01 00:00:00.000, 0, 100.0 W, 50 %\n")
    real = engine.triage_file

    def with_nan(path, opts, progress=None):
        result = real(path, opts)
        doc = result.to_json()
        monkeypatch.setattr(
            result, "to_json", lambda: {**doc, "power_limit_w": float("nan"), "x": [float("inf")]}
        )
        return result

    monkeypatch.setattr(engine, "triage_file", with_nan)
    assert cli.main(["triage", "--json", "--model", "H100", str(csv)]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
    assert doc["power_limit_w"] is None and doc["x"] == [None]


# ----------------------------------------------------------------------------------- item 6


def test_item6_sink_timeout_bounds_the_whole_attempt() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def drip() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for i in range(40):
                if stop.wait(1.5):
                    return
                try:
                    conn.sendall(f"X-Drip-{i}: 1\r\n".encode())
                except OSError:
                    return

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    started = time.monotonic()
    result = post_json(f"http://127.0.0.1:{listener.getsockname()[1]}/", {"a": 1}, timeout_s=2.0)
    elapsed = time.monotonic() - started
    stop.set()
    listener.close()
    assert not result.ok and result.error == "timed out"
    assert elapsed < 5.0, f"one attempt took {elapsed:.1f} s with timeout_s = 2"


# ----------------------------------------------------------------------------------- item 7


def test_item7_sighup_rereads_the_token_and_reports_no_false_changes(tmp_path: Path, caplog) -> None:
    token = tmp_path / "token"
    token.write_text("old-token\n")
    token.chmod(0o600)
    config_file = tmp_path / "config.toml"
    config_file.write_text(f'[auth]\ntoken_file = "{token}"\n')
    flags = {
        "daemon.listen": "127.0.0.1:0",
        "daemon.state_dir": str(tmp_path / "state"),
        "daemon.source": "none",
        "progress.dir": str(tmp_path / "progress"),
    }
    config = override(load_config(config_file, {}), flags, origin="command line")
    daemon = Daemon(config, NoneSource(), config_path=config_file, overrides=flags)
    daemon.start()
    try:
        daemon.cycle(time.time())

        def disarm(secret: str) -> int:
            return httpx.post(
                f"{daemon.url}/disarm", headers={"Authorization": f"Bearer {secret}"}, timeout=5
            ).status_code

        assert disarm("old-token") == 202
        token.write_text("new-token\n")
        with caplog.at_level(logging.INFO, logger="gpu_watchdog"):
            daemon.reload()
        assert disarm("old-token") == 403
        assert disarm("new-token") == 202
        assert not [r for r in caplog.records if "takes effect after a restart" in r.getMessage()]
        assert any("configuration reloaded" in r.getMessage() for r in caplog.records)
    finally:
        daemon.close()


# ----------------------------------------------------------------------------------- item 9


@pytest.mark.parametrize(
    ("mode", "text", "message"),
    [
        (0o602, "t0ken\n", "world-writable"),
        (0o620, "t0ken\n", "group-writable"),
        (0o600, "t0ken\nsecond line\n", "more than one line"),
    ],
)
def test_item9_secret_files_refused(tmp_path: Path, mode: int, text: str, message: str) -> None:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(ConfigError, match=message):
        load_secret(path)


def test_item9_group_readable_secret_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("t0ken\n")
    path.chmod(0o640)
    assert load_secret(path) == "t0ken"


def test_item9_host_header_must_name_this_daemon(tmp_path: Path) -> None:
    daemon = daemon_for(tmp_path, **{"daemon.allowed_hosts": ["node01.cluster.example"]})
    daemon.serve_http = True
    daemon.start()
    try:
        daemon.cycle(time.time())
        url = daemon.url
        assert url is not None
        port = url.rsplit(":", 1)[1]

        def get(host: str) -> int:
            return httpx.get(f"{url}/status", headers={"Host": host}, timeout=5).status_code

        assert get(f"attacker.example:{port}") == 421
        assert get("rebind.attacker.example") == 421
        for ok in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            "node01.cluster.example",
            f"[::1]:{port}",
            f"{socket.gethostname()}:{port}",
            "10.1.2.3",
        ):
            assert get(ok) == 200, ok
    finally:
        daemon.close()


def test_item9_deeply_nested_toml_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"nested too deeply|invalid TOML"):
        load_config(config, {})
    table = tmp_path / "table.toml"
    table.write_text("x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n")
    with pytest.raises(TableError):
        load_table_file(table)
    result = subprocess.run(
        [sys.executable, "-m", "gpu_triage", "run", "--config", str(config), "--source", "none"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr


def test_item9_a_1970_timestamp_is_refused(tmp_path: Path) -> None:
    csv = tmp_path / "old.csv"
    csv.write_text(
        CSV_HEADER + "1970/01/01 00:00:00.000, 0, 100.0 W, 50 %\n2024/01/01 00:00:00.000, 0, 1 W, 0 %\n"
    )
    with pytest.raises(
        RecordingError, match=r"old.csv:2:1: timestamp: '1970/01/01 00:00:00.000' is before 2000"
    ):
        NvsmiCsvReader(csv).read_all()


def test_item9_rank_00_is_refused_and_reported(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    write(progress, "j", "rank-0.json", record("j", 0))
    alias = write(progress, "j", "rank-00.json", record("j", 0, step=99))
    write(progress, "j", "rank-99999999.json", record("j", 0))
    view = ProgressReader(progress, host=HOST).read(time.time())
    assert [r.step for r in view.jobs["j"].ranks.values()] == [3]
    errors = {e.path.name: e.error for e in view.errors}
    assert "leading zero" in errors[alias.name]
    assert "rank above" in errors["rank-99999999.json"]
