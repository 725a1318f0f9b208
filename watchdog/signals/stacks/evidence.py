"""What the ranks' stacks say about one job, as detector facts and findings (pure, time passed in).

The sampler (:mod:`gpu_triage.signals.stacks.sampler`) keeps each rank's latest stack and since when it has
not changed; this module turns a job's :class:`~gpu_triage.signals.stacks.dumps.StackSummary` into
:class:`StackFacts`:

- **frozen in collectives**: every rank of the job sampled recently (``fresh_s``), every stack
  unchanged across at least ``min_samples`` dumps spanning ``frozen_s``, most of them waiting in a
  collective and none in a save or eval. The ranks that wait somewhere else (another collective,
  another call site, a host-side wait) are the *odd* ranks, named: the minority of the groups.
  ``complete`` says whether every rank of the world (``WORLD_SIZE``) was among them: a rank on
  another node may be saving where this node cannot see it, so an incomplete set is never proof.
- **in a save**: a rank's stack is inside a checkpoint save: the job is checkpointing (never a
  hang), until ``checkpoint_max_s`` (then ``stalled_checkpoint``, still never a kill).
- **in eval**: explains the other ranks' wait like an eval lease.
- **split between a phase and a step** (the reference failure): some ranks wait in a collective
  *inside* a save or an eval (none of them writing or computing), every other rank is inside a
  training step (in its collective, or in forward/backward/the optimizer step), and every stack is
  frozen. A save in which every rank sits is a save; a save that some ranks entered while the others
  are still frozen in their step is the epoch-end deadlock of uneven shards: the save's collective
  and the step's collective can never match. ``split_ranks`` names the ranks in the phase.

A frozen stack can also be a healthy job sampled at the same line each time (a job that spends
most of its step in one all-reduce). The detector therefore never kills on stacks alone: a second,
independent signal must hold - frozen steps (progress files), every job GPU in the spin band
(telemetry), or every rank's host CPU asleep for ``frozen_s`` (a rank blocked in gloo sleeps; a
training rank never does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpu_triage.model.findings import Finding, Signal, context, hang, progress
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.signals.stacks.dumps import (
    AVAILABLE,
    StackPattern,
    StackPhase,
    StackSummary,
    group_key,
    stack_pattern,
)


@dataclass(frozen=True, slots=True)
class StackFacts:
    summary: StackSummary
    pattern: StackPattern
    world_size: int | None
    unsampled: tuple[int, ...]
    """Ranks of the job this node sees but has no fresh stack for."""
    complete: bool
    """Every rank of the world has a fresh stack here."""
    frozen: bool
    """Every sampled rank frozen (``min_samples`` dumps over ``frozen_s``), most in a collective,
    none in a save or eval."""
    frozen_since: float | None
    in_save: tuple[int, ...]
    save_since: float | None
    in_eval: tuple[int, ...]
    odd: tuple[int, ...]
    asleep_since: float | None
    """Since when every rank's host CPU has stayed below ``asleep_cpu_ratio`` (None: not asleep)."""
    split: bool = False
    """Every sampled rank frozen, some in a collective inside a save or an eval (``split_ranks``),
    all the others inside a training step (``step_ranks``)."""
    split_ranks: tuple[int, ...] = ()
    step_ranks: tuple[int, ...] = ()
    split_since: float | None = None

    def provable(self) -> bool:
        return (self.frozen or self.split) and self.complete

    def hung_since(self) -> float | None:
        return self.frozen_since if self.frozen else self.split_since

    def to_dict(self) -> dict[str, object]:
        p = self.pattern
        return {
            **self.summary.to_dict(),
            "groups": [{"where": g.key, "ranks": list(g.ranks)} for g in p.groups],
            "odd_ranks": list(self.odd),
            "in_save": list(self.in_save),
            "in_eval": list(self.in_eval),
            "frozen": self.frozen,
            "frozen_since": self.frozen_since,
            "complete": self.complete,
            "unsampled_ranks": list(self.unsampled),
            "asleep_since": self.asleep_since,
            "split": self.split,
            "split_ranks": list(self.split_ranks),
            "step_ranks": list(self.step_ranks),
        }


