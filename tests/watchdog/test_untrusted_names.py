"""Issue 18, items 1, 8 and 9 (fast parts): untrusted names are bytes until proven; a failure on any
cycle is visible at once; the kill plan re-checks each target's kernel identity."""

from __future__ import annotations

import io
import logging
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpu_triage.actions.kill_targets import Identity, ProcEntry, plan_kill
from gpu_triage.journal import logs
from gpu_triage.journal.eventstore import EventStore
from gpu_triage.model.names import job_name_problem, printable, safe_job_key
from gpu_triage.model.snapshot import Snapshot
from gpu_triage.model.states import Mode
from gpu_triage.serving.api import create_app
from gpu_triage.serving.publish import SnapshotHolder
from gpu_triage.signals.progress import ProgressReader
from gpu_triage.signals.progress_model import ProgressFormatError, parse_record
from gpu_triage.signals.ranks import Candidate, job_key, kernel_scope, name_groups

FORGED = "x\n2026-12-03 10:00:00,000 CRITICAL gpu_watchdog.events: kill job=prod sigterm ok"


@pytest.mark.parametrize(
    "name",
    ["\udcff\udcfejob", FORGED, "esc\x1b[2J", "a" * 201, ".hidden", "", "bidi\u202ejob", "ls\u2028x"],
)
def test_a_hostile_name_is_no_job_name(name: str) -> None:
    assert job_name_problem(name) is not None
    out = printable(name, 80)
    assert out.isprintable() and len(out) <= 100 and "\n" not in out and "\x1b" not in out


def test_the_name_rule_is_the_contracts() -> None:
    from gpu_triage import contract
    from gpu_triage.model import names

    assert names.MAX_JOB_NAME == contract.MAX_JOB_NAME
    for name in ("ok-1.x", "\udcff", "a\nb", ".x", "x" * 201, "ünï"):
        try:
            contract.check_job_name(name)
            ok = True
        except ValueError:
            ok = False
        assert ok == (job_name_problem(name) is None), name


def test_good_names_pass_unchanged() -> None:
    for name in ("qwen3-32b-ft", "slurm-4242.0", "ünïcode-job", "a" * 200):
        assert job_name_problem(name) is None
    assert safe_job_key("slurm-4242") == "slurm-4242"
    assert safe_job_key("master-10.0.0.1:29500") == "master-10.0.0.1:29500"


def test_environment_job_keys_are_bounded_printable_and_distinct() -> None:
    a = job_key({"GPU_WATCHDOG_JOB": "\x1b[31m" + "A" * 10_000})
    b = job_key({"GPU_WATCHDOG_JOB": "\x1b[32m" + "A" * 10_000})
    s = job_key({"GPU_WATCHDOG_JOB": "job\udcff"})
    assert a is not None and b is not None and s is not None
    assert a != b and len(a) <= 64 and a.isprintable() and s.isprintable()
    assert a == job_key({"GPU_WATCHDOG_JOB": "\x1b[31m" + "A" * 10_000})  # stable


def test_a_job_field_that_is_no_job_name_is_a_format_error() -> None:
    rec = (
        '{"job": "\\udcff\\udcfe", "rank": 0, "local_rank": 0, "world_size": 1, "pid": 1, "host": "h",'
        ' "step": 0, "epoch": 0, "tokens": 0, "phase": "train", "lease_until": null, "time": 1.7e9}'
    )
    with pytest.raises(ProgressFormatError, match="job"):
        parse_record(rec)


def test_non_utf8_and_newline_directory_names_are_errors_not_jobs(tmp_path: Path, caplog) -> None:
    root = bytes(tmp_path)
    for raw in (b"\xff\xfejob", FORGED.encode(), b"esc\x1b[2J"):
        os.mkdir(root + b"/" + raw)
        with open(root + b"/" + raw + b"/rank-0.json", "wb") as f:
            f.write(b"{}")
    caplog.set_level(logging.WARNING)
    view = ProgressReader(tmp_path).read(time.time())
    assert view.jobs == {}
    assert len(view.errors) == 3 and all("not a job directory" in e.error for e in view.errors)
    for record in caplog.records:
        assert "\n" not in record.getMessage() and "\x1b" not in record.getMessage()


def test_the_event_store_records_any_job_name(tmp_path: Path) -> None:
    """Before: a lone surrogate in ``job`` raised UnicodeEncodeError out of the store, every cycle."""
    with EventStore(tmp_path, time.time()) as store:
        assert store.append("verdict", {"to": "\udcff"}, time_s=time.time(), job="\udcff\udcfe\n") is not None
        [ev] = [e for e in store.since(0, 10) if e.kind == "verdict"]
        assert ev.job is not None and ev.job.isprintable()


