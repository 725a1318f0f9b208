"""Blame in every verdict (issue 27 part B, docs/detector.md "Blame"): scripted evidence streams and
the node's health through the detector.

- a proven hang with an unhealthy hardware finding on one of the job's GPUs is kill-worthy at once
  (``deadlock_confirmed`` without the ``confirm_after_s`` window), blame ``node``;
- a GPU lost under frozen train ranks is that hang, though the lost GPU shows no power signature;
- the same hang on a healthy node is judged as before (suspected, then confirmed), blame ``job``;
- degraded signals (correctable ECC burst, thermal throttle, PCIe width drop) never make a kill - a
  throttled GPU's low power is not the spin band;
- a node of the job lost (the cross-node cause ``node <name> lost``) blames the node.
"""

from __future__ import annotations

import dataclasses

from gpu_triage.model.findings import Signal
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
from gpu_triage.model.states import Verdict
from gpu_triage.verdicts import blame
from gpu_triage.verdicts.detector import Detector, DetectorConfig
from tests.watchdog.test_detector import SPIN, C, Job, hang_at, training

HEALTHY = NodeHealth(level=HealthLevel.HEALTHY)


def finding(
    kind: FaultKind,
    gpu: int | None,
    level: HealthLevel = HealthLevel.UNHEALTHY,
    *,
    blame_: Blame = Blame.NODE,
    action: OperatorAction = OperatorAction.DRAIN_NODE,
    xid: int | None = None,
    detail: str = "",
) -> HardwareFinding:
    return HardwareFinding(
        kind=kind,
        level=level,
        blame=blame_,
        action=action,
        detail=detail or f"{kind}",
        source=FaultSource.KERNEL_LOG,
        gpu=gpu,
        pci_bus_id=None if gpu is None else f"00000000:{0x18 + gpu:02X}:00.0",
        xid=xid,
    )


def xid79(gpu: int) -> HardwareFinding:
    return finding(FaultKind.XID, gpu, xid=79, detail="Xid 79: GPU has fallen off the bus")


def node(*findings: HardwareFinding, level: HealthLevel | None = None) -> NodeHealth:
    by_gpu: dict[int, list[HardwareFinding]] = {}
    wide = []
    for f in findings:
        if f.gpu is None:
            wide.append(f)
        else:
            by_gpu.setdefault(f.gpu, []).append(f)
    worst = max(
        (f.level for f in findings),
        key=[HealthLevel.HEALTHY, HealthLevel.DEGRADED, HealthLevel.UNHEALTHY].index,
    )
    gpus = tuple(
        GpuHealth(g, None, max((f.level for f in fs), key=lambda x: x is HealthLevel.UNHEALTHY), tuple(fs))
        for g, fs in sorted(by_gpu.items())
    )
    return NodeHealth(level=level or worst, gpus=gpus, findings=tuple(wide))


def run(job: Job, script, until_s: float, health, *, cfg: DetectorConfig | None = None):
    """Drive the detector; ``health(t)`` is the node's health at t. Returns every (t, status)."""
    det = Detector(cfg or DetectorConfig())
    out = []
    t = 0.0
    while t <= until_s:
        script(t, job)
        gpus, jobs = job.views()
        (status,) = det.update(t, gpus, jobs, node_health=health(t))
        out.append((t, status))
        t += 1.0
    return out


def first(out, verdict: Verdict):
    return next(((t, s) for t, s in out if s.verdict is verdict), None)


