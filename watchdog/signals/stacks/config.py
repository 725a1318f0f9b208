"""``[stacks]``: the py-spy sampler's schedule and budget, and what the detector makes of the dumps.

The daemon reads the section into :class:`StacksConfig` (:mod:`gpu_triage.daemon.config`); the sampler
takes its schedule, the detector (``DetectorConfig.stacks``) its judgement settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_triage.model.config_checks import boolean, integer, nonempty_text, number
from gpu_triage.model.config_schema import setting


@dataclass(frozen=True, slots=True)
class StacksConfig:
    """Stack evidence (py-spy): the sampler's schedule and budget, and what the detector makes of it."""

    enabled: bool = setting(True, parse=boolean, doc="sample the ranks' Python stacks with py-spy")
    py_spy: str = setting(
        "auto", parse=nonempty_text, doc="py-spy binary, or auto (PATH, then beside python)"
    )
    nonblocking: bool = setting(
        True, parse=boolean, doc="dump without pausing the rank (py-spy --nonblocking)"
    )
    healthy_interval_s: float = setting(
        60.0, parse=number(1, 86400), doc="dump interval of a job whose steps advance"
    )
    blind_interval_s: float = setting(
        5.0, parse=number(1, 86400), doc="dump interval of a job without progress files"
    )
    suspect_interval_s: float = setting(3.0, parse=number(0.5, 3600), doc="dump interval on suspicion")
    timeout_s: float = setting(5.0, parse=number(0.5, 120), doc="limit of one py-spy dump")
    budget_cpu_s_per_min: float = setting(
        3.0, parse=number(0.01, 60), doc="py-spy CPU seconds allowed per rolling minute"
    )
    max_parallel: int = setting(2, parse=integer(1, 16), doc="jobs dumped at the same time")
    frozen_s: float = setting(20.0, parse=number(1, 86400), doc="a stack unchanged this long is frozen")
    min_samples: int = setting(4, parse=integer(2, 1000), doc="dumps in a row a frozen stack must span")
    fresh_s: float = setting(30.0, parse=number(1, 86400), doc="a dump older than this is not used")
    checkpoint_max_s: float = setting(
        1800.0, parse=number(1, 604800), doc="a save longer than this: stalled_checkpoint"
    )
    asleep_cpu_ratio: float = setting(
        0.3, parse=number(0, 64), doc="a rank below this share of a core is asleep on the host"
    )


__all__ = ["StacksConfig"]
