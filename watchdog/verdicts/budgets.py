"""How long a job's train ranks may be frozen before a rule counts it (pure): the fast budget of the
hang rules (K1/K2/K3/K5/K6) and the stall budget of ``stalled``/``slow``, both from the job's learned
step timing (:mod:`gpu_triage.verdicts.step_timing`)."""

from __future__ import annotations

from gpu_triage.verdicts.facts import JobFacts
from gpu_triage.verdicts.settings import DetectorConfig
from gpu_triage.verdicts.step_timing import FirstStep, StepTiming


def fast_budget_s(cfg: DetectorConfig, f: JobFacts, timing: StepTiming, *, remote: bool) -> float:
    """How long train ranks must be frozen before K1/K2 count it."""
    if f.first is not None and (remote or f.first is FirstStep.AFTER_LEASE):
        return max(cfg.fast_min_s, timing.first_step_budget_s(f.first))
    if not timing.learned():
        return timing.first_step_budget_s(FirstStep.AFTER_START) if remote else 2 * cfg.fast_min_s
    k = cfg.k_remote if remote else cfg.k_fast
    return max(cfg.fast_min_s, k * timing.interval_s())


def stall_budget_s(cfg: DetectorConfig, f: JobFacts, timing: StepTiming) -> float:
    steady = max(cfg.stall_min_s, cfg.k_stall * timing.interval_s())
    if f.first is not None:
        return max(steady, timing.first_step_budget_s(f.first))
    return steady