def test_a_hang_after_an_xid_79_on_one_of_its_gpus_is_confirmed_at_once_and_blames_the_node():
    cfg = DetectorConfig()
    fault = node(xid79(3))
    out = run(Job(), hang_at(300), 600, lambda t: fault if t >= 290 else HEALTHY, cfg=cfg)
    assert first(out, Verdict.DEADLOCK_SUSPECTED) is None, (
        "no confirmation window: the hardware is the witness"
    )
    t, status = first(out, Verdict.DEADLOCK_CONFIRMED)
    assert t - 300 <= 30, t
    assert status.kill_worthy and status.blame is Blame.NODE
    assert status.onset is not None and 290 <= status.onset <= 301
    doc = status.evidence_dict()
    assert doc["blame"] == "node"
    assert [(h["kind"], h["gpu"], h["xid"], h["action"]) for h in doc["hardware"]] == [
        ("xid", 3, 79, "drain_node")
    ]
    assert any(s.startswith("hardware_fault:gpu 3 xid 79") for s in doc["signals"]), doc["signals"]
    assert Signal.HARDWARE_FAULT in {f.signal for f in status.findings}
    from gpu_triage.serving.evidence_doc import EvidenceDoc

    EvidenceDoc.model_validate(doc)  # the OpenAPI description covers the new keys
    # Before the hang the job is healthy and blames nobody, though the GPU is already faulty.
    healthy = [s for t, s in out if 290 <= t < 300]
    assert healthy and all(s.verdict is Verdict.HEALTHY and s.blame is Blame.JOB for s in healthy)
    assert healthy[0].evidence_dict()["hardware"][0]["xid"] == 79


def test_the_same_hang_on_a_healthy_node_waits_for_its_confirmation_and_blames_the_job():
    cfg = DetectorConfig()
    out = run(Job(), hang_at(300), 600, lambda t: HEALTHY, cfg=cfg)
    t_s, suspected = first(out, Verdict.DEADLOCK_SUSPECTED)
    t_c, confirmed = first(out, Verdict.DEADLOCK_CONFIRMED)
    assert t_c - t_s >= cfg.confirm_after_s
    assert suspected.blame is Blame.JOB and confirmed.blame is Blame.JOB
    assert confirmed.evidence_dict()["hardware"] == []


def test_a_fault_on_a_gpu_the_job_does_not_use_blames_the_job():
    job = Job(ranks=4)  # GPUs 0-3; the fault is on GPU 6
    out = run(job, hang_at(300), 600, lambda t: node(xid79(6)))
    assert first(out, Verdict.DEADLOCK_SUSPECTED) is not None
    _, confirmed = first(out, Verdict.DEADLOCK_CONFIRMED)
    assert confirmed.blame is Blame.JOB and confirmed.evidence_dict()["hardware"] == []


def test_a_fault_that_blames_the_application_keeps_the_window_and_blames_the_job():
    app = finding(FaultKind.XID, 2, xid=13, blame_=Blame.JOB, action=OperatorAction.CHECK_APPLICATION)
    out = run(Job(), hang_at(300), 600, lambda t: node(app))
    assert first(out, Verdict.DEADLOCK_SUSPECTED) is not None
    _, confirmed = first(out, Verdict.DEADLOCK_CONFIRMED)
    assert confirmed.blame is Blame.JOB


def test_an_uncatalogued_xid_blames_nobody_in_particular():
    odd = finding(FaultKind.XID, 1, xid=999, blame_=Blame.UNKNOWN, action=OperatorAction.UNKNOWN)
    out = run(Job(), hang_at(300), 600, lambda t: node(odd))
    _, confirmed = first(out, Verdict.DEADLOCK_CONFIRMED)
    assert confirmed.blame is Blame.UNKNOWN


def test_an_nvlink_down_on_a_job_gpu_blames_the_network_and_confirms_at_once():
    down = finding(FaultKind.NVLINK_DOWN, 5, blame_=Blame.NETWORK, action=OperatorAction.CHECK_FABRIC)
    out = run(Job(), hang_at(300), 600, lambda t: node(down))
    assert first(out, Verdict.DEADLOCK_SUSPECTED) is None
    _, confirmed = first(out, Verdict.DEADLOCK_CONFIRMED)
    assert confirmed.blame is Blame.NETWORK and confirmed.kill_worthy


