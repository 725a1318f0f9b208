"""NCCL RAS as live evidence: the poller against a real TCP server replaying NCCL's RAS protocol and
JSON report (the server of test_ras.py) - only on suspicion, rate-limited, counts frozen between
polls, missing and lagging ranks named with host and GPU - and the detector using it."""

from __future__ import annotations

from itertools import count

from gpu_triage.model.findings import Signal
from gpu_triage.model.states import Verdict
from gpu_triage.serving.evidence_doc import EvidenceDoc
from gpu_triage.signals.nccl_ras.poller import RasConfig, RasPoller
from gpu_triage.signals.stacks.dumps import StackSummary
from gpu_triage.verdicts.detector import Detector
from gpu_triage.verdicts.views import JobView, RankView
from tests.watchdog.test_delivery import free_port
from tests.watchdog.test_ras import RasServer
from tests.watchdog.test_stacks import ALLREDUCE, _rank

PIDS = {4200 + r for r in range(16) if r != 9}


def _statuses(server: RasServer) -> int:
    return sum(1 for c in server.commands if c.upper().endswith("STATUS"))


def test_polls_only_on_suspicion_rate_limited_and_names_the_missing_rank() -> None:
    server = RasServer()
    clock = count(1000.0, 7.0)
    try:
        poller = RasPoller(
            RasConfig(port=server.port, min_interval_s=10.0, timeout_s=5.0), clock=lambda: next(clock)
        )
        assert not poller.request(0.0, suspicious=False)
        assert _statuses(server) == 0 and poller.facts(PIDS) is None
        assert poller.request(0.0, suspicious=True)
        assert poller.wait_idle(10)
        facts = poller.facts(PIDS)
        assert facts is not None and facts.counts_frozen_since is None  # one poll: nothing to compare
        assert [r.name() for r in facts.missing] == ["rank 9 on 10.0.0.2 GPU 1 pid 4209"]
        assert [r.rank for r in facts.behind] == [3]
        assert not poller.request(5.0, suspicious=True)  # rate limit
        assert _statuses(server) == 1
        assert poller.request(10.0, suspicious=True)
        assert poller.wait_idle(10)
        facts = poller.facts(PIDS)
        assert facts is not None and facts.counts_frozen_since == 1000.0  # the same counts twice
        assert poller.facts({1, 2}) is None  # not this job's communicators
        assert poller.status()["polls_total"] == 2
    finally:
        server.stop()


def test_nothing_listening_is_absent_and_says_nothing_about_the_job() -> None:
    poller = RasPoller(RasConfig(port=free_port(), timeout_s=2.0))
    assert poller.request(0.0, suspicious=True)
    assert poller.wait_idle(10)
    assert poller.status()["last_status"] == "absent"
    assert poller.facts(PIDS) is None or poller.facts(PIDS).missing == ()


def test_frozen_counts_are_the_second_signal_that_makes_frozen_stacks_kill_worthy() -> None:
    server = RasServer()
    try:
        poller = RasPoller(RasConfig(port=server.port, min_interval_s=10.0), clock=lambda: 0.0)
        for t in (0.0, 10.0):
            assert poller.request(t, suspicious=True)
            assert poller.wait_idle(10)
        ras = poller.facts(PIDS)
    finally:
        server.stop()
    assert ras is not None
    ras = type(ras)(ras.poll, 0.0, ras.missing, ras.behind)  # frozen since t=0 of the drive below
    det = Detector()
    pids = sorted(PIDS)[:2]
    out = []
    for t in range(0, 40):
        now = float(t)
        n = t // 3 + 1
        stacks = StackSummary({0: _rank(0, ALLREDUCE, now, 0.0, n), 1: _rank(1, ALLREDUCE, now, 0.0, n)}, 2)
        ranks = tuple(
            RankView(rank=r, pid=pids[r], alive=True, status="running", cpu_ratio=1.0, proven=True)
            for r in (0, 1)
        )
        job = JobView("nccl-job", ranks, has_progress=False, stacks=stacks, ras=ras)
        out.append(det.update(now, [], [job], telemetry_ok=False)[0])
    hung = [s for s in out if s.kill_worthy]
    assert hung and hung[0].verdict is Verdict.DEADLOCK_SUSPECTED
    assert str(Signal.NCCL_COUNTS_FROZEN) in hung[0].evidence_dict()["signals"]
    EvidenceDoc.model_validate(hung[0].evidence_dict())  # documented in the OpenAPI schema
    found = {f["signal"]: f for f in hung[0].evidence_dict()["findings"]}
    assert "rank 9 on 10.0.0.2 GPU 1" in found["nccl_missing_ranks"]["detail"]
    assert hung[0].evidence_dict()["nccl_ras"]["missing_ranks"] == ["rank 9 on 10.0.0.2 GPU 1 pid 4209"]
    # without RAS, busy host threads leave the same stacks unproven
    det2 = Detector()
    for t in range(0, 40):
        now = float(t)
        n = t // 3 + 1
        stacks = StackSummary({0: _rank(0, ALLREDUCE, now, 0.0, n), 1: _rank(1, ALLREDUCE, now, 0.0, n)}, 2)
        ranks = tuple(
            RankView(rank=r, pid=pids[r], alive=True, status="running", cpu_ratio=1.0, proven=True)
            for r in (0, 1)
        )
        st = det2.update(
            now, [], [JobView("nccl-job", ranks, has_progress=False, stacks=stacks)], telemetry_ok=False
        )
        assert not st[0].kill_worthy
