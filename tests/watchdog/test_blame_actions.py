"""Actions by blame (issue 27 part B, docs/actions.md "Blame"): the real engine, a real event store,
real child processes to kill, a fake clock, and ``scontrol`` as a logging script (the real Slurm runs
in tests/integration/test_slurm_blame.py).

- a hang blamed on the node is never counted by the deterministic-hang breaker;
- the node is drained on a node-blamed hang, and on a hardware fault whose catalog action is
  ``drain_node`` without any hang (the job then left alone); once per fault; never in observe mode,
  never without ``actions.drain``; degraded findings drain nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_triage.actions.drain import drain_requests, reason_text
from gpu_triage.actions.interface import Cycle
from gpu_triage.actions.requeue import requeue_allowed, restarts
from gpu_triage.journal.eventstore import EventStore
from gpu_triage.model.evidence import JobEvidence
from gpu_triage.model.health import (
    Blame,
    FaultKind,
    FaultSource,
    GpuHealth,
    HardwareFinding,
    HealthLevel,
    NodeHealth,
    OperatorAction,
)
from gpu_triage.model.snapshot import JobStatus
from gpu_triage.model.states import Mode, Verdict
from tests.watchdog.snapshots import T0
from tests.watchdog.test_action_engine import Driver, make_engine, two_ranks
from tests.watchdog.test_alerts import make_job
from tests.watchdog.test_delivery import FakeClock
from tests.watchdog.test_kill import Procs, alive, wait_dead

JOB = "qwen3-32b-ft"


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    yield p
    p.cleanup()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    s = EventStore(tmp_path / "state", T0)
    yield s
    s.close()


def xid(gpu: int, code: int = 79, action: OperatorAction = OperatorAction.DRAIN_NODE) -> HardwareFinding:
    return HardwareFinding(
        kind=FaultKind.XID,
        level=HealthLevel.UNHEALTHY,
        blame=Blame.NODE,
        action=action,
        detail=f"Xid {code}",
        source=FaultSource.KERNEL_LOG,
        gpu=gpu,
        xid=code,
        first_seen=T0 - 5.0,
    )


def health(*findings: HardwareFinding) -> NodeHealth:
    gpus = tuple(GpuHealth(f.gpu or 0, None, f.level, (f,)) for f in findings)
    worst = HealthLevel.UNHEALTHY if any(f.is_fault for f in findings) else HealthLevel.DEGRADED
    return NodeHealth(level=worst if findings else HealthLevel.HEALTHY, gpus=gpus)


def node_blamed(job: JobStatus, *faults: HardwareFinding) -> JobStatus:
    return dataclasses.replace(
        job, blame=Blame.NODE, evidence=dataclasses.replace(job.evidence or JobEvidence(), hardware=faults)
    )


def scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """A bin dir whose scontrol logs its argv (one line per call, arguments tab-separated)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "scontrol.log"
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\nprintf "%s\\t" "$@" >> {calls}\necho >> {calls}\n')
    script.chmod(0o755)
    return bin_dir, calls


def calls_of(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.rstrip("\t").split("\t") for line in path.read_text().splitlines() if line]


def cycle(d: Driver, mode: Mode, jobs, procs=None, node_health: NodeHealth | None = None):
    """One engine cycle with the node's health (the Driver predates it)."""
    from tests.watchdog.snapshots import gpu_status
    from tests.watchdog.test_delivery import wait_until

    now = d.clock.advance(1.0)
    out = d.engine.on_cycle(
        Cycle(
            now,
            mode=mode,
            jobs=jobs,
            processes=procs or {},
            gpus=[gpu_status(i) for i in range(2)],
            silences=d.silences,
            progress_dir=None,
            node_health=node_health or NodeHealth(level=HealthLevel.HEALTHY),
        )
    )
    d.records += out
    wait_until(lambda: d.engine.busy == 0, timeout_s=30.0, what="the engine's workers")
    return out


