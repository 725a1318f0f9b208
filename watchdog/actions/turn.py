"""One job's turn on the ladder in one cycle (:class:`JobTurn`): the one value the engine hands down to
its rungs - the capture (:mod:`~gpu_triage.actions.captures`), the page
(:mod:`~gpu_triage.actions.alert_book`) and the SIGTERM (:mod:`~gpu_triage.actions.kill_policy`) -
instead of the same nine arguments in each signature."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpu_triage.actions.episode import Episode
from gpu_triage.actions.interface import Cycle
from gpu_triage.actions.records import Records
from gpu_triage.model.snapshot import JobStatus
from gpu_triage.model.states import Mode
from gpu_triage.signals.ranks import RankProcess


@dataclass(frozen=True, slots=True)
class JobTurn:
    """The cycle, the job's episode (its state, updated by the rungs), its status this cycle, its
    proven rank processes, and the records the rungs add to."""

    cycle: Cycle
    ep: Episode
    job: JobStatus
    procs: Sequence[RankProcess]
    records: Records

    @property
    def now(self) -> float:
        return self.cycle.now

    @property
    def mode(self) -> Mode:
        return self.cycle.mode


__all__ = ["JobTurn"]
