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
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpu_triage.cli.cluster_prometheus import analyse, exit_code, render
from gpu_triage.model.findings import Signal
from gpu_triage.model.health import Blame
from gpu_triage.model.states import GpuState, Verdict
from gpu_triage.serving.evidence_doc import EvidenceDoc
from gpu_triage.signals.fleet.exposition import fleet_metrics
from gpu_triage.signals.fleet.facts import NodeJobFacts, RankFacts, local_facts
from gpu_triage.signals.fleet.fusion import FleetState, FusionConfig, fuse
from gpu_triage.signals.fleet.prom_client import PromClient, PromError, parse_vector
from gpu_triage.signals.fleet.remote import LAST_SEEN, RemoteFacts, Sample, job_query, remote_facts
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.signals.stacks.dumps import StackSummary, group_key
from gpu_triage.signals.stacks.stack_facts import stack_facts
from gpu_triage.verdicts.detector import Detector
from gpu_triage.verdicts.settings import DetectorConfig
from gpu_triage.verdicts.views import GpuView, JobView, RankView
from tests.watchdog.test_stacks import ALLREDUCE, BARRIER, SAVING, WAIT_IN_SAVE, _rank

CFG = FusionConfig(stale_after_s=15.0, frozen_s=20.0, fresh_s=30.0, min_samples=4, node_lost_after_s=60.0)
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
        stack_collective=info.collective,
        **kw,
    )


def _node(
    name: str, at: float, *ranks: RankFacts, writing: bool = False, verdict: str = "stalled"
) -> NodeJobFacts:
    return NodeJobFacts("job", name, at, 4, verdict, None, False, writing, False, tuple(ranks))


def _answer(now: float, *nodes: NodeJobFacts, error: str | None = None) -> RemoteFacts:
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
    other = NodeJobFacts('we"ird\\job', "node-b", now, 4, "healthy", None, False, False, False, other.ranks)
    registry = CollectorRegistry()
    registry.register(_Facts([mine, other]))
    text = generate_latest(registry).decode()
    back = remote_facts('we"ird\\job', _samples(text, now), own_node="node-b", asked_at=now)
    assert back.skipped == 0
    assert back.nodes == (mine,)
    assert job_query('we"ird\\job').startswith(
        '{__name__=~"gpu_watchdog_fleet_.+",training_job="we\\"ird\\\\job"} or label_replace('
    )