def test_a_hang_blamed_on_the_node_is_never_counted_by_the_deterministic_hang_breaker(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    """Node-blamed hang, then two job-blamed hangs at the same step: killed, killed, and only the
    third is the deterministic hang (the first was the GPU's, not the job's)."""
    clock = FakeClock()
    eng = make_engine(store, tmp_path, clock, max_kills_per_hour=10)
    d = Driver(eng, clock)
    results = []
    try:
        for blamed in (True, False, False):
            pids, p = two_ranks(procs, mode="obey")
            job = make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=[x.pid for x in p[JOB]], onset=clock())
            if blamed:
                job = node_blamed(job, xid(1))
            start = len(d.records)
            d.run(40, Mode.KILL, [job], p)
            results.append(
                [(r["action"], r["result"]) for r in d.records[start:] if r["action"] == "sigterm"]
            )
            if ("sigterm", "ok") in results[-1]:
                assert wait_dead(pids)
            d.run(40, Mode.KILL, [])
    finally:
        eng.close()
    assert ("sigterm", "ok") in results[0]
    assert ("sigterm", "ok") in results[1], "the first hang was the hardware's: not a repeat"
    assert ("sigterm", "refused") in results[2] and ("sigterm", "ok") not in results[2]
    refused = next(r for r in d.records if r["action"] == "sigterm" and r["result"] == "refused")
    assert refused["reason"].startswith("deterministic hang")


def test_a_node_blamed_hang_drains_the_node_once_with_the_fault_as_reason(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    bin_dir, calls = scontrol(tmp_path)
    clock = FakeClock()
    eng = make_engine(store, tmp_path, clock, drain=True, slurm_bin_dir=bin_dir, slurm_node_name="gpu-a17")
    d = Driver(eng, clock)
    pids, p = two_ranks(procs, mode="obey")
    job = node_blamed(make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=[x.pid for x in p[JOB]]), xid(3))
    try:
        for _ in range(5):
            cycle(d, Mode.ALERT, [job], p)  # alert mode: drains, never kills
    finally:
        eng.close()
    got = calls_of(calls)
    assert got == [["update", "NodeName=gpu-a17", "State=DRAIN", "Reason=gpu-watchdog: GPU 3 Xid 79"]], got
    drains = [(r["result"], r.get("cause"), r.get("job")) for r in d.records if r["action"] == "drain"]
    assert drains == [("started", "hang", JOB), ("ok", "hang", JOB)], drains
    assert all(alive(x) for x in pids) and not [
        r for r in d.records if r["action"] == "sigterm" and r["result"] == "ok"
    ]


