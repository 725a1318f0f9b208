"""The action ladder end to end: a real event store, real HTTP receivers on loopback, real child
processes to kill, and a fake clock for every delay (a five-minute outage takes no real minutes)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.actions.engine import ActionEngine
from gpu_triage.actions.interface import Cycle
from gpu_triage.actions.silences import SilenceBook
from gpu_triage.daemon.config import ActionsConfig, AlertsConfig, SinkConfig
from gpu_triage.journal.eventstore import EventStore
from gpu_triage.model.snapshot import JobStatus
from gpu_triage.model.states import GpuState, Mode, Verdict
from gpu_triage.signals.nccl_ras.poller import RasConfig
from gpu_triage.signals.ranks import RankProcess
from gpu_triage.signals.stacks.sampler import find_py_spy
from tests.watchdog.engines import build_engine
from tests.watchdog.snapshots import T0, gpu_status
from tests.watchdog.test_alerts import make_job
from tests.watchdog.test_delivery import FakeClock, Receiver, free_port, receiver, secret_file, wait_until
from tests.watchdog.test_kill import JOB_SCRIPT, Procs, alive, wait_dead

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


def rank_process(job: str, pid: int, rank: int) -> RankProcess:
    return RankProcess(
        job,
        pid,
        rank,
        rank,
        2,
        rank,
        (rank,),
        "progress",
        alive=True,
        status="sleeping",
        pgid=None,
        cpu_time_s=1.0,
        cpu_time_delta_s=0.0,
        read_bytes_delta=0,
        write_bytes_delta=0,
        read_chars_delta=0,
        write_chars_delta=0,
        interval_s=1.0,
        proof=("rank_env", "progress_file"),
    )


def make_engine(
    store: EventStore,
    tmp_path: Path,
    clock: FakeClock,
    *,
    sinks: Sequence[SinkConfig] = (),
    py_spy: str | None = None,
    **actions_kw: Any,
) -> ActionEngine:
    defaults: dict[str, Any] = {
        "capture_after_s": 0.0,
        "alert_after_s": 10.0,
        "sigterm_after_s": 30.0,
        "sigkill_grace_s": 5.0,
        "capture_timeout_s": 10.0,
        "max_kills_per_hour": 1,
    }
    return build_engine(
        store,
        tmp_path / "state",
        clock=clock,
        actions=ActionsConfig(**{**defaults, **actions_kw}),
        alerts=AlertsConfig(
            sinks=tuple(sinks), resend_interval_s=60.0, retry_initial_s=1.0, retry_max_s=120.0
        ),
        ras=RasConfig(host="127.0.0.1", port=free_port()),
        py_spy=py_spy,
        adopt_window_s=120.0,
    )


class Driver:
    """Runs cycles on the fake clock; waits for the engine's workers after each cycle so that fake
    time never races ahead of a capture or a kill still running in real time."""

    def __init__(self, engine: ActionEngine, clock: FakeClock, silences: SilenceBook | None = None) -> None:
        self.engine = engine
        self.clock = clock
        self.silences = silences or SilenceBook()
        self.records: list[dict[str, Any]] = []

    def cycle(
        self, mode: Mode, jobs: Sequence[JobStatus], procs: dict[str, list[RankProcess]] | None = None
    ) -> list[dict[str, Any]]:
        now = self.clock.advance(1.0)
        gpus = [gpu_status(i, state=GpuState.CHECKPOINT_OR_DEADLOCK, power_w=240.0) for i in range(2)]
        out = self.engine.on_cycle(
            Cycle(
                now,
                mode=mode,
                jobs=jobs,
                processes=procs or {},
                gpus=gpus,
                silences=self.silences,
                progress_dir=None,
            )
        )
        self.records += out
        wait_until(lambda: self.engine.busy == 0, timeout_s=30.0, what="the engine's workers")
        return out

    def run(
        self,
        seconds: int,
        mode: Mode,
        jobs: Callable[[float], Sequence[JobStatus]] | Sequence[JobStatus],
        procs: dict[str, list[RankProcess]] | None = None,
    ) -> None:
        for _ in range(seconds):
            self.cycle(mode, jobs(self.clock() + 1.0) if callable(jobs) else jobs, procs)

    def actions(self, action: str | None = None) -> list[tuple[str, str]]:
        return [(r["action"], r["result"]) for r in self.records if action is None or r["action"] == action]


def two_ranks(
    procs: Procs, job: str = JOB, mode: str = "ignore"
) -> tuple[list[int], dict[str, list[RankProcess]]]:
    _, (rank0, worker0) = procs.spawn(JOB_SCRIPT, mode)
    _, (rank1, worker1) = procs.spawn(JOB_SCRIPT, mode)
    pids = [rank0, worker0, rank1, worker1]
    return pids, {job: [rank_process(job, rank0, 0), rank_process(job, rank1, 1)]}


# --------------------------------------------------------------------------------------------------


def test_observe_mode_captures_but_never_alerts_or_kills(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="obey")
    with receiver() as am:
        eng = make_engine(
            store, tmp_path, clock, sinks=[SinkConfig(kind="alertmanager", name="am", url=am.url)]
        )
        d = Driver(eng, clock)
        try:
            rank_pids = [p.pid for p in processes[JOB]]
            suspected = make_job(Verdict.DEADLOCK_SUSPECTED, ranks=2, pids=rank_pids)
            confirmed = make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=rank_pids)
            d.run(20, Mode.OBSERVE, [suspected], processes)
            d.run(100, Mode.OBSERVE, [confirmed], processes)
        finally:
            eng.close()
        assert am.requests == []
    assert d.actions() == [
        ("ladder", "started"),
        ("capture", "started"),
        ("capture", "ok"),
        ("sigterm", "not_armed"),
    ]
    assert all(alive(p) for p in pids)
    evidence = [e for e in store.since(0, 1000) if e.kind == "evidence"]
    assert len(evidence) == 1 and evidence[0].job == JOB
    assert Path(evidence[0].payload["path"]).is_dir()
    assert (Path(evidence[0].payload["path"]) / "index.json").is_file()
    assert eng.counters[("capture", "ok")] == 1


def test_kill_mode_full_ladder_in_order(tmp_path: Path, store: EventStore, procs: Procs) -> None:
    """Evidence, then an Alertmanager alert received, then SIGTERM and SIGKILL of exactly the job's
    processes (they ignore SIGTERM); a stranger survives; the alert resolves when the job clears."""
    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="ignore")
    stranger = procs.sleeper()
    rank_pids = [p.pid for p in processes[JOB]]
    groups = sorted({os.getpgid(p) for p in rank_pids})
    with receiver() as am:
        eng = make_engine(
            store,
            tmp_path,
            clock,
            sinks=[SinkConfig(kind="alertmanager", name="am", url=am.url)],
            py_spy=find_py_spy("auto"),
        )
        d = Driver(eng, clock)
        try:
            suspected = make_job(Verdict.DEADLOCK_SUSPECTED, ranks=2, pids=rank_pids)
            confirmed = make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=rank_pids)
            d.run(9, Mode.KILL, [suspected], processes)
            assert d.actions("alert") == []  # alert_after_s = 10 s not reached
            d.run(2, Mode.KILL, [suspected], processes)
            fired = am.wait_for(1)
            assert fired[0].body[0]["labels"]["condition"] == "deadlock"
            assert fired[0].body[0]["annotations"]["bundle"].startswith(str(tmp_path / "state" / "evidence"))
            d.run(10, Mode.KILL, [confirmed], processes)
            assert d.actions("sigterm") == []
            d.run(30, Mode.KILL, [confirmed], processes)  # sigterm_after_s = 30 s after confirmation
            assert ("sigterm", "ok") in d.actions()
            d.run(6, Mode.KILL, [confirmed], processes)  # sigkill_grace_s = 5 s
            assert wait_dead(pids)
            d.run(3, Mode.KILL, [make_job(Verdict.HEALTHY, ranks=2, pids=rank_pids)], processes)
            wait_until(
                lambda: any(
                    r.body[0]["endsAt"] <= r.body[0]["startsAt"]
                    or "RESOLVED" in r.body[0]["annotations"]["summary"]
                    for r in am.requests
                ),
                what="the resolve",
            )
        finally:
            eng.close()
    assert alive(stranger.pid)
    assert d.actions() == [
        ("ladder", "started"),
        ("capture", "started"),
        ("capture", "ok"),
        ("alert", "queued"),
        ("alert", "updated"),  # escalated to confirmed
        ("sigterm", "started"),
        ("sigterm", "ok"),
        ("alert", "updated"),  # "SIGTERM sent"
        ("sigkill", "ok"),
        ("resolve", "queued"),
        ("ladder", "ended"),
    ]
    sigterm = next(r for r in d.records if r["action"] == "sigterm" and r["result"] == "ok")
    assert sigterm["plan"]["groups"] == groups and sigterm["plan"]["pids"] == []
    assert set(sigterm["plan"]["members"]) == set(pids)
    sigkill = next(r for r in d.records if r["action"] == "sigkill")
    assert set(sigkill["plan"]["members"]) <= set(pids)
    kinds = [
        (e.kind, e.payload.get("action"), e.payload.get("result"))
        for e in store.since(0, 1000)
        if e.kind in ("evidence", "action")
    ]
    order = [k for k in kinds if k[0] == "evidence" or k[1] in ("alert", "sigterm", "sigkill")]
    assert order[0][0] == "evidence"  # the bundle is indexed before any alert or signal
    assert [k[1] for k in order[1:]] == ["alert", "alert", "sigterm", "sigterm", "alert", "sigkill"]
    items = {
        i["name"] for i in next(e for e in store.since(0, 1000) if e.kind == "evidence").payload["items"]
    }
    assert {"py_spy", "process_tree", "nccl_ras", "flight_recorder", "status"} <= items


def test_alert_mode_escalates_and_resolves_and_never_signals(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="obey")
    rank_pids = [p.pid for p in processes[JOB]]
    with receiver(default_status=202) as pd:
        key = secret_file(tmp_path / "pd.key", "R0UTING")
        eng = make_engine(
            store,
            tmp_path,
            clock,
            sinks=[SinkConfig(kind="pagerduty", name="pd", url=pd.url, routing_key_file=key)],
        )
        d = Driver(eng, clock)
        try:
            d.run(15, Mode.ALERT, [make_job(Verdict.DEADLOCK_SUSPECTED, ranks=2, pids=rank_pids)], processes)
            d.run(60, Mode.ALERT, [make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=rank_pids)], processes)
            d.run(2, Mode.ALERT, [make_job(Verdict.CHECKPOINT, ranks=2, pids=rank_pids)], processes)
            got = pd.wait_for(3)
        finally:
            eng.close()
    assert [g.body["event_action"] for g in got] == ["trigger", "trigger", "resolve"]
    assert [g.body.get("payload", {}).get("severity") for g in got[:2]] == ["error", "critical"]
    assert len({g.body["dedup_key"] for g in got}) == 1
    assert ("sigterm", "not_armed") in d.actions()
    assert all(alive(p) for p in pids)


def test_active_alerts_are_re_sent_to_alertmanager(tmp_path: Path, store: EventStore) -> None:
    clock = FakeClock()
    with receiver() as am, receiver() as hook:
        sinks = [
            SinkConfig(kind="alertmanager", name="am", url=am.url),
            SinkConfig(kind="webhook", name="hook", url=hook.url),
        ]
        eng = make_engine(store, tmp_path, clock, sinks=sinks)
        d = Driver(eng, clock)
        try:
            job = make_job(Verdict.DEADLOCK_SUSPECTED, ranks=2)
            key = "node-a:qwen3-32b-ft:deadlock"
            d.run(11, Mode.ALERT, [job])
            for _ in range(2):
                wait_until(lambda: not eng.delivery.has_pending("am", key), what="the last delivery done")
                d.run(60, Mode.ALERT, [job])  # resend_interval_s = 60
            wait_until(lambda: not eng.delivery.has_pending("am", key), what="the last delivery done")
            d.run(1, Mode.ALERT, [make_job(Verdict.HEALTHY, ranks=2)])
            got = am.wait_for(4)
            hooks = hook.wait_for(2)
        finally:
            eng.close()
    assert len(got) == 4  # the alert, two re-sends, the resolve
    assert len({json.dumps(g.body[0]["labels"], sort_keys=True) for g in got}) == 1
    ends = [g.body[0]["endsAt"] for g in got]
    assert ends[0] < ends[1] < ends[2] and ends[3] < ends[2]  # firing: pushed ahead; resolved: now
    assert float(got[2].body[0]["annotations"]["gpu_hours"]) > float(
        got[0].body[0]["annotations"]["gpu_hours"]
    )
    assert [h.body["status"] for h in hooks] == ["firing", "resolved"]  # other sinks are not re-sent
    assert eng.counters[("alert_resend", "queued")] == 2


def test_silence_suppresses_alerts_not_evidence(tmp_path: Path, store: EventStore) -> None:
    clock = FakeClock()
    silences = SilenceBook()
    silence = silences.add({"job": JOB}, 3600.0, "known issue, being fixed", clock())
    with receiver() as hook:
        eng = make_engine(
            store, tmp_path, clock, sinks=[SinkConfig(kind="webhook", name="hook", url=hook.url)]
        )
        d = Driver(eng, clock, silences)
        try:
            job = make_job(Verdict.DEADLOCK_SUSPECTED, ranks=2)
            d.run(30, Mode.ALERT, [job])
            assert ("capture", "ok") in d.actions() and ("alert", "silenced") in d.actions()
            assert hook.requests == [] and d.actions("alert") == [("alert", "silenced")]
            silences.delete(silence.id)
            d.run(1, Mode.ALERT, [job])
            assert hook.wait_for(1)[0].body["job"] == JOB
        finally:
            eng.close()


def test_other_verdicts_alert_but_never_capture_or_kill(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="obey")
    rank_pids = [p.pid for p in processes[JOB]]
    with receiver() as hook:
        eng = make_engine(
            store, tmp_path, clock, sinks=[SinkConfig(kind="webhook", name="hook", url=hook.url)]
        )
        d = Driver(eng, clock)
        try:
            for verdict in (Verdict.STALLED_CHECKPOINT, Verdict.DATA_STARVATION, Verdict.TELEMETRY_LOST):
                d.run(200, Mode.KILL, [make_job(verdict, ranks=2, pids=rank_pids)], processes)
            d.run(1, Mode.KILL, [make_job(Verdict.HEALTHY, ranks=2, pids=rank_pids)], processes)
            got = hook.wait_for(6)
        finally:
            eng.close()
    assert [(g.body["condition"], g.body["status"]) for g in got] == [
        ("stalled_checkpoint", "firing"),
        ("stalled_checkpoint", "resolved"),
        ("data_starvation", "firing"),
        ("data_starvation", "resolved"),
        ("telemetry_lost", "firing"),
        ("telemetry_lost", "resolved"),
    ]
    assert not [a for a in d.actions() if a[0] in ("capture", "sigterm", "sigkill", "kill_hook")]
    assert all(alive(p) for p in pids)


def test_dry_run_records_the_plan_and_signals_nothing(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="obey")
    rank_pids = [p.pid for p in processes[JOB]]
    eng = make_engine(store, tmp_path, clock, dry_run=True, max_kills_per_hour=0)
    d = Driver(eng, clock)
    try:
        d.run(60, Mode.KILL, [make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=rank_pids)], processes)
    finally:
        eng.close()
    assert ("sigterm", "dry_run") in d.actions() and ("sigkill", "dry_run") in d.actions()
    plan = next(r for r in d.records if r["action"] == "sigterm" and r["result"] == "dry_run")["plan"]
    assert set(plan["members"]) == set(pids) and plan["groups"]
    assert all(alive(p) for p in pids)


def test_kills_per_hour_limit_survives_a_restart(tmp_path: Path, store: EventStore, procs: Procs) -> None:
    clock = FakeClock()
    first_pids, first = two_ranks(procs, job="job-a", mode="obey")
    eng = make_engine(store, tmp_path, clock, max_kills_per_hour=1)
    d = Driver(eng, clock)
    try:
        job_a = make_job(
            Verdict.DEADLOCK_CONFIRMED, job="job-a", ranks=2, pids=[p.pid for p in first["job-a"]]
        )
        d.run(40, Mode.KILL, [job_a], first)
        assert ("sigterm", "ok") in d.actions()
        assert wait_dead(first_pids)
    finally:
        eng.close()

    second_pids, second = two_ranks(procs, job="job-b", mode="obey")
    eng2 = make_engine(store, tmp_path, clock, max_kills_per_hour=1)  # a restarted daemon
    d2 = Driver(eng2, clock)
    try:
        job_b = make_job(
            Verdict.DEADLOCK_CONFIRMED, job="job-b", ranks=2, step=77, pids=[p.pid for p in second["job-b"]]
        )
        d2.run(60, Mode.KILL, [job_b], second)
        assert d2.actions("sigterm") == [("sigterm", "rate_limited")]
        assert all(alive(p) for p in second_pids)
        clock.advance(3600.0)
        d2.run(2, Mode.KILL, [job_b], second)
        assert ("sigterm", "ok") in d2.actions()
        assert wait_dead(second_pids)
    finally:
        eng2.close()


def test_deterministic_hang_pages_instead_of_killing_again(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    clock = FakeClock()
    with receiver() as hook:
        sinks = [SinkConfig(kind="webhook", name="hook", url=hook.url)]
        eng = make_engine(store, tmp_path, clock, sinks=sinks, max_kills_per_hour=10)
        d = Driver(eng, clock)
        try:
            pids1, p1 = two_ranks(procs, mode="obey")
            first = make_job(
                Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=[p.pid for p in p1[JOB]], onset=clock()
            )
            d.run(40, Mode.KILL, [first], p1)
            assert wait_dead(pids1)
            d.run(40, Mode.KILL, [])  # the job is gone; it is restarted from its checkpoint...
            pids2, p2 = two_ranks(procs, mode="obey")
            again = make_job(
                Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=[p.pid for p in p2[JOB]], onset=clock()
            )
            d.run(60, Mode.KILL, [again], p2)  # ...and hangs at the same step again
            got = hook.wait_for(4)
        finally:
            eng.close()
        assert all(alive(p) for p in pids2)
    conditions = [(g.body["condition"], g.body["status"]) for g in got]
    assert ("deterministic_hang", "firing") in conditions
    page = next(g.body for g in got if g.body["condition"] == "deterministic_hang")
    assert page["summary"].startswith("DETERMINISTIC HANG - do not restart")
    assert page["dedup_key"] == "node-a:qwen3-32b-ft:deterministic_hang"
    assert page["runbook"].endswith("#deterministic_hang")
    refused = [r for r in d.records if r["action"] == "sigterm" and r["result"] == "refused"]
    assert len(refused) == 1 and refused[0]["signature"] == f"{JOB}@1200"
    assert [a for a in d.actions("sigterm") if a[1] == "ok"] == [("sigterm", "ok")]  # the first hang only


def test_kill_hook_runs_an_argument_vector(tmp_path: Path, store: EventStore, procs: Procs) -> None:
    clock = FakeClock()
    out = tmp_path / "hook-argv.json"
    marker = tmp_path / "pwned"
    script = "import json, sys\njson.dump(sys.argv[1:], open(sys.argv[1], 'w'))\n"
    evil = f"evil; touch {marker}"
    pids, processes = two_ranks(procs, job=evil, mode="obey")
    rank_pids = [p.pid for p in processes[evil]]
    eng = make_engine(
        store,
        tmp_path,
        clock,
        kill_hook=(sys.executable, "-c", script, str(out), "{job}", "{pids}", "--node={node}"),
    )
    d = Driver(eng, clock)
    try:
        d.run(
            45,
            Mode.KILL,
            [make_job(Verdict.DEADLOCK_CONFIRMED, job=evil, ranks=2, pids=rank_pids)],
            processes,
        )
    finally:
        eng.close()
    assert json.loads(out.read_text()) == [str(out), evil, ",".join(map(str, rank_pids)), "--node=node-a"]
    assert not marker.exists()
    assert ("kill_hook", "ok") in d.actions()
    assert ("kill_hook", "still_alive") in d.actions()  # this hook kills nothing: said so after the grace
    assert not d.actions("sigterm") and all(alive(p) for p in pids)


def test_outbox_and_active_alerts_survive_an_engine_restart(tmp_path: Path, store: EventStore) -> None:
    clock = FakeClock()
    port = free_port()
    sinks = [SinkConfig(kind="webhook", name="hook", url=f"http://127.0.0.1:{port}/hook")]
    eng = make_engine(store, tmp_path, clock, sinks=sinks)
    d = Driver(eng, clock)
    job = make_job(Verdict.DEADLOCK_SUSPECTED, ranks=2)
    try:
        d.run(12, Mode.ALERT, [job])
        assert ("alert", "queued") in d.actions()
    finally:
        eng.close()
    assert store.outbox_size() == 1

    with receiver(port=port) as hook:
        eng2 = make_engine(store, tmp_path, clock, sinks=sinks)
        d2 = Driver(eng2, clock)
        try:
            d2.run(
                5, Mode.ALERT, [make_job(Verdict.HEALTHY, ranks=2)]
            )  # the restarted detector: healthy at first
            clock.advance(200.0)
            assert hook.wait_for(1)[0].body["status"] == "firing"  # queued before the restart, delivered now
            d2.run(121, Mode.ALERT, [make_job(Verdict.HEALTHY, ranks=2)])  # ...and it never comes back
            got = hook.wait_for(2)
        finally:
            eng2.close()
    assert [g.body["status"] for g in got] == ["firing", "resolved"]
    assert "restarting" in got[1].body["actions"]["resolved_because"]


def test_restarted_engine_adopts_an_alert_that_is_still_true(tmp_path: Path, store: EventStore) -> None:
    clock = FakeClock()
    with receiver() as hook:
        sinks = [SinkConfig(kind="webhook", name="hook", url=hook.url)]
        eng = make_engine(store, tmp_path, clock, sinks=sinks)
        d = Driver(eng, clock)
        job = make_job(Verdict.DEADLOCK_SUSPECTED, ranks=2)
        try:
            d.run(12, Mode.ALERT, [job])
            hook.wait_for(1)
        finally:
            eng.close()
        eng2 = make_engine(store, tmp_path, clock, sinks=sinks)
        d2 = Driver(eng2, clock)
        try:
            d2.run(30, Mode.ALERT, [make_job(Verdict.HEALTHY, ranks=2)])
            d2.run(30, Mode.ALERT, [job])  # back within the adoption window: no second page
            d2.run(2, Mode.ALERT, [make_job(Verdict.HEALTHY, ranks=2)])
            got = hook.wait_for(2)
        finally:
            eng2.close()
    assert [g.body["status"] for g in got] == ["firing", "resolved"]
    assert ("alert", "adopted") in d2.actions()


def test_a_restarted_engine_resumes_the_episode_it_had_in_progress(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    """Restarted mid-hang (suspected, captured, not yet killed), the engine continues the episode: no
    second ladder, no second bundle, no 'deterministic hang' refusal although the restarted detector
    re-dates the onset; the job is killed once."""
    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="obey")
    rank_pids = [p.pid for p in processes[JOB]]
    eng = make_engine(store, tmp_path, clock, max_kills_per_hour=10)
    d = Driver(eng, clock)
    try:
        d.run(12, Mode.KILL, [make_job(Verdict.DEADLOCK_SUSPECTED, ranks=2, pids=rank_pids)], processes)
        assert d.actions()[:3] == [("ladder", "started"), ("capture", "started"), ("capture", "ok")]
    finally:
        eng.close()
    eng2 = make_engine(store, tmp_path, clock, max_kills_per_hour=10)  # a restarted daemon
    d2 = Driver(eng2, clock)
    redated = make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=rank_pids, onset=clock() - 20.0)
    try:
        d2.run(40, Mode.KILL, [redated], processes)
        assert wait_dead(pids)
    finally:
        eng2.close()
    assert d2.actions("ladder") == [("ladder", "resumed")]
    assert ("capture", "started") not in d2.actions()
    assert not [a for a in d2.actions() if a[1] == "refused"]
    assert d2.actions("sigterm")[:2] == [("sigterm", "started"), ("sigterm", "ok")]


def test_a_restart_between_sigterm_and_sigkill_still_sends_the_sigkill(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    """The ranks ignore SIGTERM and the engine that sent it stops before its SIGKILL (due 60 s later).
    The restarted engine knows the pids it signalled (the detector keeps calling them ``killed``: no
    new episode, no second kill against the budget) and sends the SIGKILL rung when the grace ends."""
    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="ignore")
    rank_pids = [p.pid for p in processes[JOB]]
    confirmed = make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=rank_pids)
    eng = make_engine(store, tmp_path, clock, sigkill_grace_s=60.0)
    d = Driver(eng, clock)
    try:
        d.run(40, Mode.KILL, [confirmed], processes)
    finally:
        eng.close()
    assert ("sigterm", "ok") in d.actions() and not d.actions("sigkill"), d.actions()
    assert not wait_dead(pids, timeout_s=1.0), "the ranks ignore SIGTERM"
    eng2 = make_engine(store, tmp_path, clock, sigkill_grace_s=60.0)
    assert eng2.signalled_pids(JOB) == frozenset(rank_pids)
    d2 = Driver(eng2, clock)
    try:
        d2.run(70, Mode.KILL, [make_job(Verdict.KILLED, ranks=2, pids=rank_pids)], processes)
        assert wait_dead(pids)
    finally:
        eng2.close()
    kills = [(r["result"], r.get("resumed")) for r in d2.records if r["action"] == "sigkill"]
    assert kills == [("ok", True)], d2.records
    assert not d2.actions("sigterm"), d2.actions()


def test_a_restarted_engine_that_is_not_armed_sends_no_persisted_sigkill(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="ignore")
    confirmed = make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=[p.pid for p in processes[JOB]])
    eng = make_engine(store, tmp_path, clock, sigkill_grace_s=60.0)
    try:
        Driver(eng, clock).run(40, Mode.KILL, [confirmed], processes)
    finally:
        eng.close()
    eng2 = make_engine(store, tmp_path, clock, sigkill_grace_s=60.0)
    d2 = Driver(eng2, clock)
    try:
        d2.run(70, Mode.ALERT, [], processes)
    finally:
        eng2.close()
    assert d2.actions("sigkill") == [("sigkill", "disarmed")]
    assert not wait_dead(pids, timeout_s=1.0)


def test_a_persisted_kill_is_restored_exactly_and_hostile_ones_are_dropped() -> None:
    from gpu_triage.actions.episode import KillState
    from gpu_triage.actions.kill_policy import restored_kill, saved_kill
    from gpu_triage.actions.kill_targets import KillPlan
    from gpu_triage.model.actions import KillStage

    plan = KillPlan((4242,), (4243,), {4242: 1796338649.25, 4243: None, 4244: 1796338650.0})
    k = KillState("job", False, False, KillStage.TERM_SENT, plan=plan, term_time=1796338700.5)
    back = restored_kill("job", saved_kill(k))
    assert back is not None and back.resumed
    assert (back.plan, back.term_time, back.stage) == (plan, k.term_time, KillStage.TERM_SENT)
    assert saved_kill(KillState("job", True, False, KillStage.TERM_SENT, plan=plan, term_time=1.0)) is None
    assert saved_kill(KillState("job", False, True, KillStage.TERM_SENT, plan=plan, term_time=1.0)) is None
    good = saved_kill(k)
    assert good is not None
    for bad in (
        None, [], "x", {}, good | {"term_time": float("nan")}, good | {"term_time": True},
        good | {"pids": [1]}, good | {"pids": ["4243"]}, good | {"groups": [0]},
        good | {"members": [[4242]]}, good | {"members": [[4242, "yesterday"]]},
        good | {"groups": [], "pids": []}, good | {"pids": list(range(2, 5000))},
    ):  # fmt: skip
        assert restored_kill("job", bad) is None, bad


def test_five_minute_outage_loses_nothing_and_cycle_time_stays_flat(
    tmp_path: Path, store: EventStore
) -> None:
    clock = FakeClock()
    ports = {kind: free_port() for kind in ("alertmanager", "pagerduty", "slack", "webhook")}
    sinks = [
        SinkConfig(kind="alertmanager", name="am", url=f"http://127.0.0.1:{ports['alertmanager']}"),
        SinkConfig(
            kind="pagerduty",
            name="pd",
            url=f"http://127.0.0.1:{ports['pagerduty']}/v2/enqueue",
            routing_key_file=secret_file(tmp_path / "pd.key", "R0UTING"),
        ),
        SinkConfig(
            kind="slack",
            name="slack",
            url_file=secret_file(tmp_path / "slack.url", f"http://127.0.0.1:{ports['slack']}/services/X"),
        ),
        SinkConfig(kind="webhook", name="hook", url=f"http://127.0.0.1:{ports['webhook']}/hook"),
    ]
    eng = make_engine(store, tmp_path, clock, sinks=sinks)
    d = Driver(eng, clock)
    start = clock()

    def jobs(now: float) -> list[JobStatus]:
        t = now - start
        out = [make_job(Verdict.HEALTHY, job=f"healthy-{i}", ranks=2) for i in range(6)]
        if 10 <= t < 200:
            verdict = Verdict.DEADLOCK_SUSPECTED if t < 60 else Verdict.DEADLOCK_CONFIRMED
            out.append(make_job(verdict, ranks=2))
        if 50 <= t < 250:
            out.append(make_job(Verdict.STALLED_CHECKPOINT, job="ckpt-job", ranks=2))
        return out

    durations: list[float] = []
    try:
        for _ in range(300):  # every receiver down for five minutes (fake time)
            now = clock.advance(1.0)
            started = time.perf_counter()
            d.records += eng.on_cycle(
                Cycle(
                    now,
                    mode=Mode.ALERT,
                    jobs=jobs(now),
                    processes={},
                    gpus=[],
                    silences=d.silences,
                    progress_dir=None,
                )
            )
            durations.append(time.perf_counter() - started)
            wait_until(lambda: eng.busy == 0, timeout_s=30.0, what="workers")
        queued = store.outbox_size()
        assert queued >= 12  # 2 alerts x (trigger + escalation/none + resolve) x 4 sinks, plus resends
        receivers = {
            kind: Receiver(port=port, default_status=202 if kind == "pagerduty" else 200)
            for kind, port in ports.items()
        }
        try:
            for _ in range(6):
                clock.advance(100.0)  # retries come due (backoff capped at 120 s)
                time.sleep(0.1)
            wait_until(lambda: store.outbox_size() == 0, timeout_s=20.0, what="every queued delivery")
        finally:
            for r in receivers.values():
                r.stop()
    finally:
        eng.close()
    sent = [
        r for r in d.records if r["action"] in ("alert", "resolve") and r["result"] in ("queued", "updated")
    ]
    for kind, name in (("pagerduty", "pd"), ("slack", "slack"), ("webhook", "hook")):
        expected = sum(1 for r in sent if name in r["sinks"])
        assert len(receivers[kind].requests) == expected, kind
    am = receivers["alertmanager"].requests
    assert len(am) >= sum(1 for r in sent if "am" in r["sinks"])  # plus resends
    pd = [(r.body["dedup_key"], r.body["event_action"]) for r in receivers["pagerduty"].requests]
    by_key: dict[str, list[str]] = {}
    for key, action in pd:
        by_key.setdefault(key, []).append(action)
    assert by_key == {
        "node-a:qwen3-32b-ft:deadlock": ["trigger", "trigger", "resolve"],  # suspected, confirmed, cleared
        "node-a:ckpt-job:stalled_checkpoint": ["trigger", "resolve"],
    }
    # cycle time: as flat at the end of the outage as at its start (nothing waits for the network)
    quiet = [durations[i] for i in range(300) if i < 9 or i >= 260]
    assert statistics.median(durations[260:]) < max(3 * statistics.median(durations[:9]), 0.0005)
    # and no single cycle near a sink's timeout (5 s by default; a cycle that waited on a delivery
    # would take that long). Not 50 ms: one cycle descheduled on a loaded 2-core machine took 85.
    assert max(quiet) < 0.5, max(quiet)


def test_on_cycle_does_no_work_when_nothing_is_due(tmp_path: Path, store: EventStore) -> None:
    clock = FakeClock()
    eng = make_engine(
        store, tmp_path, clock, sinks=[SinkConfig(kind="webhook", name="h", url="http://127.0.0.1:9/")]
    )
    jobs = [make_job(Verdict.HEALTHY, job=f"job-{i}", ranks=8) for i in range(8)]
    silences = SilenceBook()
    events_before = store.last_id()
    try:
        for _ in range(2000):
            now = clock.advance(0.1)
            records = eng.on_cycle(
                Cycle(
                    now,
                    mode=Mode.KILL,
                    jobs=jobs,
                    processes={},
                    gpus=[],
                    silences=silences,
                    progress_dir=None,
                )
            )
            # healthy jobs: nothing recorded, queued, stored or handed to a worker
            assert records == []
            assert eng.busy == 0
        assert store.last_id() == events_before and store.outbox_size() == 0
    finally:
        eng.close()


def test_on_cycle_never_raises(tmp_path: Path) -> None:
    clock = FakeClock()
    store = EventStore(tmp_path / "state", T0)
    eng = make_engine(store, tmp_path, clock)
    store.close()  # the store is gone under the engine
    try:
        records = eng.on_cycle(
            Cycle(
                clock.advance(1),
                mode=Mode.KILL,
                jobs=[make_job(Verdict.DEADLOCK_CONFIRMED)],
                processes={},
                gpus=[],
                silences=SilenceBook(),
                progress_dir=None,
            )
        )
        assert ("ladder", "started") in [(r["action"], r["result"]) for r in records]
        bad = make_job(Verdict.DEADLOCK_SUSPECTED, job="x")
        records = eng.on_cycle(
            Cycle(
                clock.advance(1),
                mode="nonsense",
                jobs=[bad],
                processes={},
                gpus=[],  # type: ignore[arg-type]
                silences=SilenceBook(),
                progress_dir=None,
            )
        )
        assert records and records[-1]["action"] == "engine" and records[-1]["result"] == "error"
    finally:
        eng.close()


def test_a_confirmed_verdict_without_kill_worthy_evidence_is_never_signalled(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    """Defence in depth: the engine signals only a status that carries ``kill_worthy``."""
    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="obey")
    rank_pids = [p.pid for p in processes[JOB]]
    eng = make_engine(store, tmp_path, clock)
    d = Driver(eng, clock)
    try:
        job = make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=rank_pids, kill_worthy=False)
        d.run(120, Mode.KILL, [job], processes)
    finally:
        eng.close()
    assert not [a for a in d.actions() if a[0] in ("sigterm", "sigkill", "kill_hook")]
    assert all(alive(p) for p in pids)


def test_only_processes_tied_to_the_job_by_proof_are_targets(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    """A rank the inspector holds without proof, or a pid only the detector's rank list names (a
    progress file's word), is never signalled; with no proven process the kill has no targets."""
    from dataclasses import replace

    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="obey")
    unproven = {JOB: [replace(p, proof=()) for p in processes[JOB]]}
    eng = make_engine(store, tmp_path, clock)
    d = Driver(eng, clock)
    try:
        job = make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=[p.pid for p in processes[JOB]])
        d.run(60, Mode.KILL, [job], unproven)
        d.run(60, Mode.KILL, [job], {})
    finally:
        eng.close()
    assert ("sigterm", "no_targets") in d.actions()
    assert not [a for a in d.actions() if a in (("sigterm", "started"), ("sigterm", "ok"))]
    assert all(alive(p) for p in pids)


