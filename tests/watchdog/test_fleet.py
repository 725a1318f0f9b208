"""One job, many nodes (gpu_triage.signals.fleet): the pure fusion rule (completion, veto, staleness, missing
ranks), the facts' round trip through the exposition format, the detector's hook (remote facts
complete K6 and K2, veto them, never stand alone), and the bounded Prometheus client against real
loopback HTTP servers."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpu_triage.cli.cluster_prometheus import analyse, exit_code, render
from gpu_triage.model.findings import Signal
from gpu_triage.model.states import GpuState, Verdict
from gpu_triage.serving.evidence_doc import EvidenceDoc
from gpu_triage.signals.fleet.exposition import fleet_metrics
from gpu_triage.signals.fleet.facts import JobFacts, RankFacts, local_facts
from gpu_triage.signals.fleet.fusion import FleetState, FusionConfig, fuse
from gpu_triage.signals.fleet.prom_client import PromClient, PromError, parse_vector
from gpu_triage.signals.fleet.remote import RemoteFacts, Sample, job_query, remote_facts
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.signals.stacks.dumps import StackSummary, group_key
from gpu_triage.signals.stacks.evidence import stack_facts
from gpu_triage.verdicts.detector import Detector, GpuView, JobView, RankView
from tests.watchdog.test_stacks import ALLREDUCE, BARRIER, SAVING, _rank

CFG = FusionConfig(stale_after_s=15.0, frozen_s=20.0, fresh_s=30.0)
REDUCE = (
    (
        "reduce_scatter_tensor",
        "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
        4000,
    ),
    *ALLREDUCE[1:],
)


def _local(now: float, frames=ALLREDUCE, since: float = 0.0, ranks=(2, 3), world: int = 4):
    n = max(1, int((now - since) // 3) + 1)
    summary = StackSummary({r: _rank(r, frames, now, since, n) for r in ranks}, world)
    return stack_facts(now, summary, [(r, 0.0) for r in ranks], world, StacksConfig(), None)


def _remote_rank(rank: int, frames, now: float, since: float = 0.0, **kw) -> RankFacts:
    info = _rank(rank, frames, now, since, 5).info
    return RankFacts(
        rank=rank,
        stack_phase=str(info.phase),
        stack_where=group_key(info),
        stack_same_since=since,
        stack_sampled_at=now,
        **kw,
    )


def _node(
    name: str, at: float, *ranks: RankFacts, writing: bool = False, verdict: str = "stalled"
) -> JobFacts:
    return JobFacts("job", name, at, 4, verdict, None, False, writing, False, tuple(ranks))


def _answer(now: float, *nodes: JobFacts, error: str | None = None) -> RemoteFacts:
    return RemoteFacts("job", now, tuple(nodes), error)


def _fuse(now: float, remote: RemoteFacts | None, local=None, world: int | None = 4):
    sf = local if local is not None else _local(now)
    return fuse(
        now, own_node="node-b", world_size=world, local_ranks=[2, 3], local_stacks=sf, remote=remote, cfg=CFG
    )


# -- the rule --------------------------------------------------------------------------------------


def test_every_rank_of_the_world_frozen_completes_and_names_the_rank_that_did_not_arrive():
    now = 100.0
    a = _node("node-a", now - 2, _remote_rank(0, BARRIER, now - 1), _remote_rank(1, ALLREDUCE, now - 1))
    ev = _fuse(now, _answer(now - 1, a))
    assert ev.state is FleetState.COMPLETE and ev.stacks_complete
    assert ev.odd == (("node-a", 0),)
    assert "node-a rank 0" in ev.named_odd()
    assert ev.to_dict()["odd"] == [{"node": "node-a", "rank": 0}]


@pytest.mark.parametrize(
    ("remote", "why"),
    [
        (None, "no answer"),
        ("error", "Prometheus: connection refused"),
        ("old_answer", "old"),
        ("stale_node", "no fresh facts for rank(s) 0,1; stale: node-a"),
        ("missing_rank", "no fresh facts for rank(s) 1"),
        ("twice", "reported by two nodes"),
    ],
)
def test_missing_stale_or_unanswered_facts_are_unknown_and_complete_nothing(remote: str | None, why: str):
    now = 100.0
    r0, r1 = _remote_rank(0, BARRIER, now - 1), _remote_rank(1, ALLREDUCE, now - 1)
    answers = {
        None: None,
        "error": _answer(now, error="connection refused"),
        "old_answer": _answer(now - 60, _node("node-a", now - 60, r0, r1)),
        "stale_node": _answer(now, _node("node-a", now - 40, r0, r1)),
        "missing_rank": _answer(now, _node("node-a", now - 1, r0)),
        "twice": _answer(
            now, _node("node-a", now - 1, r0, r1), _node("node-c", now - 1, _remote_rank(1, BARRIER, now))
        ),
    }
    ev = _fuse(now, answers[remote])
    assert ev.state is FleetState.UNKNOWN and not ev.stacks_complete and ev.veto is None
    assert why in ev.reason, ev.reason
    assert "per-node" in ev.to_dict()["fallback"]


def test_a_stale_node_cannot_veto_either():
    now = 100.0
    old = _node("node-a", now - 40, _remote_rank(0, SAVING, now - 40), _remote_rank(1, ALLREDUCE, now - 40))
    assert _fuse(now, _answer(now, old)).state is FleetState.UNKNOWN


@pytest.mark.parametrize("what", ["save", "writing", "checkpoint_verdict"])
def test_a_save_or_writes_on_another_node_veto(what: str):
    now = 100.0
    r0 = _remote_rank(0, SAVING if what == "save" else BARRIER, now - 1)
    node = _node(
        "node-a",
        now - 1,
        r0,
        _remote_rank(1, ALLREDUCE, now - 1),
        writing=what == "writing",
        verdict="checkpoint" if what == "checkpoint_verdict" else "stalled",
    )
    ev = _fuse(now, _answer(now, node))
    assert ev.state is FleetState.VETO and ev.veto and "node-a" in ev.veto
    assert not ev.stacks_complete


def test_a_remote_stack_that_still_moves_does_not_complete():
    now = 100.0
    a = _node(
        "node-a",
        now - 1,
        _remote_rank(0, BARRIER, now - 1, since=now - 5),
        _remote_rank(1, ALLREDUCE, now - 1),
    )
    ev = _fuse(now, _answer(now, a))
    assert ev.state is FleetState.INCOMPLETE and not ev.stacks_complete
    assert "node-a rank 0" in ev.reason


def test_local_ranks_not_frozen_never_complete_whatever_the_others_say():
    now = 100.0
    a = _node("node-a", now - 1, _remote_rank(0, BARRIER, now - 1), _remote_rank(1, ALLREDUCE, now - 1))
    moving = _local(now, since=now - 3)
    assert not _fuse(now, _answer(now, a), local=moving).stacks_complete


def test_steps_frozen_and_spinning_everywhere_complete_k2():
    now = 100.0
    ranks = [
        RankFacts(rank=r, step=7, step_changed_at=30.0, phase="train", phase_since=1.0, spin_since=35.0)
        for r in (0, 1)
    ]
    ev = _fuse(now, _answer(now, _node("node-a", now - 1, *ranks)))
    assert ev.state is FleetState.COMPLETE and ev.remote_frozen_since == 30.0 and ev.remote_spin_since == 35.0
    moving = [RankFacts(rank=r, step=7, step_changed_at=30.0, phase="train", spin_since=None) for r in (0, 1)]
    assert _fuse(now, _answer(now, _node("node-a", now - 1, *moving))).remote_spin_since is None


# -- facts through the exposition format and back --------------------------------------------------


class _Facts(Collector):
    def __init__(self, facts):
        self.facts = facts

    def collect(self):
        return list(fleet_metrics(self.facts))


def _samples(text: str, t: float) -> list[Sample]:
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.append(Sample({"__name__": s.name, **s.labels}, s.value, t))
    return out


def test_facts_round_trip_through_the_exposition_and_leave_this_node_out():
    now = 100.0
    summary = StackSummary({0: _rank(0, BARRIER, now, 50.0, 9), 1: _rank(1, ALLREDUCE, now, 60.0, 7)}, 4)
    views = [
        RankView(rank=r, gpu=r, step=5, phase="train", step_changed_at=40.0, phase_since=2.0) for r in (0, 1)
    ]
    mine = local_facts(
        now,
        "node-a",
        job='we"ird\\job',
        world_size=4,
        ranks=views,
        stacks=summary,
        verdict="stalled",
        onset=55.0,
        kill_worthy=False,
        writing=True,
        reading=False,
        gpu_spin_since={1: 45.0},
        fresh_s=30.0,
    )
    other = _node("node-b", now, _remote_rank(2, ALLREDUCE, now))
    other = JobFacts('we"ird\\job', "node-b", now, 4, "healthy", None, False, False, False, other.ranks)
    registry = CollectorRegistry()
    registry.register(_Facts([mine, other]))
    text = generate_latest(registry).decode()
    back = remote_facts('we"ird\\job', _samples(text, now), own_node="node-b", asked_at=now)
    assert back.skipped == 0
    assert back.nodes == (mine,)
    assert job_query('we"ird\\job') == '{__name__=~"gpu_watchdog_fleet_.+",training_job="we\\"ird\\\\job"}'


def test_the_job_wide_view_names_the_first_stopped_the_lagging_and_the_odd_rank():
    now = 100.0
    a = JobFacts(
        "job", "node-a", now - 1, 4, "deadlock_suspected", 40.0, True, False, False,
        (_remote_rank(0, BARRIER, now - 1, since=30.0), _remote_rank(1, REDUCE, now - 1, since=50.0)),
    )  # fmt: skip
    b = JobFacts(
        "job",
        "node-b",
        now - 2,
        4,
        "stalled",
        None,
        False,
        False,
        False,
        (_remote_rank(2, REDUCE, now, since=52.0),),
    )
    steps = JobFacts(
        "ft", "node-b", now, 2, "slow", None, False, False, False,
        (RankFacts(0, step=120, step_changed_at=90.0), RankFacts(1, step=100, step_changed_at=60.0)),
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(_Facts([a, b, steps]))
    (ft, job) = analyse(_samples(generate_latest(registry).decode(), now), now)
    assert job.verdict == "hung" and job.missing == (3,)
    assert (job.first_stopped.node, job.first_stopped.rank) == ("node-a", 0)
    assert [(r.node, r.rank) for r in job.odd] == [("node-a", 0)]
    assert ft.verdict == "slow" and (ft.lagging.node, ft.lagging.rank, ft.lag_steps) == ("node-b", 1, 20)
    assert (ft.first_stopped.node, ft.first_stopped.rank) == ("node-b", 1)
    assert exit_code((ft, job)) == 1 and exit_code((ft,)) == 0
    text = render((ft, job), now)
    assert "stopped first: node-a rank 0" in text and "ranks no node reports: 3" in text


def test_hostile_answers_are_skipped_or_refused_with_a_reason():
    now = 100.0
    bad = [
        Sample(
            {
                "__name__": "gpu_watchdog_fleet_rank_step",
                "training_job": "job",
                "fleet_node": "x",
                "rank": "-1",
            },
            1,
            now,
        ),
        Sample(
            {
                "__name__": "gpu_watchdog_fleet_rank_step",
                "training_job": "job",
                "fleet_node": "x",
                "rank": "9" * 40,
            },
            1,
            now,
        ),
        Sample(
            {
                "__name__": "gpu_watchdog_fleet_rank_step",
                "training_job": "other",
                "fleet_node": "x",
                "rank": "1",
            },
            1,
            now,
        ),
    ]
    back = remote_facts("job", bad, own_node="me", asked_at=now)
    assert back.nodes == () and back.skipped == 4  # three bad samples, and node x has no facts time
    for body, message in [
        (b"<html>", "not JSON"),
        (b'{"status":"error","errorType":"bad_data","error":"parse error"}', "parse error"),
        (b'{"status":"success","data":{"resultType":"matrix","result":[]}}', "vector"),
        (
            b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}',
            "number",
        ),
    ]:
        with pytest.raises(PromError, match=message):
            parse_vector(body)


# -- the detector's hook ---------------------------------------------------------------------------


def _job(now: float, remote: RemoteFacts | None, frames=REDUCE) -> JobView:
    n = max(1, int(now // 3) + 1)
    summary = StackSummary({r: _rank(r, frames, now, 0.0, n) for r in (2, 3)}, 4)
    ranks = tuple(
        RankView(rank=r, pid=100 + r, alive=True, status="sleeping", cpu_ratio=0.0, proven=True)
        for r in (2, 3)
    )
    return JobView("job", ranks, has_progress=False, stacks=summary, remote=remote)


def _drive(remote_at, until: int = 60):
    det = Detector()
    out = []
    for t in range(until + 1):
        now = float(t)
        out.append(det.update(now, [], [_job(now, remote_at(now))], telemetry_ok=False)[0])
    return out


def _world(now: float, **kw) -> RemoteFacts:
    a = _node("node-a", now - 1, _remote_rank(0, BARRIER, now - 1), _remote_rank(1, REDUCE, now - 1), **kw)
    return _answer(now - 1, a)


def test_remote_facts_complete_the_stack_proof_and_name_the_odd_rank_on_the_other_node():
    out = _drive(_world)
    hung = [s for s in out if s.kill_worthy]
    assert hung and hung[0].verdict is Verdict.DEADLOCK_SUSPECTED
    ev = hung[0].evidence_dict()
    EvidenceDoc.model_validate(ev)  # the OpenAPI document describes it (stacks and fleet included)
    assert str(Signal.REMOTE_COMPLETE) in ev["signals"] and str(Signal.STACKS_FROZEN) in ev["signals"]
    assert ev["fleet"]["odd"] == [{"node": "node-a", "rank": 0}]
    assert ev["stacks"]["odd_ranks"] == [0]


def test_without_remote_facts_or_with_unknown_ones_the_node_judges_alone():
    for remote in (lambda t: None, lambda t: _answer(t, error="unreachable"), lambda t: _answer(t - 60)):
        out = _drive(remote)
        assert not any(s.kill_worthy for s in out)
        assert out[-1].verdict is Verdict.STALLED
    out = _drive(lambda t: _answer(t, error="unreachable"))
    assert "per-node" in out[-1].evidence_dict()["fleet"]["fallback"]
    assert str(Signal.REMOTE_UNKNOWN) in {f["signal"] for f in out[-1].evidence_dict()["findings"]}


def test_a_veto_from_another_node_keeps_the_hung_class_away():
    out = _drive(lambda t: _world(t, writing=True))
    assert not any(s.kill_worthy for s in out)
    assert "node-a: its ranks are writing" in out[-1].evidence_dict()["fleet"]["veto"]
    assert str(Signal.REMOTE_VETO) in {f["signal"] for f in out[-1].evidence_dict()["findings"]}


def test_remote_facts_never_stand_alone_local_stacks_moving():
    det = Detector()
    for t in range(61):
        now = float(t)
        summary = StackSummary({r: _rank(r, REDUCE, now, max(0.0, now - 2), 2) for r in (2, 3)}, 4)
        ranks = tuple(
            RankView(rank=r, pid=100 + r, alive=True, status="running", cpu_ratio=1.0, proven=True)
            for r in (2, 3)
        )
        st = det.update(
            now,
            [],
            [JobView("job", ranks, has_progress=False, stacks=summary, remote=_world(now))],
            telemetry_ok=False,
        )[0]
        assert not st.kill_worthy


def test_remote_steps_frozen_and_spinning_complete_k2_for_a_job_without_job_wide_leases():
    """Without job-wide leases K2 cannot prove a hang with ranks elsewhere; every other rank frozen and
    spinning (their nodes' facts) completes it, after the same budget (600 s: no step timing learned)."""

    def job(now: float, remote: RemoteFacts | None) -> JobView:
        ranks = tuple(
            RankView(
                rank=r,
                pid=100 + r,
                gpu=r - 2,
                alive=True,
                status="sleeping",
                step=7,
                phase="train",
                step_changed_at=5.0,
                phase_since=0.0,
                proven=True,
            )
            for r in (2, 3)
        )
        return JobView("job", ranks, has_progress=True, world_size=4, remote=remote)

    def remote(now: float) -> RemoteFacts:
        ranks = [
            RankFacts(rank=r, step=7, step_changed_at=5.0, phase="train", phase_since=0.0, spin_since=6.0)
            for r in (0, 1)
        ]
        return _answer(now, _node("node-a", now - 1, *ranks))

    gpus = [GpuView(g, GpuState.CHECKPOINT_OR_DEADLOCK, 6.0) for g in (0, 1)]
    for source, expect in ((remote, True), (lambda t: None, False)):
        det = Detector()
        seen = [det.update(float(t), gpus, [job(float(t), source(float(t)))])[0] for t in range(700)]
        assert any(s.kill_worthy for s in seen) is expect, [s.verdict for s in seen[-3:]]


# -- the bounded client against real loopback servers ----------------------------------------------


@contextmanager
def _server(handler) -> Iterator[str]:
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            handler(self)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _send(h, body: bytes, delay_s: float = 0.0):
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.end_headers()
    time.sleep(delay_s)
    with suppress(BrokenPipeError, ConnectionResetError):
        h.wfile.write(body)


def test_client_answers_a_vector_and_refuses_too_large_too_slow_and_unreachable():
    ok = json.dumps(
        {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {"a": "b"}, "value": [1.5, "2"]}]},
        }
    ).encode()
    with _server(lambda h: _send(h, ok)) as url:
        result = PromClient(url, timeout_s=2).query("up")
        assert result.samples == (Sample({"a": "b"}, 2.0, 1.5),)
    with (
        _server(lambda h: _send(h, b" " * (2 << 20) + ok)) as url,
        pytest.raises(PromError, match="larger than"),
    ):
        PromClient(url, timeout_s=5, max_bytes=1 << 20).query("up")
    with _server(lambda h: _send(h, ok, delay_s=3)) as url:
        t0 = time.monotonic()
        with pytest.raises(PromError, match="within"):
            PromClient(url, timeout_s=0.5).query("up")
        assert time.monotonic() - t0 < 2.5  # the deadline held (a bound, not a speed budget)
    with _server(lambda h: None) as url:
        port = url.rsplit(":", 1)[1]
    with pytest.raises(PromError, match="unreachable"):
        PromClient(f"http://127.0.0.1:{port}", timeout_s=1).query("up")


def test_without_steps_the_rank_that_did_not_arrive_is_named_first_whatever_the_samplers_saw_first():
    """Each node's sampler dates "unchanged since" from its own first dump: node B saw its ranks frozen
    before node A dumped rank 0 at all. The rank waiting apart from the majority is the one that stopped."""
    now = 100.0
    a = JobFacts(
        "job", "node-a", now - 1, 3, "deadlock_suspected", 40.0, True, False, False,
        (_remote_rank(0, BARRIER, now - 1, since=45.0),),
    )  # fmt: skip
    b = JobFacts(
        "job", "node-b", now - 1, 3, "stalled", None, False, False, False,
        (_remote_rank(1, REDUCE, now - 1, since=31.0), _remote_rank(2, REDUCE, now - 1, since=31.0)),
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(_Facts([a, b]))
    (job,) = analyse(_samples(generate_latest(registry).decode(), now), now)
    assert [(r.node, r.rank) for r in job.odd] == [("node-a", 0)]
    assert (job.first_stopped.node, job.first_stopped.rank) == ("node-a", 0)