def test_a_hardware_fault_without_a_hang_drains_when_its_catalog_says_so_and_leaves_the_job_alone(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    bin_dir, calls = scontrol(tmp_path)
    clock = FakeClock()
    eng = make_engine(store, tmp_path, clock, drain=True, slurm_bin_dir=bin_dir, sigterm_after_s=0.0)
    d = Driver(eng, clock)
    pids, p = two_ranks(procs, mode="obey")
    healthy = make_job(Verdict.HEALTHY, ranks=2, pids=[x.pid for x in p[JOB]])
    reset_only = xid(0, 31, OperatorAction.CHECK_APPLICATION)
    degraded = dataclasses.replace(xid(1, 92, OperatorAction.NONE), level=HealthLevel.DEGRADED)
    try:
        for _ in range(3):
            cycle(d, Mode.KILL, [healthy], p, health(reset_only, degraded))
        assert calls_of(calls) == [], "only a drain_node fault drains"
        for _ in range(3):
            cycle(d, Mode.KILL, [healthy], p, health(xid(1, 79), degraded))
    finally:
        eng.close()
    assert calls_of(calls) == [
        ["update", "NodeName=node-a", "State=DRAIN", "Reason=gpu-watchdog: GPU 1 Xid 79"]
    ]
    assert all(alive(x) for x in pids), "the job is left alone"
    assert not [r for r in d.records if r["action"] in ("sigterm", "requeue")]


def test_drains_need_the_setting_and_an_armed_mode_and_happen_once_per_fault_across_restarts(
    tmp_path: Path, store: EventStore
) -> None:
    bin_dir, calls = scontrol(tmp_path)
    clock = FakeClock()
    fault = health(xid(2, 48))
    off = make_engine(store, tmp_path, clock, slurm_bin_dir=bin_dir)
    d = Driver(off, clock)
    try:
        for _ in range(3):
            cycle(d, Mode.KILL, [], None, fault)
    finally:
        off.close()
    on = make_engine(store, tmp_path, clock, drain=True, slurm_bin_dir=bin_dir)
    d2 = Driver(on, clock)
    try:
        for _ in range(3):
            cycle(d2, Mode.OBSERVE, [], None, fault)
        assert calls_of(calls) == []
        for _ in range(3):
            cycle(d2, Mode.ALERT, [], None, fault)
    finally:
        on.close()
    again = make_engine(store, tmp_path, clock, drain=True, slurm_bin_dir=bin_dir)
    d3 = Driver(again, clock)  # a restarted daemon: the same fault does not drain twice
    try:
        for _ in range(3):
            cycle(d3, Mode.ALERT, [], None, fault)
        cycle(d3, Mode.ALERT, [], None, health(dataclasses.replace(xid(2, 48), first_seen=T0 + 500.0)))
    finally:
        again.close()
    assert [(r["result"], r.get("why")) for r in d.records if r["action"] == "drain"] == [
        ("skipped", "actions.drain is false")
    ]
    assert [r["result"] for r in d2.records if r["action"] == "drain"] == ["not_armed", "started", "ok"]
    assert len(calls_of(calls)) == 2, "one drain per fault: the restart did not repeat it, a new fault did"


def test_drain_reasons_are_bounded_printable_and_quote_free() -> None:
    hostile = dataclasses.replace(xid(3), xid=None, kind=FaultKind.GPU_LOST)
    assert reason_text(hostile) == "gpu-watchdog: GPU 3 gpu_lost"
    wide = dataclasses.replace(xid(3), gpu=None, kind=FaultKind.FABRIC, xid=None)
    assert reason_text(wide) == "gpu-watchdog: node fabric"
    job = node_blamed(make_job(Verdict.DEADLOCK_CONFIRMED), xid(5))
    assert [r.reason for r in drain_requests([job], NodeHealth(level=HealthLevel.HEALTHY))] == [
        "gpu-watchdog: GPU 5 Xid 79"
    ]
    # a job-blamed hang, a suspected one, or a node-blamed verdict without a fault drain nothing
    assert (
        drain_requests([dataclasses.replace(job, blame=Blame.JOB)], NodeHealth(level=HealthLevel.HEALTHY))
        == []
    )
    assert (
        drain_requests(
            [dataclasses.replace(job, verdict=Verdict.DEADLOCK_SUSPECTED)],
            NodeHealth(level=HealthLevel.HEALTHY),
        )
        == []
    )
    lost_elsewhere = dataclasses.replace(
        node_blamed(make_job(Verdict.DEADLOCK_CONFIRMED)), cause="node gpu-b7 lost"
    )
    assert drain_requests([lost_elsewhere], NodeHealth(level=HealthLevel.HEALTHY)) == []


def test_requeue_reads_slurms_own_answer() -> None:
    line = "JobId=42 JobName=ft UserId=nobody(65534) Priority=1 Requeue=1 Restarts=2 BatchFlag=1 Reboot=0"
    assert requeue_allowed(line) is True and restarts(line) == 2
    assert requeue_allowed(line.replace("Requeue=1", "Requeue=0")) is False
    assert requeue_allowed("JobId=42 NotRequeue=1") is None and restarts("") is None


def test_a_node_blamed_hang_pages_with_its_blame_and_the_runbook_entry_for_it() -> None:
    from gpu_triage.alerts.model import Condition, build_alert

    job = node_blamed(make_job(Verdict.DEADLOCK_CONFIRMED), xid(3))
    alert = build_alert(job, node="node-a", condition=Condition.DEADLOCK, now=T0, first_seen=T0 - 60.0)
    assert alert.summary.endswith(" - blame node (GPU 3 Xid 79)"), alert.summary
    assert alert.runbook.endswith("#blame_node") and "blame: node (GPU 3 Xid 79)" in alert.description
    assert alert.evidence["blame"] == "node" and alert.evidence["hardware"][0]["xid"] == 79
    plain = build_alert(
        make_job(Verdict.DEADLOCK_CONFIRMED),
        node="node-a",
        condition=Condition.DEADLOCK,
        now=T0,
        first_seen=T0,
    )
    assert plain.runbook.endswith("#deadlock_confirmed") and "blame" not in plain.summary
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operator-guide.md").read_text()
    for blame in Blame:
        assert f"\n### blame_{blame}\n" in guide, f"runbook entry for blame {blame}"


def test_a_failed_drain_is_tried_again_a_minute_later_not_every_cycle(
    tmp_path: Path, store: EventStore
) -> None:
    from gpu_triage.actions.drain import DRAIN_RETRY_S

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    script = bin_dir / "scontrol"  # slurmctld down for the first call
    script.write_text(
        f'#!/bin/sh\necho x >> {calls}\n[ "$(wc -l < {calls})" -gt 1 ] || {{ echo down >&2; exit 1; }}\n'
    )
    script.chmod(0o755)
    clock = FakeClock()
    eng = make_engine(store, tmp_path, clock, drain=True, slurm_bin_dir=bin_dir)
    d = Driver(eng, clock)
    try:
        for _ in range(int(DRAIN_RETRY_S) + 5):
            cycle(d, Mode.ALERT, [], None, health(xid(2, 48)))
    finally:
        eng.close()
    results = [(r["result"], r.get("retry_in_s")) for r in d.records if r["action"] == "drain"]
    assert results == [("started", None), ("error", DRAIN_RETRY_S), ("started", None), ("ok", None)], results
    assert len(calls.read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("show", "requeue_rc", "dry_run", "want"),
    [
        ("JobId=42 Requeue=1 Restarts=0", 0, False, "ok"),
        ("JobId=42 Requeue=0 Restarts=0", 0, False, "not requeueable"),
        ("JobId=42 Restarts=0", 0, False, "not requeueable"),
        ("JobId=42 Requeue=1 Restarts=0", 1, False, "scontrol requeue 42 failed: Invalid job state"),
        ("JobId=42 Requeue=1 Restarts=0", 0, True, "dry"),
    ],
)
def test_requeue_only_what_slurm_says_may_be_requeued_else_the_rung_cancels(
    tmp_path: Path, show: str, requeue_rc: int, dry_run: bool, want: str
) -> None:
    """The requeue module against a scripted scontrol (the real one: test_slurm_blame.py)."""
    from gpu_triage.actions.kill_targets import SubprocessRunner
    from gpu_triage.actions.requeue import requeue
    from gpu_triage.signals.slurm import SlurmIdentity, SlurmTarget

    calls = tmp_path / "calls"
    (tmp_path / "scontrol").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        f'if [ "$1" = show ]; then echo "{show}"; exit 0; fi\n'
        f'[ {requeue_rc} -eq 0 ] || {{ echo "Invalid job state" >&2; exit {requeue_rc}; }}\n'
    )
    (tmp_path / "scontrol").chmod(0o755)
    target = SlurmTarget(SlurmIdentity("42", "0"), 1000, (4711,), ("stepd",))
    out = requeue(SubprocessRunner(), target, bin_dir=tmp_path, timeout_s=10.0, dry_run=dry_run)
    ran = calls.read_text().splitlines()
    assert ran[0] == "show job -o 42"
    if want == "ok":
        assert out.ok and ran[1:] == ["requeue 42"] and out.to_dict()["requeue"] is True
    elif want == "dry":
        assert out.ok and out.result is None and ran[1:] == [], "a dry run requeues nothing"
    else:
        assert not out.ok and want in (out.refused or ""), out.refused
        assert ran[1:] == ([] if "requeueable" in want else ["requeue 42"])