def test_an_error_on_one_job_stays_in_that_job(tmp_path: Path, store: EventStore) -> None:
    """Issue 18 item 1: the engine raising on one job (a bug, a hostile value) leaves the other jobs'
    ladders running."""
    clock = FakeClock()
    eng = make_engine(store, tmp_path, clock)
    real = eng._ladder

    def ladder(turn):
        if turn.job.job == "bad":
            raise ValueError("boom")
        return real(turn)

    eng._ladder = ladder  # type: ignore[method-assign]
    d = Driver(eng, clock)
    try:
        bad = make_job(Verdict.DEADLOCK_CONFIRMED, job="bad")
        good = make_job(Verdict.DEADLOCK_CONFIRMED, job="good")
        d.run(3, Mode.ALERT, [bad, good])
    finally:
        eng.close()
    errors = [r for r in d.records if r["action"] == "engine"]
    assert errors and {r.get("job") for r in errors} == {"bad"}
    assert any(r["action"] == "capture" and r.get("job") == "good" for r in d.records), d.actions()


def test_a_job_whose_proven_processes_belong_to_several_users_is_never_signalled(
    tmp_path: Path, store: EventStore, procs: Procs
) -> None:
    """Issue 18 item 2, defence in depth: one job is one owner; a mixed kill set is refused."""
    from dataclasses import replace

    clock = FakeClock()
    pids, processes = two_ranks(procs, mode="obey")
    mixed = {JOB: [replace(processes[JOB][0], uid=1000), replace(processes[JOB][1], uid=1001)]}
    eng = make_engine(store, tmp_path, clock)
    d = Driver(eng, clock)
    try:
        job = make_job(Verdict.DEADLOCK_CONFIRMED, ranks=2, pids=[p.pid for p in processes[JOB]])
        d.run(60, Mode.KILL, [job], mixed)
    finally:
        eng.close()
    refusals = [r for r in d.records if r["action"] == "sigterm" and r["result"] == "refused"]
    assert refusals and "several users" in refusals[0]["reason"]
    assert not [a for a in d.actions() if a in (("sigterm", "started"), ("sigterm", "ok"))]
    assert all(alive(p) for p in pids)


