"""gpu_triage.journal.logs: one line per event, text or JSON, rate-limited; `gpu-watchdog run` writes them."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_triage.journal.logs import (
    LOGGER_NAME,
    EventKind,
    EventLog,
    LogLine,
    RateLimiter,
    configure,
    format_json,
    format_text,
)
from tests.conftest import REPO


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def captured() -> Iterator[tuple[EventLog, list[logging.LogRecord], Clock]]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("test.gpu_watchdog.events")
    logger.propagate = False
    handler = Keep()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    clock = Clock()
    try:
        yield EventLog(logger, RateLimiter(burst=3, window_s=60.0), clock), records, clock
    finally:
        logger.removeHandler(handler)


def test_text_line_is_one_line_with_key_values() -> None:
    event = LogLine(
        EventKind.VERDICT,
        "qwen3-32b-ft",
        "healthy -> deadlock_suspected",
        {"cause": None, "signals": ["steps_frozen", "phase_disagreement"], "ranks": [0, 1], "note": "a\nb c"},
    )
    assert format_text(event) == (
        "verdict job=qwen3-32b-ft healthy -> deadlock_suspected cause=- "
        'signals=steps_frozen,phase_disagreement ranks=0,1 note="a b c"'
    )
    decoded = json.loads(format_json(event))
    assert decoded == {
        "event": "verdict",
        "job": "qwen3-32b-ft",
        "summary": "healthy -> deadlock_suspected",
        "cause": None,
        "signals": ["steps_frozen", "phase_disagreement"],
        "ranks": [0, 1],
        "note": "a\nb c",
    }


def test_engine_records_become_evidence_kill_and_refusal_lines(captured) -> None:
    events, records, _clock = captured
    assert events.action(
        {
            "action": "capture",
            "result": "ok",
            "job": "j",
            "path": "/s/e/b1",
            "ok_items": 5,
            "items": 6,
            "duration_s": 1.5,
        }
    )
    assert events.action(
        {"action": "sigterm", "result": "not_armed", "job": "j", "mode": "observe", "pids": [7, 8]}
    )
    assert events.action(
        {
            "action": "sigterm",
            "result": "ok",
            "job": "j",
            "signal": "SIGTERM",
            "signalled": [7, 8],
            "dry_run": False,
        }
    )
    assert not events.action({"action": "alert", "result": "queued", "job": "j"}), "alerts log at delivery"
    assert [r.getMessage() for r in records] == [
        "evidence job=j bundle written path=/s/e/b1 items_ok=5/6 duration_s=1.5",
        "refusal job=j no sigterm: not_armed pids=7,8 mode=observe",
        "kill job=j sigterm ok signal=SIGTERM signalled=7,8 dry_run=false",
    ]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO, logging.WARNING]


def test_a_flapping_stream_is_rate_limited_and_the_gap_is_reported(captured) -> None:
    events, records, clock = captured
    written = [events.verdict("j", "healthy", "slow") for _ in range(10)]
    assert written == [True] * 3 + [False] * 7
    assert events.verdict("other", "healthy", "slow"), "another job's stream is its own"
    clock.t += 61.0
    assert events.verdict("j", "slow", "healthy")
    assert records[-1].getMessage().endswith("suppressed_before=7")
    assert len(records) == 5


def test_rate_limiter_memory_is_bounded() -> None:
    limiter = RateLimiter(burst=1, window_s=10.0, max_keys=4)
    for i in range(100):
        assert limiter.admit((str(i),), float(i)) == (True, 0)
    assert len(limiter._times) <= 4


def test_json_format_makes_every_record_one_object() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure("info", "json", stream=stream)
        logging.getLogger("gpu_watchdog").info("listening on %s", "127.0.0.1:9410")
        EventLog(logging.getLogger(LOGGER_NAME)).delivery(
            "GpuTrainingDeadlock", "j", "firing", "delivered", sink="am", http_status=200
        )
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "listening on 127.0.0.1:9410" and first["level"] == "INFO"
    assert second["event"] == "alert_delivery" and second["job"] == "j" and second["http_status"] == 200
    assert second["message"] == (
        "alert_delivery job=j GpuTrainingDeadlock firing delivered sink=am http_status=200"
    )
    with pytest.raises(ValueError, match=r"daemon\.log_format"):
        configure("info", "xml")


@pytest.mark.slow
def test_run_in_observe_mode_logs_the_verdict_as_json(tmp_path: Path) -> None:
    """`gpu-watchdog run --source sim` (observe mode), daemon.log_format = "json": the reference
    scenario's deadlock reaches stderr - the journal under systemd - as one JSON object a line."""
    from tests.watchdog.test_daemon import free_port

    start = time.time() - 100.0  # the epoch-end deadlock begins at 110 s
    progress = tmp_path / "progress"
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_triage.demo.simjob",
            "--progress-dir",
            str(progress),
            "--start-epoch",
            str(start),
        ],
        cwd=REPO,
        start_new_session=True,
    )
    config = tmp_path / "config.toml"
    config.write_text(
        f'[daemon]\nlisten = "127.0.0.1:{free_port()}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'period_s = 0.2\nlog_format = "json"\nsource = "sim"\n[progress]\ndir = "{progress}"\n'
    )
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpu_triage", "run", "--config", str(config)),
            "--sim-start",
            str(start),
            "--sim-job",
            str(job.pid),
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    found: dict[str, dict] = {}
    try:
        deadline = time.monotonic() + 90
        assert proc.stderr is not None
        while time.monotonic() < deadline and len(found) < 2:
            line = proc.stderr.readline()
            if not line:
                break
            record = json.loads(line)  # every line is JSON
            if record.get("job") == "qwen3-32b-ft":
                if record.get("event") == "verdict" and "-> deadlock_suspected" in record["summary"]:
                    found["verdict"] = record
                if record.get("event") == "evidence":
                    found["evidence"] = record
    finally:
        for p in (proc, job):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(15)
    assert found.keys() == {"verdict", "evidence"}, found
    assert found["verdict"]["level"] == "WARNING" and found["verdict"]["signals"]
    assert Path(found["evidence"]["path"]).is_dir()


def test_a_kill_through_slurm_says_so_on_its_line(captured) -> None:
    events, records, _clock = captured
    assert events.action(
        {
            "action": "sigterm",
            "result": "ok",
            "job": "slurm-42",
            "via": "slurm",
            "argv": ["scancel", "--signal=TERM", "--full", "42"],
            "returncode": 0,
        }
    )
    assert records[-1].getMessage() == (
        'kill job=slurm-42 sigterm ok via=slurm argv="scancel,--signal=TERM,--full,42" returncode=0'
    )


def test_an_error_repeated_every_cycle_writes_a_few_lines_a_minute_not_millions() -> None:
    """EMFILE while file descriptors are exhausted fails every cycle and every accept: the journal
    gets ``burst`` lines per minute per message, then one that counts what was dropped."""
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure("info", "text", stream=stream)
        log = logging.getLogger("gpu_triage.signals.processes")
        for i in range(20000):
            log.error("process scan failed: %s", f"[Errno 24] Too many open files: '/proc/{i}/stat'")
        logging.getLogger("gpu_watchdog").warning("something else")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
    lines = stream.getvalue().splitlines()
    assert len([x for x in lines if "process scan failed" in x]) == 10
    assert lines[-1].endswith("something else")  # another message is not held back