def test_text_log_lines_cannot_be_forged(tmp_path: Path) -> None:
    stream = io.StringIO()
    logs.configure("info", "text", stream)
    try:
        logging.getLogger("gpu_triage.progress").warning("progress file %s ignored", FORGED)
        try:
            raise ValueError("bad\nCRITICAL forged")
        except ValueError:
            logging.getLogger("x").exception("failed %s", "\x1b[2J")
    finally:
        logging.getLogger().handlers.clear()
    lines = stream.getvalue().splitlines()
    records = [line for line in lines if not line.startswith("| ")]
    assert len(records) == 2, lines
    assert "\x1b" not in stream.getvalue()


def _snapshot(**kw) -> Snapshot:
    now = time.time()
    return Snapshot(
        node="n", source="none", mode=Mode.OBSERVE, armed=False, cycle=1, time=now, period_s=1.0,
        started_at=now, **kw,
    )  # fmt: skip


def _client(holder: SnapshotHolder, events: EventStore | None) -> TestClient:
    app = create_app(
        snapshots=holder, events=events, table=lambda: {}, control=None, token="t" * 32, period_s=1.0
    )
    return TestClient(app)


def test_healthz_shows_a_single_failed_cycle_or_unjudged_job_at_once() -> None:
    holder = SnapshotHolder()
    client = _client(holder, None)
    holder.publish(_snapshot())
    assert client.get("/healthz").json()["status"] == "ok"
    holder.publish(_snapshot(failed_cycles=1, counters={"failed_cycles_total": 1.0}))
    body = client.get("/healthz").json()
    assert (body["status"], body["failed_cycles_total"]) == ("degraded", 1)
    holder.publish(_snapshot(input_errors=({"kind": "persist", "where": "j", "error": "x"},)))
    assert client.get("/healthz").json()["errors"] == ["persist"]


def test_events_since_beyond_any_id_is_a_client_error(tmp_path: Path) -> None:
    with EventStore(tmp_path, time.time()) as store:
        client = _client(SnapshotHolder(), store)
        response = client.get("/events", params={"since": "100000000000000000000000"})
        assert 400 <= response.status_code < 500


# ----------------------------------------------------------------------- identity (items 2 and 3)


def _cand(
    pid: int, job: str, uid: int, created: float, proof=("rank_env",), scope=None, sid=None, ppid=1
) -> Candidate:
    return Candidate(pid, ppid, job, 0, 0, 1, None, (), "environ", proof=proof, uid=uid, scope=scope,
                     create_time=created, sid=sid)  # fmt: skip


def test_a_progress_file_names_its_own_process_tree_not_a_same_named_job_elsewhere() -> None:
    """The same user runs two jobs whose environment says the same name; a progress file claims a
    rank of one: its session and parent siblings follow the claim, the other job stays apart."""
    claimed = _cand(10, "qwen", 0, 100.0, proof=("rank_env", "progress_file"), sid=10, ppid=9)
    sibling = _cand(11, "qwen", 0, 100.0, sid=10, ppid=9)
    elsewhere = _cand(20, "qwen", 0, 50.0, sid=20, ppid=19)
    claimed = replace(claimed, job="qwen-ft")
    renames = {("qwen", 0, None): "qwen-ft"}
    trees = {("qwen", 0, None): {("sid", 10), ("ppid", 9)}}
    named = {c.pid: c.job for c in name_groups([claimed, sibling, elsewhere], renames, trees)}
    assert named == {10: "qwen-ft", 11: "qwen-ft", 20: "qwen"}
    # the progress file says the environment's name: the other job gets a name of its own
    same = replace(claimed, job="qwen")
    renames = {("qwen", 0, None): "qwen"}
    named = {c.pid: c.job for c in name_groups([same, sibling, elsewhere], renames, trees)}
    assert named == {10: "qwen", 11: "qwen", 20: "qwen@sid20"}


def test_a_later_process_of_another_owner_never_takes_a_running_jobs_name() -> None:
    a = _cand(10, "slurm-4242", 1000, 100.0)
    b = _cand(20, "slurm-4242", 1001, 200.0)
    named = {c.pid: c.job for c in name_groups([b, a], {})}
    assert named == {10: "slurm-4242", 20: "slurm-4242@uid1001"}
    # B's own progress file renames B's group only
    named = {c.pid: c.job for c in name_groups([a, b], {("slurm-4242", 1001, None): "bjob"})}
    assert named == {10: "slurm-4242", 20: "bjob"}


def test_the_kernel_names_the_slurm_job() -> None:
    assert kernel_scope("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n") == "slurm:4242"
    assert kernel_scope("0::/user.slice/user-1000.slice/session-3.scope\n") is None