# ------------------------------------------------------------------------ construction (issue 29)


def test_the_engine_is_built_from_its_sections_and_one_bundle_of_ports() -> None:
    """Issue 29: at most six constructor arguments (there were 18)."""
    import inspect

    params = [p for p in inspect.signature(ActionEngine.__init__).parameters if p != "self"]
    assert len(params) <= 6, params


def test_the_daemon_captures_with_the_ras_address_and_py_spy_of_its_config(
    tmp_path: Path, procs: Procs
) -> None:
    """Issue 29 (an issue-28 defect): the daemon built its engine without ``[ras]`` and ``[stacks]``, so an
    evidence bundle asked NCCL RAS at the default address and ran whatever py-spy PATH held. Now the
    engine takes both sections whole: the bundle asks the configured RAS server, and a configured
    py-spy that is no executable file means none."""
    from gpu_triage.daemon.config import load_config, override
    from gpu_triage.daemon.loop import Daemon
    from gpu_triage.telemetry.none import NoneSource
    from tests.watchdog.test_ras import RasServer

    ras_server = RasServer()
    config = override(
        load_config(None, {}),
        {
            "daemon.state_dir": str(tmp_path / "state"),
            "ras.host": "127.0.0.1",
            "ras.port": ras_server.port,
            "stacks.py_spy": str(tmp_path / "no-py-spy-here"),
            "stacks.enabled": False,
        },
        origin="test",
    )
    daemon = Daemon(config, NoneSource(), serve_http=False)
    try:
        daemon.start()
        engine = daemon.actions
        assert isinstance(engine, ActionEngine) and daemon.store is not None
        _, processes = two_ranks(procs)
        job = make_job(Verdict.DEADLOCK_SUSPECTED, ranks=2, pids=[p.pid for p in processes[JOB]])
        engine.on_cycle(Cycle(time.time(), Mode.OBSERVE, jobs=[job], processes=processes))
        wait_until(lambda: engine.busy == 0, timeout_s=60.0, what="the capture")
        engine.on_cycle(Cycle(time.time(), Mode.OBSERVE, jobs=[job], processes=processes))
        evidence = [e for e in daemon.store.since(0, 1000) if e.kind == "evidence"]
    finally:
        daemon.close()
        ras_server.stop()
    assert len(evidence) == 1
    items = {i["name"]: i for i in evidence[0].payload["items"]}
    assert items["nccl_ras"]["status"] == "ok", items["nccl_ras"]
    assert "VERBOSE STATUS" in ras_server.commands
    assert items["py_spy"]["status"] == "skipped" and "not found" in items["py_spy"]["error"]
