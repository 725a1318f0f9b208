"""The hang rules K1-K6 (docs/detector.md): positive proof of a hang, the only class of verdict that can
lead to a kill. Each rule is a pure function of the job's view and facts, the settings and its learned
step timing, and returns a :class:`Hang` (onset and signals) or None; :func:`hung` tries them in order.
:func:`vetoed` says the evidence against a hang."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_triage.model.findings import Signal
from gpu_triage.model.states import GpuState
from gpu_triage.signals.fleet.fusion import FleetState
from gpu_triage.signals.stacks.evidence import asleep_long_enough
from gpu_triage.verdicts.budgets import fast_budget_s
from gpu_triage.verdicts.facts import JobFacts
from gpu_triage.verdicts.settings import DetectorConfig
from gpu_triage.verdicts.step_timing import StepTiming
from gpu_triage.verdicts.views import JobView


@dataclass(frozen=True, slots=True)
class Hang:
    """A hang rule's proof: since when, and the signals that prove it (kill-worthy)."""

    onset: float
    signals: tuple[str, ...]


def vetoed(f: JobFacts, *, asymmetric: bool = False, stacks: bool = False) -> str | None:
    """Evidence against a hang. For the asymmetric signature the odd GPUs may compute (a busy loop)
    but a rank reading (loading data) explains them instead. For stack evidence (K6) only a GPU
    that computes speaks against a hang: a GPU in the communication band while every rank's stack
    sits frozen in a collective is a spin whose power is on the band's edge."""
    if f.writing:
        return "the job's ranks are writing"
    if f.fleet is not None and f.fleet.veto:
        return f"another node: {f.fleet.veto}"
    if f.stacks is not None and f.stacks.in_save and not f.stacks.split:
        return "a rank's stack is inside a checkpoint save"
    if f.dstate:
        return "ranks in D-state (storage)"
    if asymmetric:
        return "ranks are reading (loading)" if f.reading else None
    if stacks and not any(g.state is GpuState.COMPUTE for g in f.working):
        return None
    if f.working:
        return "GPUs in the compute or communication band"
    return None


def hung(
    now: float,
    job: JobView,
    f: JobFacts,
    cfg: DetectorConfig,
    timing: StepTiming,
    save_seen_at: float | None,
) -> Hang | None:
    """Positive proof of a hang (K1-K6), or None."""
    spun = (
        vetoed(f) is None
        and f.spin_strong
        and f.spin_since is not None
        and now - f.spin_since >= cfg.spin_min_s
    )
    # The asymmetric split (most GPUs spin, a few compute or idle) proves a hang only when every
    # rank is visible here and the trainer announces every collective phase on every rank: then
    # no unannounced save or eval on the odd rank can explain the others' wait.
    asym = (
        job.lease_scope == "job"
        and f.unseen == 0
        and f.majority_since is not None
        and now - f.majority_since >= cfg.spin_min_s
        and vetoed(f, asymmetric=True) is None
    )
    return (
        k1_phase_disagreement(job, f, cfg, timing)
        or k2_frozen_steps_spin(now, job, f, cfg, timing, spun=spun)
        or k5_asymmetric(f, cfg, timing, asym=asym)
        or k3_broken_lease(now, f, cfg, timing, spun=spun, asym=asym)
        or k6_stacks(now, job, f, cfg, timing, spun=spun)
        or k4_power_only(now, job, f, cfg, save_seen_at, spun=spun)
    )


def k1_phase_disagreement(job: JobView, f: JobFacts, cfg: DetectorConfig, timing: StepTiming) -> Hang | None:
    """K1: some ranks announced ``epoch_end`` (job-wide scope: also ``checkpoint``/``eval``) while the
    train ranks stay frozen past their budget."""
    disagreeing = {"epoch_end"} | ({"checkpoint", "eval"} if job.lease_scope == "job" else set())
    disagree = [r for r in (*f.live, *f.expired) if r.phase in disagreeing]
    if vetoed(f) is None and disagree and f.train and f.frozen_since is not None:
        budget = max(cfg.disagree_min_s, fast_budget_s(cfg, f, timing, remote=False))
        if f.frozen_s >= budget:
            return Hang(f.frozen_since, (str(Signal.PHASE_DISAGREEMENT), str(Signal.STEPS_FROZEN)))
    return None


def k2_frozen_steps_spin(
    now: float, job: JobView, f: JobFacts, cfg: DetectorConfig, timing: StepTiming, *, spun: bool
) -> Hang | None:
    """K2: frozen steps + every job GPU in the spin band (with ranks elsewhere: announced phases and
    no first step, or every other node's rank frozen and spinning too)."""
    if not (job.has_progress and f.train and f.frozen_since is not None and spun):
        return None
    assert f.frozen_since is not None and f.spin_since is not None
    remote = f.unseen > 0
    provable = not remote or (job.lease_scope == "job" and f.first is None)
    frozen_s = f.frozen_s
    completed = remote and not provable and _remote_steps_frozen(now, f, cfg)
    if completed:  # every other node's rank frozen and spinning too (gpu_triage.signals.fleet)
        assert f.fleet is not None and f.fleet.remote_frozen_since is not None
        frozen_s = min(frozen_s, now - f.fleet.remote_frozen_since)
    if (provable or completed) and frozen_s >= fast_budget_s(cfg, f, timing, remote=remote):
        onset = min(f.frozen_since, f.spin_since)
        signals = (str(Signal.STEPS_FROZEN), str(Signal.SPIN_BAND), str(Signal.NO_WRITES))
        return Hang(onset, signals + ((str(Signal.REMOTE_COMPLETE),) if completed else ()))
    return None


