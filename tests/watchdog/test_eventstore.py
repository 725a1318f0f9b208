"""The event store on real SQLite files: ordering, retention, corruption, a full database, threads."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from gpu_triage.daemon.record import DETECTOR_KEY, PROGRESS_KEY, Recorder
from gpu_triage.journal import kv_mirror
from gpu_triage.journal.eventstore import DB_NAME, SCHEMA_VERSION, EventStore, StoreError
from gpu_triage.journal.kv_mirror import KvMirror
from gpu_triage.model.clock import Timeline
from gpu_triage.model.states import Verdict
from gpu_triage.signals.progress_model import StepTracker
from gpu_triage.verdicts.detector import Detector
from gpu_triage.verdicts.memory import JobMemory
from gpu_triage.verdicts.step_timing import StepTiming

T0 = 1_764_681_000.0
DAY_S = 86400.0


@pytest.fixture
def store(tmp_path: Path) -> EventStore:
    s = EventStore(tmp_path / "state", T0)
    yield s
    s.close()


def test_append_and_read_back_oldest_first(store: EventStore) -> None:
    a = store.append("state_change", {"from": "compute", "to": "idle"}, time_s=T0, gpu=3)
    b = store.append("verdict", {"verdict": "deadlock_suspected"}, time_s=T0 + 1, job="qwen")
    c = store.append("action", {"action": "capture"}, time_s=T0 + 2, job="qwen")
    assert a is not None and b is not None and c is not None and a < b < c
    events = store.since(0)
    assert [(e.kind, e.gpu, e.job) for e in events] == [
        ("state_change", 3, None),
        ("verdict", None, "qwen"),
        ("action", None, "qwen"),
    ]
    assert events[0].payload == {"from": "compute", "to": "idle"}
    assert events[1].to_dict() == {
        "id": b,
        "time": T0 + 1,
        "kind": "verdict",
        "gpu": None,
        "job": "qwen",
        "payload": {"verdict": "deadlock_suspected"},
    }
    assert [e.id for e in store.since(a)] == [b, c]
    assert [e.id for e in store.since(0, limit=2)] == [a, b]
    assert store.since(c) == []
    assert store.last_id() == c


def test_file_is_wal_under_the_state_dir_with_current_schema(store: EventStore) -> None:
    store.append("daemon", {"event": "started"}, time_s=T0)
    assert store.path == store.state_dir / DB_NAME and store.path.is_file()
    db = sqlite3.connect(store.path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"events", "kv", "outbox"} <= tables
    finally:
        db.close()


def test_events_survive_reopening(tmp_path: Path) -> None:
    with EventStore(tmp_path, T0) as s:
        s.append("verdict", {"n": 1}, time_s=T0)
    with EventStore(tmp_path, T0 + 10) as s:
        s.append("verdict", {"n": 2}, time_s=T0 + 10)
        assert [e.payload["n"] for e in s.since(0)] == [1, 2]
        assert s.stats().recovered_total == 0


def test_retention_by_age(store: EventStore) -> None:
    store.retention_s = 7 * DAY_S
    for day in range(10):
        store.append("verdict", {"day": day}, time_s=T0 + day * DAY_S)
    now = T0 + 9 * DAY_S
    assert store.prune(now) == 2  # days 0 and 1 are older than 7 days
    assert [e.payload["day"] for e in store.since(0)] == list(range(2, 10))
    assert store.stats().pruned_total == 2


def test_retention_by_size_keeps_the_newest(store: EventStore) -> None:
    store.max_bytes = 1 << 20
    for i in range(6000):
        store.append("evidence", {"i": i, "blob": "x" * 400}, time_s=T0 + i)
    assert store.used_bytes() > store.max_bytes
    deleted = store.prune(T0 + 6000)
    assert deleted > 0
    assert store.used_bytes() <= store.max_bytes
    kept = [e.payload["i"] for e in store.since(0, limit=10_000)]
    assert kept == list(range(6000 - len(kept), 6000))  # the oldest went first
    assert store.path.stat().st_size <= 1.2 * store.max_bytes  # pages went back to the file system


def test_maybe_prune_runs_at_most_once_per_interval(store: EventStore) -> None:
    store.prune_interval_s = 600
    store.retention_s = 10
    store.append("verdict", {}, time_s=T0)
    assert store.maybe_prune(T0 + 100) == 1
    store.append("verdict", {}, time_s=T0 + 101)
    assert store.maybe_prune(T0 + 200) is None  # too soon: skipped
    assert store.maybe_prune(T0 + 700) == 1


def test_corrupt_file_is_moved_aside_and_a_new_one_started(tmp_path: Path) -> None:
    with EventStore(tmp_path, T0) as s:
        for i in range(50):
            s.append("verdict", {"i": i}, time_s=T0 + i)
    path = tmp_path / DB_NAME
    data = bytearray(path.read_bytes())
    data[:100] = b"\xff" * 100  # destroy the header
    path.write_bytes(bytes(data))

    with EventStore(tmp_path, T0 + 3600) as s:
        [event] = s.since(0)
        assert event.kind == "store" and event.payload["event"] == "moved_aside"
        moved = Path(event.payload["moved_to"])
        assert moved.name == f"{DB_NAME}.corrupt-20251202T141000Z"  # T0 + 1 h, in UTC
        assert moved.read_bytes()[:100] == b"\xff" * 100  # the old file kept for forensics
        assert s.stats().recovered_total == 1
        assert s.append("verdict", {"after": True}, time_s=T0 + 3601) == event.id + 1


def test_corruption_seen_by_a_reader_mid_run_is_repaired_by_the_writer(tmp_path: Path) -> None:
    s = EventStore(tmp_path, T0)
    try:
        for i in range(2000):
            s.append("evidence", {"i": i, "blob": "y" * 300}, time_s=T0 + i)
        other = sqlite3.connect(s.path)  # move every page from the WAL into the main file
        other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        other.close()
        size = s.path.stat().st_size
        with open(s.path, "r+b") as f:
            f.seek(4096)
            f.write(os.urandom(size - 4096))
        with pytest.raises(StoreError, match=r"malformed|not a database"):
            s.since(0)
        new_id = s.append("verdict", {"after": True}, time_s=T0 + 5000)
        assert new_id is not None
        events = s.since(0)
        assert events[0].payload["event"] == "moved_aside"
        assert events[-1].payload == {"after": True}
        assert s.stats().recovered_total == 1
    finally:
        s.close()


def test_full_database_never_raises_and_buffers_until_there_is_room(tmp_path: Path) -> None:
    s = EventStore(tmp_path, T0, hard_limit_bytes=256 << 10, pending_max=50, retry_interval_s=5.0)
    try:
        written, failed = [], 0
        i = 0
        while failed < 80:  # fill it, then keep appending: nothing raises
            event_id = s.append("evidence", {"i": i, "blob": "z" * 500}, time_s=T0 + i)
            if event_id is None:
                failed += 1
            else:
                written.append(i)
            i += 1
        stats = s.stats()
        assert stats.dropped_total == 80
        assert stats.pending == 50 and stats.lost_total == 30  # bounded buffer: the oldest 30 went
        # Retention frees pages; after the retry interval the buffer drains, in order.
        s.retention_s = 0.5 * i
        assert s.prune(T0 + i) > 0
        last = s.append("verdict", {"i": "after"}, time_s=T0 + i + 10)
        assert last is not None
        assert s.stats().pending == 0
        events = s.since(0, limit=10_000)
        tail = [e.payload["i"] for e in events if e.kind != "store"]
        assert tail[-51:] == [*list(range(i - 50, i)), "after"]
        report = [e.payload for e in events if e.kind == "store"]
        assert report == [{"event": "write_recovered", "delayed": 50, "lost": 30}]
    finally:
        s.close()


def test_readers_in_other_threads_see_writes(store: EventStore) -> None:
    seen: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        last = 0
        try:
            while not stop.is_set() or last < 500:
                for e in store.since(last):
                    assert e.id == last + 1  # contiguous, oldest first, never a torn read
                    last = e.id
                    seen.append(e.id)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(500):
        store.append("state_change", {"i": i}, time_s=T0 + i)
    stop.set()
    for t in threads:
        t.join(timeout=20)
    assert errors == []
    assert len(seen) == 1000


def test_kv_and_outbox(store: EventStore) -> None:
    store.kv_set("mode", "alert", T0)
    store.kv_set("silences", [{"id": 1}], T0)
    store.kv_set("mode", "kill", T0 + 1)
    assert store.kv_get("mode") == "kill"
    assert store.kv_get("silences") == [{"id": 1}]
    assert store.kv_get("absent", 7) == 7
    assert store.kv_delete("mode") and not store.kv_delete("mode")

    a = store.outbox_put("alertmanager-0", "node-a:qwen:deadlock", {"labels": {"x": "1"}}, T0)
    b = store.outbox_put("pagerduty-1", "node-a:qwen:deadlock", {"event_action": "trigger"}, T0)
    assert [i.id for i in store.outbox_due(T0)] == [a, b]
    store.outbox_retry(a, T0 + 30, "connection refused")
    [due] = store.outbox_due(T0 + 1)
    assert due.id == b and due.payload == {"event_action": "trigger"}
    store.outbox_done(b)
    [again] = store.outbox_due(T0 + 30, sink="alertmanager-0")
    assert (again.attempts, again.last_error) == (1, "connection refused")
    assert store.outbox_size() == 1


def test_outbox_survives_a_restart(tmp_path: Path) -> None:
    with EventStore(tmp_path, T0) as s:
        s.outbox_put("webhook-0", "k", {"n": 1}, T0)
    with EventStore(tmp_path, T0 + 60) as s:
        [item] = s.outbox_due(T0 + 60)
        assert item.payload == {"n": 1}


def test_a_newer_schema_is_moved_aside_not_misread(tmp_path: Path) -> None:
    EventStore(tmp_path, T0).close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with EventStore(tmp_path, T0) as s:
        [event] = s.since(0)
        assert "newer" in event.payload["reason"]
        assert ".newer-schema-" in event.payload["moved_to"]


def test_kv_set_many_stores_every_key_with_one_mirror_write(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[Path] = []
    real = kv_mirror.write_atomic
    monkeypatch.setattr(kv_mirror, "write_atomic", lambda path, data: (writes.append(path), real(path, data)))
    store.kv_set_many({"a": {"x": 1}, "b": [2, 3]}, T0)
    assert (store.kv_get("a"), store.kv_get("b")) == ({"x": 1}, [2, 3])
    assert len(writes) == 1  # the temp file, fsync and rename once for the batch
    assert set(KvMirror(store.state_dir).read()) == {"a", "b"}
    with pytest.raises(ValueError):  # one value that cannot be stored: none of the batch is
        store.kv_set_many({"a": {"x": 9}, "c": float("nan")}, T0 + 1)
    assert (store.kv_get("a"), store.kv_get("c")) == ({"x": 1}, None)


def test_the_episodes_in_progress_are_saved_with_one_mirror_write(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the daemon saves its step marks and its job memories every few seconds while steps move: both
    # in one transaction and one rewrite of the kv mirror (temp file, fsync, rename), not one each
    writes: list[Path] = []
    real = kv_mirror.write_atomic
    monkeypatch.setattr(kv_mirror, "write_atomic", lambda path, data: (writes.append(path), real(path, data)))
    recorder = Recorder(Timeline(anchor_s=T0))
    recorder.store = store
    recorder.persist_episode_state(T0, StepTracker(), Detector())
    assert len(writes) == 1
    assert store.kv_get(PROGRESS_KEY)["value"] == [] and store.kv_get(DETECTOR_KEY)["value"] == {}


def test_the_detectors_urgent_part_is_what_its_export_holds() -> None:
    # persist_episode_state compares export_core() every period and saves export() when it changes:
    # the two must agree on every job the export holds
    detector = Detector()
    assert detector.export_core() == {}
    memory = JobMemory(StepTiming(detector.config.timing()))
    memory.verdict, memory.onset, memory.raised, memory.hang_since = Verdict.DEADLOCK_SUSPECTED, 5.0, 6.0, 4.0
    detector._jobs["j"] = memory
    detector._jobs["unraised"] = JobMemory(StepTiming(detector.config.timing()))
    exported = detector.export()
    assert (
        detector.export_core()
        == {job: (e["verdict"], e["onset"], e["hang_since"]) for job, e in exported.items()}
        == {"j": ("deadlock_suspected", 5.0, 4.0)}
    )