def stack_facts(
    now: float,
    summary: StackSummary | None,
    ranks: Sequence[tuple[int, float | None]],
    world_size: int | None,
    cfg: StacksConfig,
    asleep_since: float | None,
) -> StackFacts | None:
    """``ranks``: (rank, CPU ratio) of the job's ranks on this node; ``asleep_since`` the previous
    cycle's value (the caller keeps it)."""
    if summary is None:
        return None
    p = stack_pattern(summary.ranks, now=now, fresh_s=cfg.fresh_s, frozen_s=cfg.frozen_s)
    sampled = set(p.sampled)
    seen = {r for r, _ in ranks}
    unsampled = tuple(sorted(seen - sampled))
    world = world_size if world_size is not None else summary.world_size
    complete = bool(sampled) and not unsampled and world is not None and sampled >= set(range(world))
    fresh = {r: summary.ranks[r] for r in p.sampled}
    enough = all(s.samples >= cfg.min_samples and s.frozen_s() >= cfg.frozen_s for s in fresh.values())
    waiting = len(p.in_collective) * 2 >= len(fresh) and bool(p.in_collective)
    frozen = bool(fresh) and enough and waiting and not p.in_save and not p.in_eval
    phase_ranks, step_ranks = set(p.in_phase_collective), set(p.in_step)
    split = (
        bool(fresh)
        and enough
        and bool(phase_ranks)
        and bool(step_ranks)
        and phase_ranks | step_ranks == set(fresh)
    )
    ratios = [c for _, c in ranks]
    if ranks and all(c is not None and c <= cfg.asleep_cpu_ratio for c in ratios):
        asleep = asleep_since if asleep_since is not None else now
    else:
        asleep = None
    return StackFacts(
        summary=summary,
        pattern=p,
        world_size=world,
        unsampled=unsampled,
        complete=complete,
        frozen=frozen,
        frozen_since=p.frozen_since if frozen else None,
        in_save=p.in_save,
        save_since=p.save_since,
        in_eval=p.in_eval,
        odd=p.odd if frozen else (),
        asleep_since=asleep,
        split=split,
        split_ranks=tuple(sorted(phase_ranks)) if split else (),
        step_ranks=tuple(sorted(step_ranks)) if split else (),
        split_since=p.frozen_since if split else None,
    )


def asleep_long_enough(sf: StackFacts, now: float, cfg: StacksConfig) -> bool:
    return sf.asleep_since is not None and now - sf.asleep_since >= cfg.frozen_s


def where(sf: StackFacts) -> str:
    """``rank 0: collective barrier @ train.py:40 main; rank 1: ...`` (fresh ranks only)."""
    return "; ".join(f"rank {','.join(map(str, g.ranks))}: {g.key}" for g in sf.pattern.groups)


def stack_findings(now: float, sf: StackFacts | None, cfg: StacksConfig) -> list[Finding]:
    if sf is None:
        return []
    out: list[Finding] = []
    if sf.summary.sampler != AVAILABLE:
        out.append(context(Signal.NO_STACKS, f"stack sampling {sf.summary.sampler}"))
    if sf.frozen:
        out.append(
            hang(
                Signal.STACKS_FROZEN,
                f"every sampled rank's stack unchanged for >= {cfg.frozen_s:.0f} s: {where(sf)}",
                sf.frozen_since,
                ranks=sf.pattern.sampled,
            )
        )
        if sf.pattern.different:
            odd = ",".join(map(str, sf.odd)) if sf.odd else "no majority"
            out.append(
                hang(
                    Signal.STACKS_DIVERGED,
                    f"ranks wait in different places (odd: {odd}): {where(sf)}",
                    sf.frozen_since,
                    ranks=sf.odd,
                )
            )
        if asleep_long_enough(sf, now, cfg):
            out.append(
                hang(
                    Signal.RANKS_ASLEEP,
                    "every rank's host CPU idle",
                    sf.asleep_since,
                    ranks=sf.pattern.sampled,
                )
            )
        if not sf.complete:
            missing = f"{len(sf.pattern.sampled)} of {sf.world_size if sf.world_size is not None else '?'}"
            out.append(context(Signal.NO_STACKS, f"stacks of {missing} ranks: others may be saving unseen"))
    if sf.split:
        phases = sorted({str(sf.summary.ranks[r].info.phase) for r in sf.split_ranks})
        out.append(
            hang(
                Signal.STACKS_PHASE_SPLIT,
                f"ranks {_ranks(sf.split_ranks)} wait in a collective inside {'/'.join(phases)} while "
                f"ranks {_ranks(sf.step_ranks)} are frozen inside a training step, every stack unchanged "
                f"for >= {cfg.frozen_s:.0f} s: {where(sf)}",
                sf.split_since,
                ranks=sf.split_ranks,
            )
        )
        if asleep_long_enough(sf, now, cfg):
            out.append(hang(Signal.RANKS_ASLEEP, "every rank's host CPU idle", sf.asleep_since))
        if not sf.complete:
            missing = f"{len(sf.pattern.sampled)} of {sf.world_size if sf.world_size is not None else '?'}"
            out.append(context(Signal.NO_STACKS, f"stacks of {missing} ranks: not every rank seen"))
    if sf.in_save:
        sites = {group_key(sf.summary.ranks[r].info) for r in sf.in_save}
        out.append(
            (context if sf.split else progress)(
                Signal.STACK_IN_SAVE,
                "inside a checkpoint save: " + "; ".join(sorted(sites)),
                sf.save_since,
                ranks=sf.in_save,
            )
        )
    if sf.in_eval:
        out.append((context if sf.split else progress)(Signal.STACK_IN_EVAL, "inside eval", ranks=sf.in_eval))
    if sf.unsampled and not sf.frozen:
        out.append(context(Signal.NO_STACKS, "no fresh stack", ranks=sf.unsampled))
    return out


def _ranks(ranks: Sequence[int]) -> str:
    return ",".join(map(str, ranks))


def phase_of(sf: StackFacts | None, rank: int) -> StackPhase | None:
    if sf is None or rank not in sf.pattern.sampled:
        return None
    return sf.summary.ranks[rank].info.phase


__all__ = [
    "StackFacts",
    "asleep_long_enough",
    "phase_of",
    "stack_facts",
    "stack_findings",
    "where",
]
