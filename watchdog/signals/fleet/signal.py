"""The other nodes' facts ([cluster], Prometheus) as a registered signal: each job whose world is
larger than its ranks here gets the other nodes' latest facts (``JobView.remote``); Prometheus is
asked again - off the cycle thread - while the job is suspicious."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_triage.signals.fleet.config import ClusterConfig
from gpu_triage.signals.fleet.poller import FleetPoller
from gpu_triage.signals.fleet.remote import RemoteFacts
from gpu_triage.signals.signal import Contribution, JobSight, SignalEnv, register
from gpu_triage.signals.stacks.dumps import StackSummary
from gpu_triage.signals.stacks.signal import waiting_in_collective


@register("fleet", section="cluster", status_path=("cluster",), reads=("stacks",))
class FleetSignal:
    def __init__(self, settings: ClusterConfig, env: SignalEnv) -> None:
        self.settings = settings
        self.poller = FleetPoller(settings, node=env.node, clock=env.clock)

    def contribute(self, now: float, jobs: Sequence[JobSight]) -> Mapping[str, Contribution]:
        if not self.poller.enabled:
            return {}
        out: dict[str, Contribution] = {}
        for j in jobs:
            stacks = j.facts.get("stacks")
            world = j.world_size
            if world is None and isinstance(stacks, StackSummary):
                world = stacks.world_size
            if world is None or world <= j.ranks_here:
                continue
            self.poller.request(now, j.job, waiting_in_collective(stacks) or j.suspect)
            remote = self.poller.latest(j.job)
            if remote is None:
                remote = RemoteFacts(
                    j.job, now, error="not asked for: the job was never suspicious", asked=False
                )
            out[j.job] = {"remote": remote}
        self.poller.forget({j.job for j in jobs})
        return out

    def status(self) -> Mapping[str, Any]:
        return self.poller.status()

    def reload(self, settings: ClusterConfig, env: SignalEnv) -> FleetSignal:
        self.close()
        return FleetSignal(settings, env)

    def close(self) -> None:
        self.poller.close()


__all__ = ["FleetSignal"]