def test_a_gpu_lost_under_frozen_steps_is_a_kill_worthy_hang_blamed_on_the_node():
    """The lost GPU reads nothing (unknown): no power rule can prove the hang, the frozen steps and the
    lost GPU do."""
    from tests.watchdog.test_detector import UNK

    lost = finding(FaultKind.GPU_LOST, 4, detail="NVML: GPU is lost")

    def script(t: float, job: Job) -> None:
        if t < 300:
            job.advance(t)
        else:
            job.set_gpus(SPIN, t)
            job.set_gpus(UNK, t, which=[4])

    out = run(Job(), script, 420, lambda t: node(lost) if t >= 300 else HEALTHY)
    before = run(Job(), script, 420, lambda t: HEALTHY)
    assert not any(s.kill_worthy for _, s in before), "without the lost GPU: no proof, as before"
    t, status = first(out, Verdict.DEADLOCK_CONFIRMED)
    assert t - 300 <= 60 and status.kill_worthy and status.blame is Blame.NODE
    assert any(s.startswith("gpu_lost:gpu 4") for s in status.evidence.signals), status.evidence.signals
    assert Signal.GPU_LOST in {f.signal for f in status.findings}


def _slow_throttled_steps(t: float, job: Job) -> None:
    """A healthy job whose GPUs throttle from t=200: utilisation full, power down in the spin band,
    steps 10x slower (every 20 s instead of every 1 s)."""
    if t < 200:
        job.advance(t)
        job.set_gpus(C, t)
    else:
        job.set_gpus(SPIN, t)
        if int(t) % 20 == 0:
            job.advance(t)


def test_a_thermally_throttled_healthy_job_is_never_a_kill():
    throttle = node(
        *(
            finding(FaultKind.THROTTLE_THERMAL, g, HealthLevel.DEGRADED, action=OperatorAction.NONE)
            for g in range(8)
        )
    )
    out = run(Job(), _slow_throttled_steps, 600, lambda t: throttle if t >= 195 else HEALTHY)
    assert not any(s.kill_worthy for _, s in out), [(t, str(s.verdict)) for t, s in out if s.kill_worthy][:3]
    assert {s.verdict for _, s in out} <= {Verdict.HEALTHY, Verdict.SLOW, Verdict.STALLED}
    late = out[-1][1]
    assert Signal.GPU_THROTTLED in {f.signal for f in late.findings}
    assert late.blame in (Blame.JOB,)
    # The same power and steps without the throttle reading: the spin band and frozen steps are a hang.
    blind = run(Job(), _slow_throttled_steps, 600, lambda t: HEALTHY)
    assert any(s.kill_worthy for _, s in blind), "the scenario must be hang-shaped without the throttle"


def test_a_correctable_ecc_burst_and_a_pcie_width_drop_never_make_a_kill_and_stay_context():
    degraded = node(
        finding(
            FaultKind.ECC_CORRECTABLE,
            1,
            HealthLevel.DEGRADED,
            action=OperatorAction.NONE,
            detail="ECC: 4096 correctable",
        ),
        finding(
            FaultKind.PCIE_DEGRADED,
            2,
            HealthLevel.DEGRADED,
            action=OperatorAction.NONE,
            detail="PCIe x8 of x16",
        ),
    )
    out = run(Job(), training, 400, lambda t: degraded if t >= 100 else HEALTHY)
    assert {s.verdict for _, s in out} == {Verdict.HEALTHY}
    assert not any(s.kill_worthy for _, s in out)
    late = out[-1][1]
    assert {f.signal for f in late.findings} >= {Signal.HARDWARE_DEGRADED}
    assert [h["kind"] for h in late.evidence_dict()["hardware"]] == ["ecc_correctable", "pcie_degraded"]
    # A degraded GPU under a real hang: still a hang on a (merely degraded) node: the job's, as before.
    hung = run(Job(), hang_at(300), 600, lambda t: degraded)
    assert first(hung, Verdict.DEADLOCK_SUSPECTED) is not None
    assert first(hung, Verdict.DEADLOCK_CONFIRMED)[1].blame is Blame.JOB


