"""Node health as a registered signal (``health``, section ``[health]``): a node-level signal - it
contributes nothing to a job, but the node verdict every cycle (``node_facts``: ``node_health``), and
opens its kernel log only when the daemon starts (``start``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpu_triage.signals.health.monitor import HealthConfig, HealthMonitor
from gpu_triage.signals.signal import Contribution, JobSight, SignalEnv, register

log = logging.getLogger("gpu_watchdog")

#: Settings that need a restart (they choose the readers); the rest change live.
RESTART_KEYS = ("enabled", "kernel_log", "kernel_log_file")


@register("health", section="health")
class HealthSignal:
    def __init__(self, settings: HealthConfig, env: SignalEnv) -> None:
        self.settings = settings
        self.monitor = HealthMonitor(settings, env.gpus, reader=env.hardware if settings.enabled else None)

    def start(self) -> None:
        self.monitor.open()

    def node_facts(self, now: float) -> Mapping[str, object]:
        return {"node_health": self.monitor.sample(now)}

    def contribute(self, now: float, jobs: Sequence[JobSight]) -> Mapping[str, Contribution]:
        return {}  # the node verdict reaches the jobs through the snapshot, not per job

    def status(self) -> Mapping[str, Any]:
        return self.monitor.status()

    def reload(self, settings: HealthConfig, env: SignalEnv) -> HealthSignal:
        """Thresholds and hold time change live; the readers need a restart (logged)."""
        for key in RESTART_KEYS:
            if getattr(settings, key) != getattr(self.settings, key):
                log.warning("health.%s changed: takes effect after a restart", key)
        kept = replace(settings, **{key: getattr(self.settings, key) for key in RESTART_KEYS})
        self.settings = kept
        self.monitor.reconfigure(kept)
        return self

    def close(self) -> None:
        self.monitor.close()


__all__ = ["HealthSignal"]
