"""One node's facts about one job's ranks, as plain typed values (pure: no I/O, time passed in).

What a peer on another node needs to judge the same job: where each rank's stack waits (phase, the
call site, since when unchanged), its step and progress phase and when they last changed, whether
the node's ranks write or read, since when the rank's GPU sits in the spin band, and the node's own
verdict and onset. :func:`local_facts` builds them each cycle from what the detector was given (the
:class:`~gpu_triage.detector.JobView`) and what it said (the
:class:`~gpu_triage.snapshot.JobStatus`); :mod:`gpu_triage.signals.fleet.exposition` exports them as
``gpu_watchdog_fleet_*`` series labelled ``training_job``, ``node`` and ``rank`` so that the series
of every node join by job and rank; :mod:`gpu_triage.signals.fleet.remote` reads them back from Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_triage.model.samples import quick_init
from gpu_triage.model.states import GpuState
from gpu_triage.signals.stacks.dumps import StackSummary, group_key

PREFIX = "gpu_watchdog_fleet_"
JOB_LABEL = "training_job"
"""The label that names the training job (``job`` is Prometheus's scrape job)."""
NODE_LABEL = "fleet_node"
"""The label that names the reporting node (``[daemon] node``); not ``node``, which the shipped
scrape config sets per target (a scraped ``node`` would become ``exported_node``)."""
MAX_WHERE_CHARS = 160
"""A stack's call-site label is cut to this length (a label value, bounded)."""
MAX_COLLECTIVE_CHARS = 64
"""A stack's collective label is cut to this length."""


SAVE_OR_EVAL = frozenset({"checkpoint", "eval"})
"""Stack phases (and progress phases) of a save or an eval."""


class RankLike(Protocol):
    """What :func:`local_facts` reads of a rank (the detector's ``RankView`` has it)."""

    @property
    def rank(self) -> int: ...
    @property
    def gpu(self) -> int | None: ...
    @property
    def step(self) -> int | None: ...
    @property
    def phase(self) -> str | None: ...
    @property
    def step_changed_at(self) -> float | None: ...
    @property
    def phase_since(self) -> float | None: ...


class GpuLike(Protocol):
    @property
    def gpu(self) -> int: ...
    @property
    def state(self) -> GpuState: ...
    @property
    def state_since(self) -> float | None: ...


@quick_init  # built once a rank (or a GPU) every process period
@dataclass(frozen=True, slots=True)
class RankFacts:
    """What one node knows about one of its ranks."""

    rank: int
    stack_phase: str | None = None
    """Where the rank's latest fresh stack is (:class:`~gpu_triage.stacks.StackPhase` value)."""
    stack_where: str | None = None
    """The stack's group key (``collective barrier @ train.py:40 main``): equal keys wait together."""
    stack_same_since: float | None = None
    """Since when the rank's stack has not changed (the first dump showing it)."""
    stack_sampled_at: float | None = None
    """When the latest dump was taken."""
    stack_collective: str | None = None
    """The collective the rank's stack blocks in, whatever its phase (``barrier``,
    ``all_gather_into_tensor``...), None when it blocks in none. A rank inside a save or an eval
    *and* in a collective waits for the others there; one inside a save outside any collective is
    doing the save's work (serialising, writing): a healthy save in progress."""
    step: int | None = None
    step_changed_at: float | None = None
    phase: str | None = None
    """The trainer's progress phase (``train``, ``checkpoint``...), None without progress files."""
    phase_since: float | None = None
    spin_since: float | None = None
    """Since when the rank's GPU has been in the spin band (None: not spinning, or no GPU)."""

    def in_phase_io(self) -> bool:
        """Inside a save or an eval and in no collective: doing the save's or the eval's own work."""
        return self.stack_phase in SAVE_OR_EVAL and not self.stack_collective

    def stack_frozen_s(self) -> float:
        if self.stack_sampled_at is None or self.stack_same_since is None:
            return 0.0
        return max(0.0, self.stack_sampled_at - self.stack_same_since)

    def active_since(self) -> float | None:
        """A train rank's last sign of progress: its last step change or its return to train."""
        times = [t for t in (self.step_changed_at, self.phase_since) if t is not None]
        return max(times) if times else None


@dataclass(frozen=True, slots=True)
class NodeJobFacts:
    """What one node knows about one job at one time."""

    job: str
    node: str
    time: float
    """When these facts were taken (the cycle's epoch time): older than the staleness limit = unknown."""
    world_size: int | None
    verdict: str
    onset: float | None
    kill_worthy: bool
    writing: bool
    reading: bool
    ranks: tuple[RankFacts, ...]


def local_facts(
    now: float,
    node: str,
    *,
    job: str,
    world_size: int | None,
    ranks: Sequence[RankLike],
    stacks: StackSummary | None,
    verdict: str,
    onset: float | None,
    kill_worthy: bool,
    writing: bool,
    reading: bool,
    gpu_spin_since: Mapping[int, float],
    fresh_s: float,
) -> NodeJobFacts:
    """This node's facts about one job. ``ranks``: the detector's
    :class:`~gpu_triage.detector.RankView` values; ``writing``/``reading``: the job's ranks wrote or
    read past the detector's thresholds recently; ``gpu_spin_since``: GPU index -> since when it has been in
    the spin band (only GPUs in it); ``fresh_s``: stacks older than this are not facts any more."""
    stack_of: dict[int, dict[str, Any]] = {}
    if stacks is not None:
        for rank, s in stacks.ranks.items():
            if now - s.sampled_at > fresh_s:
                continue
            stack_of[rank] = {
                "stack_phase": str(s.info.phase),
                "stack_where": group_key(s.info)[:MAX_WHERE_CHARS],
                "stack_same_since": s.same_since if s.samples > 1 else s.sampled_at,
                "stack_sampled_at": s.sampled_at,
                "stack_collective": (s.info.collective or None) and s.info.collective[:MAX_COLLECTIVE_CHARS],
            }
    by_rank: dict[int, RankFacts] = {}
    for r in ranks:  # each rank's facts made once, its fresh stack's with them
        if r.rank in by_rank:
            continue
        spin = gpu_spin_since.get(r.gpu) if r.gpu is not None else None
        stack = stack_of.get(r.rank) if stack_of else None
        by_rank[r.rank] = RankFacts(
            r.rank,
            step=r.step,
            step_changed_at=r.step_changed_at,
            phase=r.phase,
            phase_since=r.phase_since,
            spin_since=spin,
            **(stack or {}),
        )
    for rank, stack in stack_of.items():  # a rank seen only in the stacks
        if rank not in by_rank:
            by_rank[rank] = RankFacts(rank=rank, **stack)
    return NodeJobFacts(
        job=job,
        node=node,
        time=now,
        world_size=world_size,
        verdict=verdict,
        onset=onset,
        kill_worthy=kill_worthy,
        writing=writing,
        reading=reading,
        ranks=tuple([by_rank[r] for r in sorted(by_rank)]),
    )


def spin_since_by_gpu(gpus: Iterable[GpuLike]) -> dict[int, float]:
    """GPU index -> since when it has been in the spin band, from the snapshot's GPU statuses."""
    out: dict[int, float] = {}
    for g in gpus:
        if g.state is GpuState.CHECKPOINT_OR_DEADLOCK and g.state_since is not None:
            out[g.gpu] = g.state_since
    return out


__all__ = [
    "JOB_LABEL",
    "NODE_LABEL",
    "PREFIX",
    "NodeJobFacts",
    "RankFacts",
    "local_facts",
    "spin_since_by_gpu",
]
