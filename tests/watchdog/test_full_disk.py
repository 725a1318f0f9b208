"""Fault injection (issue 11, item 2): the state directory's disk is full when the daemon starts.

A real tmpfs of 2 MiB is mounted and filled; the daemon starts on it in alert mode with a webhook sink
to a real HTTP receiver on loopback, watching a real two-rank job (sleeping processes with a rank
environment and progress files) that reaches the epoch-end deadlock. Without an event store the
action engine used to be never created - no alert, also after the space was freed. Now the store runs
on memory (said loudly, listed in ``input_errors``), the alert arrives, and once the space is freed
the store reattaches to its file, which then holds the alert's events.

Needs ``mount`` (root): skipped where it is not permitted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from gpu_triage.contract import ProgressWriter
from gpu_triage.daemon.config import SinkConfig, load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.telemetry.none import NoneSource
from tests.corpus.live import spawn_rank


class Receiver(BaseHTTPRequestHandler):
    posts: ClassVar[list[tuple[float, object]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Receiver.posts.append((time.time(), json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def full_disk(tmp_path: Path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True, capture_output=True
        )
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {e}")
    try:
        (mnt / "state").mkdir()
        filler = mnt / "filler"
        with open(filler, "wb") as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        with contextlib.suppress(OSError), open(mnt / "filler2", "wb") as f:
            while True:
                f.write(b"\0" * 512)
                f.flush()
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


@pytest.mark.isolated  # an armed daemon: a PID namespace of its own (tests/isolation.py)
@pytest.mark.slow
def test_full_disk_at_start_still_alerts_and_the_store_reattaches_when_space_is_freed(
    tmp_path: Path, full_disk: Path
) -> None:
    Receiver.posts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    job = "fulldisk"
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
            "daemon.state_dir": str(full_disk / "state"),
            "daemon.period_s": 0.5,
            "progress.dir": str(progress),
            "actions.mode": "alert",
            "actions.capture_after_s": 0.0,
            "actions.alert_after_s": 0.0,
            "actions.capture_timeout_s": 5.0,
            "detector.fast_min_s": 2.0,
            "detector.disagree_min_s": 2.0,
            "detector.stall_min_s": 2.0,
            "detector.confirm_after_s": 3.0,
        },
        origin="test",
    )
    sink = SinkConfig(
        kind="webhook", name="hook", url=f"http://127.0.0.1:{server.server_port}/hook", timeout_s=2.0
    )
    config = replace(config, alerts=replace(config.alerts, sinks=(sink,), retry_initial_s=0.2))
    daemon = Daemon(config, NoneSource(), serve_http=False)
    daemon.start()
    assert daemon.store is not None and daemon.store.memory_only, "the disk is full: the store is on memory"
    assert daemon.actions is not None, "the action engine runs without the store's file"
    daemon.store.reattach_interval_s = 1.0
    loop = threading.Thread(target=daemon.run_forever, daemon=True)
    loop.start()
    try:
        for step in range(1, 6):
            for w in writers:
                w.step(step)
            time.sleep(1.0)
        writers[0].phase("epoch_end", lease_s=120)  # rank 1 stays in train: the epoch-end deadlock
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not Receiver.posts:
            time.sleep(0.2)
        alerted_on_memory = daemon.store.memory_only
        snap = daemon.snapshots.latest()
        assert Receiver.posts, "no alert reached the receiver while the disk was full"
        assert alerted_on_memory
        assert snap is not None and any(e["kind"] == "store" for e in snap.input_errors)
        # free the space: the store moves to its file
        (full_disk / "filler").unlink()
        (full_disk / "filler2").unlink(missing_ok=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and daemon.store.memory_only:
            time.sleep(0.2)
        assert not daemon.store.memory_only, "the store did not reattach after the space was freed"
    finally:
        daemon.stop()
        loop.join(15)
        daemon.close()
        server.shutdown()
        for p in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    payloads = [body for _, body in Receiver.posts]
    assert any(job in json.dumps(b) for b in payloads), payloads
    db = sqlite3.connect(f"file:{full_disk / 'state' / 'events.sqlite3'}?mode=ro", uri=True)
    kinds = [row[0] for row in db.execute("SELECT kind FROM events")]
    reattached = [json.loads(p) for (p,) in db.execute("SELECT payload FROM events WHERE kind = 'store'")]
    db.close()
    assert "alert" in kinds and "verdict" in kinds, kinds
    assert any(p.get("event") == "memory_only" for p in reattached)
    assert any(p.get("event") == "reattached" for p in reattached)