def k5_asymmetric(f: JobFacts, cfg: DetectorConfig, timing: StepTiming, *, asym: bool) -> Hang | None:
    """K5: frozen steps + the asymmetric split (the odd GPUs are named in the evidence)."""
    if not (f.train and f.frozen_since is not None and asym):
        return None
    assert f.frozen_since is not None and f.majority_since is not None
    if f.frozen_s >= fast_budget_s(cfg, f, timing, remote=True):
        signals = (str(Signal.STEPS_FROZEN), str(Signal.ASYMMETRIC), str(Signal.NO_WRITES))
        return Hang(min(f.frozen_since, f.majority_since), signals)
    return None


def k3_broken_lease(
    now: float, f: JobFacts, cfg: DetectorConfig, timing: StepTiming, *, spun: bool, asym: bool
) -> Hang | None:
    """K3: a broken lease promise while the job's GPUs spin (all, or the asymmetric split) and nothing
    is written."""
    if not ((spun or asym) and f.expired and not [r for r in f.live if r.phase == "checkpoint"]):
        return None
    broken = [r for r in f.expired if r.phase != "checkpoint" or f.unseen == 0]
    train_ok = not f.train or (
        f.frozen_since is not None and f.frozen_s >= fast_budget_s(cfg, f, timing, remote=f.unseen > 0)
    )
    if broken and train_ok:
        lease_end = max(r.lease_until or now for r in broken) + cfg.lease_grace_s
        band = Signal.SPIN_BAND if spun else Signal.ASYMMETRIC
        return Hang(lease_end, (str(Signal.LEASE_EXPIRED), str(band), str(Signal.NO_WRITES)))
    return None


def k6_stacks(
    now: float, job: JobView, f: JobFacts, cfg: DetectorConfig, timing: StepTiming, *, spun: bool
) -> Hang | None:
    """K6: every rank's stack frozen in a collective (the odd ones named), or split between a phase's
    collective and a training step, + a second signal: frozen steps, the spin band, frozen NCCL RAS
    counts, or every rank asleep on the host."""
    sf = f.stacks
    since = sf.hung_since() if sf is not None else None
    if sf is None or not sf.provable() or vetoed(f, stacks=True) is not None or since is None:
        return None
    if any(r.alive is False for r in job.ranks):
        return None
    if sf.frozen:
        signals = [str(Signal.STACKS_FROZEN)]
        if sf.pattern.different or sf.odd:
            signals.append(str(Signal.STACKS_DIVERGED))
    else:  # K6 split: some ranks in a save's or an eval's collective, the others frozen in a step
        signals = [str(Signal.STACKS_PHASE_SPLIT)]
    if f.fleet is not None and f.fleet.stacks_complete:
        signals.append(str(Signal.REMOTE_COMPLETE))
    onset = since
    if job.has_progress:
        if not (f.train and f.frozen_since is not None):
            return None
        if f.frozen_s < fast_budget_s(cfg, f, timing, remote=False):
            return None
        signals.append(str(Signal.STEPS_FROZEN))
        onset = min(onset, f.frozen_since)
    elif spun:
        signals.append(str(Signal.SPIN_BAND))
    elif _ras_frozen(now, job, cfg):
        signals.append(str(Signal.NCCL_COUNTS_FROZEN))
    elif asleep_long_enough(sf, now, cfg.stacks):
        signals.append(str(Signal.RANKS_ASLEEP))
    else:
        return None
    return Hang(onset, (*signals, str(Signal.NO_WRITES)))


def k4_power_only(
    now: float, job: JobView, f: JobFacts, cfg: DetectorConfig, save_seen_at: float | None, *, spun: bool
) -> Hang | None:
    """K4: power alone, no progress files (kill-worthy only with ``power_only_can_kill``)."""
    if (
        cfg.power_only_can_kill
        and not job.has_progress
        and spun
        and f.spin_since is not None
        and now - max(f.spin_since, save_seen_at or 0.0) >= cfg.power_only_after_s
        and all(r.alive is not False for r in job.ranks)
    ):
        return Hang(
            f.spin_since, (str(Signal.SPIN_BAND), str(Signal.NO_WRITES), str(Signal.NO_PROGRESS_FILES))
        )
    return None


def _remote_steps_frozen(now: float, f: JobFacts, cfg: DetectorConfig) -> bool:
    fl = f.fleet
    return (
        fl is not None
        and fl.state is FleetState.COMPLETE
        and f.first is None
        and fl.remote_frozen_since is not None
        and fl.remote_spin_since is not None
        and now - fl.remote_spin_since >= cfg.spin_min_s
    )


def _ras_frozen(now: float, job: JobView, cfg: DetectorConfig) -> bool:
    since = job.ras.counts_frozen_since if job.ras is not None else None
    return since is not None and now - since >= cfg.stacks.frozen_s