def test_a_node_of_the_job_lost_blames_the_node():
    assert blame.node_lost("node gpu-b7 lost: no fleet facts for 90 s") == "gpu-b7"
    assert blame.node_lost("node gpu-b7, gpu-b8 lost") == "gpu-b7, gpu-b8"  # several nodes (issue 26)
    assert blame.node_lost("waiting_on_other_nodes") is None
    assert blame.node_lost(None) is None
    hw = blame.judge((0, 1), HEALTHY)
    assert blame.blame_for(Verdict.STALLED, hw, "node gpu-b7 lost") is Blame.NODE
    assert blame.blame_for(Verdict.STALLED, hw, "waiting_on_other_nodes") is Blame.JOB
    assert blame.blame_for(Verdict.HEALTHY, hw, "node gpu-b7 lost") is Blame.JOB


def test_a_node_wide_unhealthy_finding_counts_for_every_job():
    wide = finding(FaultKind.FABRIC, None, blame_=Blame.NETWORK, action=OperatorAction.CHECK_FABRIC)
    hw = blame.judge((0,), node(wide))
    assert hw.faults == (wide,)
    assert blame.blame_for(Verdict.DEADLOCK_CONFIRMED, hw, None) is Blame.NETWORK


def test_blame_is_in_the_rest_job_document_and_in_the_evidence():
    status = run(Job(), training, 3, lambda t: HEALTHY)[-1][1]
    assert status.evidence_dict()["blame"] == "job"
    failed = dataclasses.replace(status, detector_error="boom", blame=Blame.NODE)
    assert failed.evidence_dict() == {"detector_error": "boom"}  # the status itself still says its blame
    from gpu_triage.serving.api import job_document

    assert job_document(failed)["blame"] == "node"


def test_blame_shows_in_the_status_table_the_timeline_picture_and_the_evidence_report(tmp_path):
    from gpu_triage.actions.evidence_report import render_report
    from gpu_triage.cli.status import render
    from gpu_triage.journal.timeline import build_timeline, timeline_figure
    from gpu_triage.serving.api import job_document

    out = run(Job(), hang_at(300), 340, lambda t: node(xid79(3)) if t >= 290 else HEALTHY)
    status = next(s for t, s in out if s.verdict is Verdict.DEADLOCK_CONFIRMED)
    doc = {"node": "gpu-a17", "time": 340.0, "gpus": [], "jobs": [job_document(status)]}
    text = render(doc, "http://127.0.0.1:9410")
    header = next(line for line in text.splitlines() if line.startswith("JOB"))
    assert "BLAME" in header.split()
    row = next(line for line in text.splitlines() if line.startswith("ft "))
    assert "node (GPU 3 Xid 79)" in row, row

    def ev(i, t, kind, **payload):
        return {"id": i, "time": t, "kind": kind, "job": "ft", "payload": payload}

    events = [
        ev(1, 100.0, "verdict", to="healthy", blame="job"),
        ev(2, 305.0, "verdict", to="deadlock_confirmed", onset=300.0, blame="node"),
        ev(3, 306.0, "action", action="drain", result="started"),
        ev(4, 307.0, "action", action="requeue", result="ok"),
    ]
    tl = build_timeline("ft", [], events, end_s=340.0)
    assert [(s.verdict, s.blame) for s in tl.spans] == [("healthy", "job"), ("deadlock_confirmed", "node")]
    assert {m.kind for m in tl.marks} >= {"drain", "requeue"}
    fig = timeline_figure(tl)
    gids = {a.get_gid() for ax in fig.axes for a in [*ax.patches, *ax.texts, *ax.lines] if a.get_gid()}
    assert {"blame:node", "blame_label:node", "verdict:deadlock_confirmed", "mark:drain:verdict"} <= gids, (
        gids
    )
    from gpu_triage.model.jsonable import jsonable

    bundle_status = {"job": jsonable(dataclasses.asdict(status))}  # what captures.py writes
    page = render_report({"job": "ft", "verdict": "deadlock_confirmed"}, [], bundle_status)
    assert "<h2>Whom it blames</h2><p><b>node</b>" in page
    assert "<td>3</td><td>xid</td><td>79</td><td>unhealthy</td><td>node</td><td>drain_node</td>" in page
    hostile = {"job": {"blame": "<script>", "evidence": {"hardware": [{"kind": "<b>", "gpu": None}, "x"]}}}
    page = render_report({}, [], hostile)
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;" in page
