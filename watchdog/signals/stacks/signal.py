"""The stack sampler as a registered signal: each job's proven live ranks are offered to the sampler
every process period (it decides what is due, off the cycle thread), and each job gets its latest
stacks (``JobView.stacks``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_triage.signals.signal import Contribution, JobSight, SignalEnv, register
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.signals.stacks.dumps import StackPhase, StackSummary
from gpu_triage.signals.stacks.sampler import StackSampler


def waiting_in_collective(summary: object) -> bool:
    """A rank sat in a collective across more than one dump (what makes RAS and the fleet worth asking)."""
    return isinstance(summary, StackSummary) and any(
        s.samples > 1 and s.info.phase is StackPhase.COLLECTIVE for s in summary.ranks.values()
    )


@register("stacks", section="stacks", status_path=("stacks",))
class StackSignal:
    def __init__(self, settings: StacksConfig, env: SignalEnv) -> None:
        self.settings = settings
        self.sampler = StackSampler(settings, clock=env.clock)

    def contribute(self, now: float, jobs: Sequence[JobSight]) -> Mapping[str, Contribution]:
        out: dict[str, Contribution] = {}
        for j in jobs:
            self.sampler.request(
                now,
                j.job,
                j.pids,
                urgent=j.suspect,
                blind=not j.has_progress,
                world_size=j.process_world_size,
            )
            out[j.job] = {"stacks": self.sampler.summary(j.job)}
        self.sampler.forget({j.job for j in jobs})
        return out

    def status(self) -> Mapping[str, Any]:
        return self.sampler.status()

    def reload(self, settings: StacksConfig, env: SignalEnv) -> StackSignal:
        self.close()
        return StackSignal(settings, env)

    def close(self) -> None:
        self.sampler.close()


__all__ = ["StackSignal", "waiting_in_collective"]
