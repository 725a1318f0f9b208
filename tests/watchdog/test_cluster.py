"""``gpu-watchdog cluster`` and ``status`` against real daemons' REST apps on loopback.

Each "daemon" is the real app served by a real :class:`~gpu_triage.serving.http_server.HttpServer` over a
snapshot of a node of a 2-node, 16-rank job; the commands run through the real CLI entry point.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpu_triage.cli.cluster import Fetched, analyse, base_url, render
from gpu_triage.cli.main import main
from gpu_triage.model.evidence import JobEvidence
from gpu_triage.model.snapshot import JobStatus, Snapshot
from gpu_triage.model.states import GpuState, Mode, Verdict
from gpu_triage.serving.api import create_app, status_document
from gpu_triage.serving.http_server import HttpServer
from gpu_triage.serving.publish import SnapshotHolder
from tests.watchdog.snapshots import gpu_status, rank_status

JOB = "qwen3-32b-ft"


def node_snapshot(
    node: str,
    *,
    first_rank: int,
    now: float,
    spin_since: float | None,
    verdict: Verdict,
    steps: dict[int, int] | None = None,
    phases: dict[int, str] | None = None,
) -> Snapshot:
    """A node of 8 B300s running ranks first_rank..first_rank+7 of JOB. With ``spin_since``, GPUs 0-5
    are in the spin band (GPU 3 since ``spin_since``, the others 5-30 s later) and 6-7 compute."""
    steps = steps or {}
    phases = phases or {}
    gpus = []
    for g in range(8):
        if spin_since is not None and g < 6:
            since = spin_since if g == 3 else spin_since + 5.0 * (g + 1)
            gpus.append(
                gpu_status(g, state=GpuState.CHECKPOINT_OR_DEADLOCK, power_w=231.0, state_since=since)
            )
        else:
            gpus.append(gpu_status(g, state=GpuState.COMPUTE, power_w=905.0, state_since=now - 900.0))
    ranks = tuple(
        rank_status(r, step=steps.get(r, 1200), phase=phases.get(r, "train"))
        for r in range(first_rank, first_rank + 8)
    )
    spinning = verdict in (Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED)
    job = JobStatus(
        job=JOB,
        ranks=ranks,
        verdict=verdict,
        onset=spin_since if spinning else None,
        raised=now - 5.0 if spinning else None,
        evidence=JobEvidence(gpus=tuple(range(6)), step_interval_s=42.0) if spinning else None,
    )
    return Snapshot(
        node=node,
        source="replay",
        mode=Mode.OBSERVE,
        armed=False,
        cycle=100,
        time=now,
        period_s=1.0,
        gpus=tuple(gpus),
        jobs=(job,),
        last_sample_time=now - 0.01,
        started_at=now - 3600.0,
        version="0.1.0",
    )


class Daemon:
    """The real REST app over a snapshot holder, served on a free loopback port."""

    def __init__(self) -> None:
        self.holder = SnapshotHolder()
        app = create_app(
            snapshots=self.holder, events=None, table=dict, control=None, token=None, period_s=1.0
        )
        self.http = HttpServer(app, "127.0.0.1", 0)

    @property
    def url(self) -> str:
        return self.http.url


@pytest.fixture
def daemons() -> Iterator[tuple[Daemon, Daemon]]:
    a, b = Daemon(), Daemon()
    a.http.start()
    b.http.start()
    try:
        yield a, b
    finally:
        a.http.stop(2.0)
        b.http.stop(2.0)


def publish_incident(a: Daemon, b: Daemon, *, a_entered: float, b_entered: float) -> float:
    """node-a runs ranks 0-7, node-b ranks 8-15; rank 11 (node-b) is 3 steps behind, rank 8 (node-b)
    is in epoch_end while the others train; both nodes suspect a deadlock. Times are seconds ago."""
    now = time.time()
    a.holder.publish(
        node_snapshot(
            "node-a", first_rank=0, now=now, spin_since=now - a_entered, verdict=Verdict.DEADLOCK_SUSPECTED
        )
    )
    b.holder.publish(
        node_snapshot(
            "node-b",
            first_rank=8,
            now=now,
            spin_since=now - b_entered,
            verdict=Verdict.DEADLOCK_SUSPECTED,
            steps={11: 1197},
            phases={8: "epoch_end"},
        )
    )
    return now


def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------------------------------
# cluster


@pytest.mark.parametrize(
    ("a_entered", "b_entered", "first", "then"),
    [(95.0, 70.0, "node-a", "node-b"), (30.0, 80.0, "node-b", "node-a")],
)
def test_cluster_names_the_node_that_entered_the_spin_band_first(
    daemons: tuple[Daemon, Daemon],
    capsys: pytest.CaptureFixture[str],
    a_entered: float,
    b_entered: float,
    first: str,
    then: str,
) -> None:
    a, b = daemons
    publish_incident(a, b, a_entered=a_entered, b_entered=b_entered)
    code, out, err = run_cli(capsys, "cluster", b.url, a.url)  # argument order must not matter
    assert code == 1, out + err
    gap = abs(a_entered - b_entered)
    assert f"Entered the spin band first: {first} at " in out
    assert f"(GPU 3 first; GPUs 0-5 in the band now); then {then} +{gap:.1f} s." in out
    first_row = next(line for line in out.splitlines() if line.startswith(first + " "))
    assert first_row.rstrip().endswith(f"{JOB}: deadlock_suspected")
    assert " FIRST " in first_row
    then_row = next(line for line in out.splitlines() if line.startswith(then + " "))
    assert f"+{gap:.1f} s" in then_row and "FIRST" not in then_row
    assert "6 checkpoint_or_deadlock, 2 compute" in first_row
    assert (
        f"Job {JOB} (16 ranks on 2 nodes): steps 1197..1200; lagging: rank 11 on node-b at step 1197, "
        "3 behind rank 0 on node-a." in out
    )
    assert "phases disagree: train 15, epoch_end 1 (epoch_end: ranks 8)" in out
    assert err == ""


def test_cluster_json_shape(daemons: tuple[Daemon, Daemon], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = daemons
    now = publish_incident(a, b, a_entered=95.0, b_entered=70.0)
    code, out, _err = run_cli(capsys, "cluster", "--json", a.url, b.url)
    assert code == 1
    doc = json.loads(out)
    assert set(doc) == {
        "time", "exit_code", "deadlock", "nodes", "first_in_spin_band", "spin_order", "jobs", "unreachable",
        "warnings",
    }  # fmt: skip
    assert doc["exit_code"] == 1 and doc["deadlock"] is True
    assert doc["unreachable"] == [] and doc["warnings"] == []
    first = doc["first_in_spin_band"]
    assert (first["node"], first["url"], first["first_gpu"]) == ("node-a", a.url, 3)
    assert first["gpus"] == [0, 1, 2, 3, 4, 5]
    assert first["since"] == pytest.approx(now - 95.0) and first["after_first_s"] == 0.0
    assert [(e["node"], round(e["after_first_s"], 3)) for e in doc["spin_order"]] == [
        ("node-a", 0.0),
        ("node-b", 25.0),
    ]
    node_a, node_b = doc["nodes"]
    assert node_a["url"] == a.url and node_a["node"] == "node-a" and node_a["reachable"] is True
    assert (node_a["source"], node_a["mode"], node_a["armed"], node_a["gpus"]) == (
        "replay",
        "observe",
        False,
        8,
    )
    assert node_a["gpu_states"] == {"checkpoint_or_deadlock": 6, "compute": 2}
    assert node_b["spin_since"] == pytest.approx(now - 70.0)
    assert node_a["jobs"] == [
        {
            "job": JOB,
            "verdict": "deadlock_suspected",
            "onset": pytest.approx(now - 95.0),
            "raised": pytest.approx(now - 5.0),
            "ranks": 8,
        }
    ]
    (job,) = doc["jobs"]
    assert job["verdicts"] == {"node-a": "deadlock_suspected", "node-b": "deadlock_suspected"}
    assert (job["ranks"], job["min_step"], job["max_step"], job["lag_steps"]) == (16, 1197, 1200, 3)
    assert job["lagging"] == [{"rank": 11, "step": 1197, "phase": "train", "node": "node-b", "url": b.url}]
    assert job["leading"]["rank"] == 0 and job["leading"]["node"] == "node-a"
    assert job["phases"] == {"train": [r for r in range(16) if r != 8], "epoch_end": [8]}
    assert job["duplicate_ranks"] == []


def test_an_unreachable_daemon_exits_2_and_is_named(
    daemons: tuple[Daemon, Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = daemons
    publish_incident(a, b, a_entered=95.0, b_entered=70.0)
    dead = dead_url()
    code, out, err = run_cli(capsys, "cluster", a.url, dead, b.url)
    assert code == 2, "unreachable wins over the deadlock verdict (the highest code wins)"
    assert f"gpu-watchdog cluster: error: {dead}: cannot connect" in err
    row = next(line for line in out.splitlines() if line.startswith(dead))
    assert "UNREACHABLE" in row and "Connection refused" in row
    assert "Entered the spin band first: node-a" in out, "the reachable nodes are still compared"

    code, out, _err = run_cli(capsys, "cluster", "--json", a.url, dead, b.url)
    doc = json.loads(out)
    assert code == doc["exit_code"] == 2
    assert [u["url"] for u in doc["unreachable"]] == [dead]
    assert (doc["nodes"][1]["url"], doc["nodes"][1]["reachable"]) == (dead, False)
    assert doc["nodes"][1]["error"].startswith("cannot connect")


def test_a_daemon_that_answers_badly_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    starting = Daemon()  # no cycle published yet: /status answers 503
    other = FastAPI()

    @other.get("/status")
    def not_status() -> dict[str, Any]:
        return {"hello": "world"}

    with starting.http, HttpServer(other, "127.0.0.1", 0) as impostor:
        code, out, err = run_cli(capsys, "cluster", starting.url, impostor.url)
    assert code == 2
    assert f"{starting.url}: HTTP 503: starting: no cycle has completed yet" in err
    assert f"{impostor.url}: not a /status document: missing field 'node'" in err
    assert "0 of 2 daemons answered" in out


def test_a_healthy_cluster_exits_0(
    daemons: tuple[Daemon, Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = daemons
    now = time.time()
    a.holder.publish(node_snapshot("node-a", first_rank=0, now=now, spin_since=None, verdict=Verdict.HEALTHY))
    b.holder.publish(node_snapshot("node-b", first_rank=8, now=now, spin_since=None, verdict=Verdict.HEALTHY))
    code, out, err = run_cli(capsys, "cluster", a.url, b.url)
    assert code == 0, out + err
    assert "No GPU is in the spin band" in out
    assert f"Job {JOB} (16 ranks on 2 nodes): every rank at step 1200." in out
    # A checkpoint wait is in the band too, but is no deadlock verdict: still 0.
    a.holder.publish(
        node_snapshot("node-a", first_rank=0, now=now, spin_since=now - 20, verdict=Verdict.CHECKPOINT)
    )
    code, out, _err = run_cli(capsys, "cluster", a.url, b.url)
    assert code == 0
    assert "Entered the spin band first: node-a" in out


# --------------------------------------------------------------------------------------------------
# Pure parts


def fetched(url: str, snapshot: Snapshot, received_at: float) -> Fetched:
    return Fetched(url, status_document(snapshot), None, received_at)


def test_same_node_names_are_told_apart_and_clock_skew_and_duplicate_ranks_are_flagged() -> None:
    now = 1_764_676_800.0
    one = node_snapshot(
        "gpu-host", first_rank=0, now=now, spin_since=now - 50, verdict=Verdict.DEADLOCK_CONFIRMED
    )
    two = node_snapshot("gpu-host", first_rank=0, now=now + 40, spin_since=now - 10, verdict=Verdict.HEALTHY)
    view = analyse([fetched("http://h1:9410", one, now + 0.2), fetched("http://h2:9410", two, now + 0.3)])
    assert [n.label for n in view.nodes] == ["gpu-host@http://h1:9410", "gpu-host@http://h2:9410"]
    assert view.first_in_spin_band is not None and view.first_in_spin_band.url == "http://h1:9410"
    assert view.exit_code == 1
    assert any("gpu-host@http://h2:9410's clock" in w and "ahead of" in w for w in view.warnings)
    assert any("reported by more than one daemon" in w for w in view.warnings)
    text = render(view)
    assert "Warning: gpu-host@http://h2:9410's clock" in text


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("node-a", "http://node-a:9410"),
        ("node-a:9500", "http://node-a:9500"),
        ("http://node-a:9410/", "http://node-a:9410"),
        ("http://node-a:9410/status", "http://node-a:9410"),
        ("https://gw.example/gpu/node-a/status", "https://gw.example/gpu/node-a"),
        ("127.0.0.1", "http://127.0.0.1:9410"),
        ("[::1]:9410", "http://[::1]:9410"),
    ],
)
def test_base_url(given: str, expected: str) -> None:
    assert base_url(given) == expected


@pytest.mark.parametrize("bad", ["", "ftp://node-a", "http://"])
def test_bad_urls_are_reported_not_raised(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "cluster", "--json", bad)
    assert code == 2
    assert json.loads(out)["unreachable"][0]["error"].startswith("bad URL")
    assert "bad URL" in err


# --------------------------------------------------------------------------------------------------
# status


def test_status_shows_gpus_and_jobs_and_exits_1_on_a_deadlock(capsys: pytest.CaptureFixture[str]) -> None:
    daemon = Daemon()
    now = time.time()
    snapshot = node_snapshot(
        "node-b",
        first_rank=8,
        now=now,
        spin_since=now - 70,
        verdict=Verdict.DEADLOCK_SUSPECTED,
        steps={11: 1197},
    )
    daemon.holder.publish(snapshot)
    with daemon.http:
        code, out, err = run_cli(capsys, "status", "--url", daemon.url)
        assert code == 1, out + err
        assert out.startswith(f"node-b ({daemon.url}): source replay, mode observe, cycle 100")
        gpu3 = next(line for line in out.splitlines() if line.startswith("3 "))
        assert "checkpoint_or_deadlock" in gpu3 and "231 W / 1100 W (21%)" in gpu3 and "(1m10s ago)" in gpu3
        job = next(line for line in out.splitlines() if line.startswith(JOB))
        assert "deadlock_suspected" in job and job.rstrip().endswith("8      1197..1200  11 (-3)")
        assert "    gpus: [0, 1, 2, 3, 4, 5]" in out
        assert "    step_interval_s: 42.0" in out

        code, out, _err = run_cli(capsys, "status", "--url", daemon.url, "--json")
        assert code == 1
        assert json.loads(out) == httpx.get(daemon.url + "/status").json()

        daemon.holder.publish(
            node_snapshot("node-b", first_rank=8, now=now, spin_since=None, verdict=Verdict.HEALTHY)
        )
        code, out, _err = run_cli(capsys, "status", "--url", daemon.url)
        assert code == 0
        assert "healthy" in out


def test_status_shows_local_times_with_ages_and_names_the_lagging_ranks() -> None:
    from datetime import timedelta, timezone

    from gpu_triage.cli.status import lagging_ranks, render

    now = 1_764_676_800.0  # 2025-12-02 12:00:00 UTC
    snapshot = node_snapshot(
        "node-b",
        first_rank=8,
        now=now,
        spin_since=now - 70,
        verdict=Verdict.DEADLOCK_SUSPECTED,
        steps={11: 1180, 13: 1199, 9: 1190},
    )
    status = status_document(snapshot)
    cest = timezone(timedelta(hours=2), "CEST")
    text = render(status, "http://node-b:9410", tz=cest)
    assert "cycle at 2025-12-02 14:00:00 CEST;" in text
    job = next(line for line in text.splitlines() if line.startswith(JOB))
    assert "2025-12-02 13:58:50 CEST (1m10s ago)" in job  # the onset, local, with its age
    assert job.rstrip().endswith("11 (-20), 9 (-10)")  # 13 is one step behind: in step
    assert lagging_ranks(status["jobs"][0]) == [(11, 1180, 20), (9, 1190, 10)]
    assert lagging_ranks({"ranks": [{"rank": 0, "step": None}]}) == []


def test_status_watch_redraws_until_interrupted(capsys: pytest.CaptureFixture[str]) -> None:
    import io

    from gpu_triage.cli.status import run

    daemon = Daemon()
    now = time.time()
    daemon.holder.publish(
        node_snapshot("node-b", first_rank=8, now=now, spin_since=None, verdict=Verdict.HEALTHY)
    )
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        daemon.holder.publish(
            node_snapshot(
                "node-b",
                first_rank=8,
                now=time.time(),
                spin_since=now - 70,
                verdict=Verdict.DEADLOCK_SUSPECTED,
            )
        )

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    with daemon.http:
        out = Terminal()
        code = run(daemon.url, out=out, err=io.StringIO(), watch_s=0.5, iterations=2, sleep=sleep)
        assert code == 1, "the last view's exit code"
        assert sleeps == [0.5]
        views = out.getvalue().split("\x1b[H\x1b[2J")
        assert views[0] == "" and len(views) == 3, "each view starts by clearing the screen"
        assert "healthy" in views[1] and "deadlock_suspected" in views[2]
        assert views[1].startswith("every 0.5 s, Ctrl-C to stop; at ")

        def interrupted(_seconds: float) -> None:
            raise KeyboardInterrupt

        plain = io.StringIO()  # not a terminal: views one after the other, no escape codes
        assert run(daemon.url, out=plain, err=io.StringIO(), watch_s=1.0, sleep=interrupted) == 1
        assert "\x1b" not in plain.getvalue() and plain.getvalue().count("every 1 s") == 1
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    assert "--watch [S]" in capsys.readouterr().out


def test_status_of_an_unreachable_daemon_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    dead = dead_url()
    code, out, err = run_cli(capsys, "status", "--url", dead)
    assert code == 2 and out == ""
    assert err.startswith(f"gpu-watchdog status: error: {dead}: cannot connect")
    code, out, _err = run_cli(capsys, "status", "--url", dead, "--json", "--timeout", "0.5")
    assert code == 2
    assert json.loads(out)["url"] == dead


def test_status_evidence_shows_local_times_and_a_long_cause_keeps_the_verdict_column_narrow() -> None:
    from datetime import timedelta, timezone

    from gpu_triage.cli.status import MAX_CAUSE_CHARS, render

    now = 1_764_676_800.0  # 2025-12-02 12:00:00 UTC
    long_cause = "detector_error: " + "x" * 200
    status = status_document(
        node_snapshot("node-b", first_rank=8, now=now, spin_since=None, verdict=Verdict.STALLED)
    )
    status["jobs"][0]["cause"] = long_cause
    status["jobs"][0]["evidence"] = {
        "steps_frozen_since": now - 70.3,
        "live_leases": {"8": now + 20.0},
        "step_interval_s": 1.25,
    }
    other = dict(status["jobs"][0], job="short", cause=None, evidence={})
    status["jobs"].append(other)
    text = render(status, "http://node-b:9410", tz=timezone(timedelta(hours=2), "CEST"))
    assert "steps_frozen_since: 2025-12-02 13:58:49 CEST (1m10s ago)" in text
    assert "live_leases: {8: 2025-12-02 14:00:20 CEST (in 20.0 s)}" in text
    assert "step_interval_s: 1.25" in text  # a duration stays a number
    assert str(now - 70.3) not in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("JOB"))
    # the VERDICT column is as wide as the cut cause, not the 200-character one
    assert header.index("BLAME") <= len(JOB) + 2 + len("stalled ()") + MAX_CAUSE_CHARS + 2  # the next column
    assert any(line.startswith("short ") for line in lines)
    assert f"    cause: {json.dumps(long_cause)[:90]}" in text  # cut in the table, given below


def test_status_says_what_the_daemon_cannot_judge_and_why() -> None:
    from gpu_triage.cli.status import exit_code, render

    doc = {
        "node": "node-c",
        "source": "nvml",
        "mode": "observe",
        "armed": False,
        "cycle": 3,
        "time": 1_764_676_800.0,
        "gpus": [],
        "jobs": [
            {
                "job": "container-job",
                "ranks": [{"rank": 0, "step": None}],
                "verdict": "cannot_judge",
                "cause": "no_signals: no progress files; no rank is tied to a GPU",
                "onset": None,
                "raised": 1_764_676_790.0,
                "evidence": {
                    "gpus": [],
                    "gpus_unknown": True,
                    "cannot_judge": [
                        {"what": "steps", "why": "no progress files (no integration)"},
                        {"what": "power", "why": "no rank is tied to a GPU"},
                    ],
                },
            }
        ],
    }
    text = render(doc, "http://node-c:9410")
    assert "cannot_judge (no_signals: no progress files; no rank is tied to a GPU)" in text
    assert (
        "container-job cannot judge: steps (no progress files (no integration)); "
        "power (no rank is tied to a GPU)" in text
    )
    assert exit_code(doc) == 0  # not a deadlock: the contract's exit codes are unchanged
