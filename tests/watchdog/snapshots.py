"""Builders of example snapshots for REST, metrics and benchmark tests.

Plain constructors of the real immutable dataclasses (no fakes): a node of ``gpus`` B300s running one
job whose ranks map one-to-one onto GPUs, in a chosen verdict, at a chosen time.
"""

from __future__ import annotations

from gpu_triage.model.evidence import JobEvidence
from gpu_triage.model.snapshot import GpuStatus, JobStatus, RankStatus, Snapshot
from gpu_triage.model.states import GpuState, Mode, Verdict

#: 2025-12-02T12:00:00Z - a fixed epoch time so that expected values are literal.
T0 = 1_764_676_800.0
B300_LIMIT_W = 1100.0


def gpu_status(
    gpu: int,
    *,
    state: GpuState = GpuState.COMPUTE,
    power_w: float | None = 900.0,
    state_since: float | None = T0 - 60.0,
    read_errors_total: int = 0,
) -> GpuStatus:
    return GpuStatus(
        gpu=gpu,
        uuid=f"GPU-{gpu:08x}-0000-4000-8000-000000000000",
        name="NVIDIA B300 SXM6 AC",
        model="B300",
        power_w=power_w,
        power_limit_w=B300_LIMIT_W,
        utilization_ratio=1.0 if power_w is not None else None,
        memory_used_bytes=150.0 * 2**30 if power_w is not None else None,
        state=state,
        state_since=state_since,
        energy_j=1_000_000.0 + gpu,
        temperature_c=61.0,
        sm_clock_mhz=1965.0,
        read_errors_total=read_errors_total,
        compute_floor_w=0.40 * B300_LIMIT_W,
        spin_ceiling_w=0.30 * B300_LIMIT_W,
        pci_bus_id=f"00000000:{0x18 + gpu:02X}:00.0",
    )


def rank_status(rank: int, *, step: int = 1200, phase: str = "train") -> RankStatus:
    return RankStatus(
        rank=rank,
        pid=10_000 + rank,
        gpu=rank,
        step=step,
        phase=phase,
        lease_until=T0 + 30.0 if phase != "train" else None,
        alive=True,
        process_status="running",
    )


def job_status(
    job: str = "qwen3-32b-ft",
    *,
    ranks: int = 8,
    verdict: Verdict = Verdict.HEALTHY,
    onset: float | None = None,
    raised: float | None = None,
) -> JobStatus:
    evidence = None
    if verdict is not Verdict.HEALTHY:
        evidence = JobEvidence(
            gpus=tuple(range(ranks)),
            step_interval_s=45.0,
            phase_by_rank={r: "epoch_end" if r == 0 else "train" for r in range(ranks)},
        )
    return JobStatus(
        job=job,
        ranks=tuple(rank_status(r) for r in range(ranks)),
        verdict=verdict,
        onset=onset,
        raised=raised,
        evidence=evidence,
    )


def snapshot(
    *,
    gpus: int = 8,
    cycle: int = 42,
    time: float = T0,
    period_s: float = 1.0,
    mode: Mode = Mode.OBSERVE,
    armed: bool = False,
    verdict: Verdict = Verdict.HEALTHY,
    jobs: int = 1,
    node: str = "node-a",
    source: str = "sim",
) -> Snapshot:
    """A node of ``gpus`` B300s; with ``jobs`` >= 1 the first job spans every GPU in ``verdict``."""
    deadlocked = verdict in (Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED)
    state = GpuState.CHECKPOINT_OR_DEADLOCK if deadlocked else GpuState.COMPUTE
    power_w = 230.0 if deadlocked else 900.0
    job_list = []
    if jobs >= 1:
        onset = time - 60.0 if verdict is not Verdict.HEALTHY else None
        raised = time - 20.0 if verdict is not Verdict.HEALTHY else None
        job_list.append(job_status(ranks=gpus, verdict=verdict, onset=onset, raised=raised))
    for extra in range(1, jobs):
        job_list.append(job_status(f"job-{extra}", ranks=1))
    return Snapshot(
        node=node,
        source=source,
        mode=mode,
        armed=armed,
        cycle=cycle,
        time=time,
        period_s=period_s,
        gpus=tuple(gpu_status(g, state=state, power_w=power_w) for g in range(gpus)),
        jobs=tuple(job_list),
        sample_duration_s=0.0021,
        last_sample_time=time - 0.01,
        started_at=time - 3600.0,
        counters={"cycles_total": float(cycle)},
        actions={("capture", "ok"): 2, ("alert", "failed"): 1},
        version="0.1.0",
    )
