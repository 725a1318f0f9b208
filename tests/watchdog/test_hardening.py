"""Issue 11: the daemon and triage under hostile and broken input lose nothing and stay honest.

Each test pins one item of the issue (the number in its name) and failed before the fix."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import pytest

from gpu_triage.config import load_config, override
from gpu_triage.daemon import Daemon
from gpu_triage.detector import Detector
from gpu_triage.eventstore import EventStore
from gpu_triage.metrics import make_registry, render
from gpu_triage.progress import ProgressFormatError, parse_record
from gpu_triage.states import Verdict
from gpu_triage.telemetry.none import NoneSource

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
        with caplog.at_level(logging.WARNING, logger="gpu_triage.progress"):
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
    from gpu_triage.detector import JobView, RankView

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


def test_item1_healthz_turns_failing_when_the_cycle_keeps_failing(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from gpu_triage.api import create_app

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


def test_item2_daemon_without_a_writable_store_still_has_an_action_engine(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a directory")
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