def test_the_plan_skips_a_reused_pid_another_owner_and_foreign_descendants() -> None:
    table = {
        1: ProcEntry(1, 0, 1, 0.0, "init", 0),
        50: ProcEntry(50, 1, 50, 5.0, "daemon", 0),
        100: ProcEntry(100, 1, 100, 10.0, "rank0", 1000),
        101: ProcEntry(101, 100, 100, 11.0, "worker", 1000),
        102: ProcEntry(102, 100, 100, 12.0, "setuid-child", 0),
        200: ProcEntry(200, 1, 200, 99.0, "reused", 1000),
        300: ProcEntry(300, 1, 300, 30.0, "other", 1001),
    }
    ids = {100: Identity(10.0, 1000), 200: Identity(20.0, 1000), 300: Identity(30.0, 1000)}
    plan = plan_kill([100, 200, 300], table, own_pid=50, identities=ids)
    covered = set(plan.members)
    assert covered == {100, 101}, plan
    reasons = dict(plan.skipped)
    assert "reused" in reasons[200] and "uid 1001" in reasons[300] and "another owner" in reasons[102]


# ---------------------------------------------------------------------------------------- item 9


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("table", '"/dev/zero"', "not a regular file"),
        ("table", '"/nonexistent/table.toml"', "no such table file"),
        ("model", '"XYZ"', "no built-in table for model 'XYZ'"),
    ],
)
def test_check_config_refuses_what_run_refuses(tmp_path: Path, key: str, value: str, message: str) -> None:
    from gpu_triage.cli.ops import check_config

    path = tmp_path / "config.toml"
    path.write_text(f"[classifier]\n{key} = {value}\n")
    code, lines = check_config(str(path), {})
    assert code == 2, lines
    assert any(f"classifier.{key}" in line and message in line for line in lines), lines


def _h100_csv(path: Path, limit: str) -> Path:
    rows = ["timestamp, index, name, power.draw [W], power.limit [W], utilization.gpu [%], memory.used [MiB]"]
    rows += [
        f"2026/12/03 10:{i // 60:02d}:{i % 60:02d}.000, 0, NVIDIA H100 80GB HBM3, 130.00 W, {limit} W, "
        "100 %, 70000 MiB"
        for i in range(700)
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("where", ["csv", "flag"])
def test_a_power_limit_no_gpu_has_is_refused_not_a_hidden_deadlock(
    tmp_path: Path, where: str, capsys
) -> None:
    from gpu_triage.cli import main as cli

    csv = _h100_csv(tmp_path / "rec.csv", "1e308" if where == "csv" else "700.00")
    argv = ["triage", "--no-progress", str(csv)] + (["--power-limit", "1e308"] if where == "flag" else [])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "power" in err and "1e+308 W is outside 1-5000 W" in err, err


def test_a_replayed_recording_with_an_impossible_power_limit_is_refused(tmp_path: Path) -> None:
    from gpu_triage.model.samples import TelemetryUnavailable
    from gpu_triage.telemetry.replay import ReplaySource

    csv = _h100_csv(tmp_path / "rec.csv", "1e308")
    with pytest.raises(TelemetryUnavailable, match=r"rec\.csv: power\.limit: .*outside 1-5000 W"):
        ReplaySource(csv)
    ReplaySource(_h100_csv(tmp_path / "ok.csv", "700.00")).close()


@pytest.mark.parametrize("impossible_w", [1e308, 0.0, -700.0, float("inf")])
def test_a_live_sample_with_an_impossible_power_limit_is_classified_against_the_table(
    impossible_w: float,
) -> None:
    """An H100 spinning at 130 W (the deadlock signature) whose sample says its limit is 1e308 W is
    still in the spin band: the impossible limit is counted and set aside, never divided by."""
    from gpu_triage.classify.tracker import GpuTracker
    from gpu_triage.model.samples import GpuSample
    from gpu_triage.model.states import GpuState

    def run(limit_w: float) -> tuple[GpuState, int]:
        tracker = GpuTracker()
        for t in range(240):
            tracker.update(
                float(t),
                [
                    GpuSample(
                        gpu=0, time_s=float(t), name="NVIDIA H100 80GB HBM3", power_w=130.0,
                        utilization_ratio=1.0, power_limit_w=limit_w,
                    )
                ],
            )  # fmt: skip
        (status,) = tracker.statuses()
        return status.state, status.impossible_power_limits_total

    assert run(700.0) == (GpuState.CHECKPOINT_OR_DEADLOCK, 0)
    assert run(impossible_w) == (GpuState.CHECKPOINT_OR_DEADLOCK, 240)
