"""NCCL's RAS service as a registered signal: polled (off the cycle thread, rate-limited) only while
some job is suspicious - its last verdict asks for a look, or a rank waits in a collective - and each
job gets what RAS said about the communicators of its ranks (``JobView.ras``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_triage.signals.nccl_ras.poller import RasConfig, RasPoller
from gpu_triage.signals.signal import Contribution, JobSight, SignalEnv, register
from gpu_triage.signals.stacks.signal import waiting_in_collective


@register("nccl_ras", section="ras", status_path=("stacks", "nccl_ras"), reads=("stacks",))
class RasSignal:
    def __init__(self, settings: RasConfig, env: SignalEnv) -> None:
        self.settings = settings
        self.poller = RasPoller(settings, clock=env.clock)

    def contribute(self, now: float, jobs: Sequence[JobSight]) -> Mapping[str, Contribution]:
        out: dict[str, Contribution] = {}
        suspicious = False
        for j in jobs:
            suspicious = suspicious or j.suspect or waiting_in_collective(j.facts.get("stacks"))
            out[j.job] = {"ras": self.poller.facts(set(j.pids.values()))}
        self.poller.request(now, suspicious)
        return out

    def status(self) -> Mapping[str, Any]:
        return self.poller.status()

    def reload(self, settings: RasConfig, env: SignalEnv) -> RasSignal:
        self.close()
        return RasSignal(settings, env)

    def close(self) -> None:
        """Nothing to stop: a poll in flight is a daemon thread under its own deadline."""


__all__ = ["RasSignal"]
