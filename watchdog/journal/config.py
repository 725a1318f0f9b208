"""``[events]``: how long the event store keeps events and how large it may grow."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_triage.model.config_checks import integer, number
from gpu_triage.model.config_schema import setting


@dataclass(frozen=True, slots=True)
class EventsConfig:
    retention_days: float = setting(30.0, parse=number(0, 3650, low_open=True), doc="age limit of events")
    max_bytes: int = setting(256 << 20, parse=integer(1 << 20), doc="size limit of the event database")
    prune_interval_s: float = setting(600.0, parse=number(10, 86400), doc="how often retention runs")


__all__ = ["EventsConfig"]