def test_the_job_wide_view_names_the_first_stopped_the_lagging_and_the_odd_rank():
    now = 100.0
    a = NodeJobFacts(
        "job", "node-a", now - 1, 4, "deadlock_suspected", 40.0, True, False, False,
        (_remote_rank(0, BARRIER, now - 1, since=30.0), _remote_rank(1, REDUCE, now - 1, since=50.0)),
    )  # fmt: skip
    b = NodeJobFacts(
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
    steps = NodeJobFacts(
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
    a = NodeJobFacts(
        "job", "node-a", now - 1, 3, "deadlock_suspected", 40.0, True, False, False,
        (_remote_rank(0, BARRIER, now - 1, since=45.0),),
    )  # fmt: skip
    b = NodeJobFacts(
        "job", "node-b", now - 1, 3, "stalled", None, False, False, False,
        (_remote_rank(1, REDUCE, now - 1, since=31.0), _remote_rank(2, REDUCE, now - 1, since=31.0)),
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(_Facts([a, b]))
    (job,) = analyse(_samples(generate_latest(registry).decode(), now), now)
    assert [(r.node, r.rank) for r in job.odd] == [("node-a", 0)]
    assert (job.first_stopped.node, job.first_stopped.rank) == ("node-a", 0)


# -- issue 26: the split across nodes, the narrower veto, a node lost ------------------------------


def _local_frames(now: float, frames: dict[int, tuple], since: float = 0.0, world: int = 4):
    n = max(1, int((now - since) // 3) + 1)
    summary = StackSummary({r: _rank(r, f, now, since, n) for r, f in frames.items()}, world)
    return stack_facts(now, summary, [(r, 0.0) for r in frames], world, StacksConfig(), None)


def test_the_split_across_nodes_completes_and_names_the_rank_in_the_odd_phase():
    """Ranks 0-2 wait in the epoch-end save's collective, rank 3 (node B) in its extra step's: the
    world is split; node A's ranks alone look like a save, node B's alone like an incomplete split."""
    now = 100.0
    a = _node(
        "node-a", now - 1, _remote_rank(0, WAIT_IN_SAVE, now - 1), _remote_rank(1, WAIT_IN_SAVE, now - 1)
    )
    local = _local_frames(now, {2: WAIT_IN_SAVE, 3: REDUCE})
    ev = _fuse(now, _answer(now - 1, a), local=local)
    assert ev.veto is None, ev.veto
    assert ev.state is FleetState.COMPLETE and ev.stacks_complete and ev.split, ev.reason
    assert ev.odd == (("node-b", 3),)
    assert ev.split_ranks == (("node-a", 0), ("node-a", 1), ("node-b", 2))
    assert ev.to_dict()["split"]["step_ranks"] == [{"node": "node-b", "rank": 3}]
    # from node A: every rank here waits inside the save, the step rank is on the other node
    b = _node("node-b", now - 1, _remote_rank(2, WAIT_IN_SAVE, now - 1), _remote_rank(3, REDUCE, now - 1))
    mine = _local_frames(now, {0: WAIT_IN_SAVE, 1: WAIT_IN_SAVE})
    ev = fuse(
        now, own_node="node-a", world_size=4, local_ranks=[0, 1], local_stacks=mine,
        remote=_answer(now - 1, b), cfg=CFG,
    )  # fmt: skip
    assert ev.split and ev.odd == (("node-b", 3),), ev.reason
    # a rank doing the save's work (outside any collective) anywhere: a save, never a split
    writer = _node(
        "node-a", now - 1, _remote_rank(0, SAVING, now - 1), _remote_rank(1, WAIT_IN_SAVE, now - 1)
    )
    assert _fuse(now, _answer(now - 1, writer), local=local).state is FleetState.VETO


@pytest.mark.parametrize(
    ("what", "vetoed"),
    [
        ("waits_in_save", False),
        ("waits_in_save_checkpoint_verdict", False),
        ("saves_outside_collective", True),
        ("writing", True),
        ("reading", True),
        ("announced_save", True),
        ("checkpoint_verdict_without_a_save_stack", True),
    ],
)
def test_another_node_vetoes_only_with_a_positive_sign_of_a_healthy_save(what: str, vetoed: bool):
    now = 100.0
    frames = SAVING if what == "saves_outside_collective" else WAIT_IN_SAVE
    if what == "checkpoint_verdict_without_a_save_stack":
        frames = BARRIER
    r0 = _remote_rank(0, frames, now - 1, phase="checkpoint" if what == "announced_save" else None)
    node = NodeJobFacts(
        "job", "node-a", now - 1, 4,
        "checkpoint" if "checkpoint_verdict" in what or what == "announced_save" else "stalled",
        None, False, what == "writing", what == "reading",
        (r0, _remote_rank(1, BARRIER if frames is BARRIER else WAIT_IN_SAVE, now - 1)),
    )  # fmt: skip
    ev = _fuse(now, _answer(now - 1, node), local=_local_frames(now, {2: REDUCE, 3: REDUCE}))
    assert (ev.state is FleetState.VETO) is vetoed, (what, ev.reason)
    if not vetoed:
        # two against two: the ranks in the save's collective are named (the side that went ahead)
        assert ev.split and ev.odd == (("node-a", 0), ("node-a", 1)), ev.reason


def _last_seen(now: float, node: str, at: float) -> RemoteFacts:
    return RemoteFacts("job", now, (), None, last_seen=((node, at),))


def test_a_node_silent_past_node_lost_after_s_is_lost_before_that_unknown():
    now = 200.0
    lost = _fuse(now, _last_seen(now, "node-a", now - 70))
    assert lost.state is FleetState.NODE_LOST and lost.lost == (("node-a", 130.0),), lost.reason
    assert "node node-a lost" in lost.reason and lost.lost_since() == 130.0
    assert lost.to_dict()["lost"] == [{"node": "node-a", "last_facts": 130.0}]
    early = _fuse(now, _last_seen(now, "node-a", now - 30))
    assert early.state is FleetState.UNKNOWN and "lost after 60 s" in early.reason, early.reason
    # another node's rank still moves: the job makes progress, the silent node is not lost
    c = NodeJobFacts(
        "job", "node-c", now - 1, 4, "healthy", None, False, False, False,
        (_remote_rank(1, ALLREDUCE, now - 1, since=now - 3),),
    )  # fmt: skip
    moving = RemoteFacts("job", now, (c,), None, last_seen=(("node-a", now - 70), ("node-c", now - 1)))
    ev = _fuse(now, moving)
    assert ev.state is FleetState.INCOMPLETE and "node-c rank 1" in ev.reason, ev.reason
    # a silent node whose ranks another node now reports (the world is whole) is not lost either
    whole = _world(now)
    whole = replace(whole, last_seen=(*whole.last_seen, ("node-x", now - 500)))
    assert _fuse(now, whole).state is FleetState.COMPLETE


def test_the_last_seen_part_of_the_answer_names_silent_nodes():
    now = 100.0
    samples = [
        Sample({"__name__": LAST_SEEN, "training_job": "job", "fleet_node": "node-a"}, 40.0, now),
        Sample({"__name__": LAST_SEEN, "training_job": "job", "fleet_node": "node-b"}, 99.0, now),
    ]
    back = remote_facts("job", samples, own_node="node-b", asked_at=now)
    assert back.nodes == () and back.skipped == 0 and back.last_seen == (("node-a", 40.0),)


def _lost_job(now: float, frames=REDUCE, moving: bool = False) -> JobView:
    n = max(1, int(now // 3) + 1)
    since = max(0.0, now - 2) if moving else 0.0
    summary = StackSummary({r: _rank(r, frames, now, since, n) for r in (2, 3)}, 4)
    ranks = tuple(
        RankView(
            rank=r, pid=100 + r, alive=True, status="running" if moving else "sleeping",
            cpu_ratio=1.0 if moving else 0.0, proven=True,
        )
        for r in (2, 3)
    )  # fmt: skip
    return JobView("job", ranks, has_progress=False, stacks=summary, remote=_last_seen(now, "node-a", 10.0))


def test_a_node_lost_while_every_rank_here_waits_in_a_collective_is_kill_worthy_with_its_name():
    det = Detector()
    out = [det.update(float(t), [], [_lost_job(float(t))], telemetry_ok=False)[0] for t in range(10, 121)]
    hung = [s for s in out if s.kill_worthy]
    assert hung, [(s.verdict, s.cause) for s in out[-3:]]
    first = hung[0]
    assert first.cause == "node node-a lost" and first.verdict is Verdict.DEADLOCK_SUSPECTED
    assert first.blame is Blame.NODE  # drain the node: the job's code is not at fault
    ev = first.evidence_dict()
    EvidenceDoc.model_validate(ev)
    assert str(Signal.NODE_LOST) in ev["signals"] and ev["fleet"]["state"] == "node_lost"
    assert ev["fleet"]["lost"] == [{"node": "node-a", "last_facts": 10.0}]
    assert first.onset == 10.0
    lost_at = 10.0 + 60.0  # [cluster] node_lost_after_s past the last facts
    assert out.index(first) + 10 <= lost_at + 5


def test_a_node_whose_daemon_alone_stopped_while_the_job_moves_never_counts_against_it():
    det = Detector()
    for t in range(10, 200):
        st = det.update(float(t), [], [_lost_job(float(t), moving=True)], telemetry_ok=False)[0]
        assert not st.kill_worthy and st.verdict not in (
            Verdict.DEADLOCK_SUSPECTED,
            Verdict.DEADLOCK_CONFIRMED,
        )
    # and ranks here inside a save's collective (a save elsewhere): not frozen in a collective, no kill
    det = Detector()
    for t in range(10, 200):
        assert not det.update(float(t), [], [_lost_job(float(t), frames=WAIT_IN_SAVE)], telemetry_ok=False)[
            0
        ].kill_worthy


def test_the_detector_judges_the_split_across_nodes_kill_worthy_on_the_node_that_only_sees_a_save():
    """Node A's view of the reference failure over two nodes: both its ranks inside the save's
    collective (alone: a save), the step rank on node B (its facts through Prometheus)."""

    def job(now: float) -> JobView:
        n = max(1, int(now // 3) + 1)
        summary = StackSummary({r: _rank(r, WAIT_IN_SAVE, now, 0.0, n) for r in (0, 1)}, 4)
        ranks = tuple(
            RankView(rank=r, pid=100 + r, alive=True, status="sleeping", cpu_ratio=0.0, proven=True)
            for r in (0, 1)
        )
        b = _node("node-b", now - 1, _remote_rank(2, WAIT_IN_SAVE, now - 1), _remote_rank(3, REDUCE, now - 1))
        return JobView("job", ranks, has_progress=False, stacks=summary, remote=_answer(now - 1, b))

    det = Detector(DetectorConfig(fleet_node="node-a"))
    out = [det.update(float(t), [], [job(float(t))], telemetry_ok=False)[0] for t in range(61)]
    hung = [s for s in out if s.kill_worthy]
    assert hung, (out[-1].verdict, out[-1].evidence_dict().get("fleet"))
    ev = hung[0].evidence_dict()
    assert {str(Signal.STACKS_PHASE_SPLIT), str(Signal.REMOTE_COMPLETE)} <= set(ev["signals"]), ev["signals"]
    assert ev["fleet"]["odd"] == [{"node": "node-b", "rank": 3}]
    EvidenceDoc.model_validate(ev)


# -- the recording rules' aggregates: the same judgment as the raw facts, from a real Prometheus ----


class _Nodes:
    """Loopback HTTP: each simulated node's gpu_watchdog_fleet_* text at /<node>/metrics (the daemon's
    own exposition code), from a callable that can change what it serves or stop serving it."""

    def __init__(self, facts):
        self.facts = facts  # node -> list of NodeJobFacts at now (None: the target is down)
        nodes = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                node = self.path.strip("/").split("/")[0]
                current = nodes.facts(node, time.time())
                if current is None:
                    self.send_error(503)
                    return
                registry = CollectorRegistry(auto_describe=False)
                registry.register(_Facts(current))
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.mark.slow
def test_the_recording_rules_judge_the_world_as_the_raw_facts_do_from_a_real_prometheus(tmp_path):
    """Four jobs on two simulated nodes behind a real Prometheus running the shipped rules: the save
    split across nodes, a writer on the other node, every rank frozen in a collective, and a node that
    went silent. Node B's judgment from the aggregates ([cluster] job_rules) equals the raw facts'."""
    import shutil

    import yaml

    from gpu_triage.signals.fleet.summary import job_summary, summary_query
    from tests.conftest import REPO, require_binary
    from tests.watchdog.test_dashboard import Prometheus

    binary = require_binary("prometheus", "the recording rules' aggregates")
    t0 = time.time()
    lost_after = 10.0  # node A stops serving job "lost" at t0 + 8

    def facts(node: str, now: float):
        if node != "node-a":
            return []  # node B's facts are this node's own (not asked for from itself)
        out = []
        for job, frames, writing in (
            ("split", (WAIT_IN_SAVE, WAIT_IN_SAVE), False),
            ("writer", (SAVING, WAIT_IN_SAVE), True),
            ("frozen", (BARRIER, REDUCE), False),
            ("lost", (REDUCE, REDUCE), False),
        ):
            if job == "lost" and now > t0 + 8:
                continue
            ranks = tuple(_remote_rank(r, f, now - 0.5, since=t0 - 60) for r, f in enumerate(frames))
            if job == "writer":
                ranks = (replace(ranks[0], stack_same_since=now - 0.5), ranks[1])
            out.append(NodeJobFacts(job, "node-a", now, 4, "stalled", None, False, writing, False, ranks))
        # node B's own facts as Prometheus holds them (the aggregates include every node's ranks)
        return out

    def facts_b(node: str, now: float):
        if node == "node-a":
            return facts(node, now)
        out = []
        for job, frames in (
            ("split", (WAIT_IN_SAVE, REDUCE)),
            ("writer", (WAIT_IN_SAVE, WAIT_IN_SAVE)),
            ("frozen", (REDUCE, REDUCE)),
            ("lost", (REDUCE, REDUCE)),
        ):
            ranks = tuple(_remote_rank(r + 2, f, now - 0.5, since=t0 - 60) for r, f in enumerate(frames))
            out.append(NodeJobFacts(job, "node-b", now, 4, "stalled", None, False, False, False, ranks))
        return out

    served = _Nodes(facts_b)
    rules = tmp_path / "rules.yml"
    shutil.copy(REPO / "deploy" / "prometheus" / "gpu-watchdog.rules.yml", rules)
    text = rules.read_text().replace("interval: 5s", "interval: 1s")
    rules.write_text(text)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "gpu-watchdog",
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{served.port}"], "labels": {"__metrics_path__": f"/{n}/metrics"}}
                    for n in ("node-a", "node-b")
                ],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom = Prometheus(binary, tmp_path / "prometheus.yml", tmp_path / "data")
    client = PromClient(prom.url, timeout_s=5.0)
    cfg = replace(CFG, node_lost_after_s=lost_after)
    local = {
        "split": {2: WAIT_IN_SAVE, 3: REDUCE},
        "writer": {2: WAIT_IN_SAVE, 3: WAIT_IN_SAVE},
        "frozen": {2: REDUCE, 3: REDUCE},
        "lost": {2: REDUCE, 3: REDUCE},
    }

    def both(job: str):
        now = time.time()
        sf = _local_frames(now, local[job], since=t0 - 60)
        raw = remote_facts(job, client.query(job_query(job)).samples, own_node="node-b", asked_at=now)
        answer = client.query(summary_query(job))
        summary = job_summary(job, answer.samples, now=now, stale_after_s=cfg.stale_after_s)
        assert summary is not None, "the rules did not run"
        ruled = RemoteFacts(job, now, summary=summary)
        kw = {"own_node": "node-b", "world_size": 4, "local_ranks": [2, 3], "local_stacks": sf, "cfg": cfg}
        return fuse(now, remote=raw, **kw), fuse(now, remote=ruled, **kw), answer

    try:
        prom.wait_until(
            "the rules' aggregates of every job",
            lambda: (
                len(
                    prom.api("/api/v1/query", query="training_job:gpu_watchdog_fleet_world_size:max")[
                        "result"
                    ]
                )
                == 4
            ),
        )
        time.sleep(2.0)
        expected = {
            "split": (FleetState.COMPLETE, True, (("node-b", 3),)),
            "writer": (FleetState.VETO, False, ()),
            "frozen": (FleetState.COMPLETE, False, (("node-a", 0),)),
        }
        for job, (state, split, odd) in expected.items():
            raw, ruled, answer = both(job)
            assert (raw.state, raw.split, raw.odd) == (state, split, odd), (job, raw.reason)
            assert (ruled.state, ruled.split, ruled.odd) == (state, split, odd), (job, ruled.reason)
            assert ruled.source == "rules" and len(answer.samples) <= 40, (job, len(answer.samples))
            print(job, "|", raw.reason, "|", ruled.reason, "|", len(answer.samples), "series")
        # node A stops reporting job "lost": silent, then lost - the same from both
        prom.wait_until(
            "node A lost (rules)",
            lambda: both("lost")[1].state is FleetState.NODE_LOST,
            timeout_s=60.0,
        )
        raw, ruled, _ = both("lost")
        assert raw.state is FleetState.NODE_LOST and [n for n, _ in raw.lost] == ["node-a"], raw.reason
        assert [n for n, _ in ruled.lost] == ["node-a"], ruled.reason
    finally:
        client.close()
        prom.stop()
        served.close()


def test_the_job_wide_view_gives_both_new_causes():
    now = 1000.0
    split_a = NodeJobFacts(
        "split", "node-a", now - 1, 4, "deadlock_suspected", 900.0, True, False, False,
        (_remote_rank(0, WAIT_IN_SAVE, now - 1), _remote_rank(1, WAIT_IN_SAVE, now - 1)),
    )  # fmt: skip
    split_b = NodeJobFacts(
        "split", "node-b", now - 1, 4, "deadlock_suspected", 900.0, True, False, False,
        (_remote_rank(2, WAIT_IN_SAVE, now - 1), _remote_rank(3, REDUCE, now - 1)),
    )  # fmt: skip
    lost_b = NodeJobFacts(
        "lost", "node-b", now - 1, 4, "deadlock_suspected", 900.0, True, False, False,
        (_remote_rank(2, REDUCE, now - 1), _remote_rank(3, REDUCE, now - 1)),
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(_Facts([split_a, split_b, lost_b]))
    samples = _samples(generate_latest(registry).decode(), now)
    samples.append(
        Sample({"__name__": LAST_SEEN, "training_job": "lost", "fleet_node": "node-a"}, now - 90, now)
    )
    lost, split = analyse(samples, now)
    assert lost.cause() == "node node-a lost" and lost.silent == (("node-a", now - 90),)
    assert split.split and split.cause() is not None and "split" in split.cause()
    assert [(r.node, r.rank) for r in split.odd] == [("node-b", 3)]
    text = render((lost, split), now)
    assert "node-a: silent (no facts for 90 s)" in text and "cause: node node-a lost" in text
    assert lost.to_json(now)["silent_nodes"] == [{"node": "node-a", "last_facts": now - 90}]


@pytest.mark.parametrize("rules", [True, False])
def test_the_poller_reads_the_rules_aggregates_where_they_run_and_the_raw_facts_where_not(rules: bool):
    """[cluster] job_rules = "auto" against a loopback Prometheus: with the rules, one query for the
    aggregates; without, the raw facts at once and no rules query again for a while."""
    from urllib.parse import parse_qs, urlparse

    from gpu_triage.signals.fleet.config import ClusterConfig
    from gpu_triage.signals.fleet.poller import FleetPoller

    asked: list[str] = []

    def vector(result):
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})

    aggregates = [
        {"metric": {"__name__": "training_job:gpu_watchdog_fleet_world_size:max", "training_job": "job"},
         "value": [1.0, "4"]},
    ]  # fmt: skip
    raw = [
        {"metric": {"__name__": "gpu_watchdog_fleet_facts_timestamp_seconds", "training_job": "job",
                    "fleet_node": "node-a"}, "value": [1.0, "99"]},
    ]  # fmt: skip

    def handler(h):
        query = parse_qs(urlparse(h.path).query)["query"][0]
        asked.append("rules" if query.startswith('{__name__=~"training_job') else "facts")
        _send(
            h,
            vector(
                aggregates if rules and asked[-1] == "rules" else raw if asked[-1] == "facts" else []
            ).encode(),
        )

    with _server(handler) as url:
        poller = FleetPoller(
            ClusterConfig(prometheus_url=url, min_interval_s=1.0), node="node-b", clock=lambda: 100.0
        )
        try:
            assert poller.request(100.0, "job", True) and poller.wait_idle(10)
            first = poller.latest("job")
            assert poller.request(102.0, "job", True) and poller.wait_idle(10)
        finally:
            poller.close()
    assert first is not None and first.error is None
    if rules:
        assert asked == ["rules", "rules"] and first.summary is not None and first.summary.world_size == 4
        assert poller.status()["last_source"] == "rules"
    else:
        assert asked == ["rules", "facts", "facts"] and first.summary is None
        assert [n.node for n in first.nodes] == ["node-a"] and poller.status()["last_source"] == "facts"


def test_a_hostile_aggregates_answer_is_bounded_and_skips_what_is_no_rank():
    from gpu_triage.signals.fleet.summary import MAX_NAMED, job_summary

    jl = {"training_job": "job"}
    flood = [
        Sample({"__name__": "training_job_fleet_node:gpu_watchdog_fleet_io_active:first", **jl,
                "fleet_node": f"n{i}", "io": "write"}, 1.0, 1.0)
        for i in range(10_000)
    ]  # fmt: skip
    bad = [
        Sample({"__name__": "training_job:gpu_watchdog_fleet_odd_rank:since_timestamp_seconds", **jl,
                "fleet_node": "x", "rank": r}, 1.0, 1.0)
        for r in ("-1", "9" * 40, "a")
    ]  # fmt: skip
    other = Sample(
        {"__name__": "training_job:gpu_watchdog_fleet_world_size:max", "training_job": "other"}, 4, 1
    )
    assert job_summary("job", [*flood, *bad, other], now=1.0, stale_after_s=15.0) is None  # no rules: None
    present = Sample({"__name__": "training_job:gpu_watchdog_fleet_world_size:max", **jl}, float("inf"), 1.0)
    sm = job_summary("job", [present, *flood, *bad], now=1.0, stale_after_s=15.0)
    assert sm is None  # a world size that is no number is no answer either
    present = Sample({"__name__": "training_job:gpu_watchdog_fleet_world_size:max", **jl}, 4.0, 1.0)
    sm = job_summary("job", [present, *flood, *bad], now=1.0, stale_after_s=15.0)
    assert sm is not None and sm.world_size == 4 and sm.odd == ()
    assert len(sm.writing) <= 256 and MAX_NAMED == 16
