"""``[detector]``: the detector's settings (:class:`DetectorConfig`) and the few fixed sets its rules
share (pure). Importable as ``gpu_triage.verdicts.detector.DetectorConfig`` too."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_triage.model.config_checks import boolean, number
from gpu_triage.model.config_schema import derived, setting
from gpu_triage.model.states import GpuState
from gpu_triage.signals.fleet.config import ClusterConfig
from gpu_triage.signals.fleet.fusion import FusionConfig
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.verdicts.step_timing import TimingConfig

LEASED_PHASES = frozenset({"checkpoint", "eval", "epoch_end", "init", "done"})
WORKING_STATES = frozenset({GpuState.COMPUTE, GpuState.COMMUNICATION})
STOPPED_STATUSES = frozenset({"stopped", "tracing-stop"})


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """``[detector]``: when each verdict is called. Defined once, here; the daemon reads the section into
    it (:mod:`gpu_triage.daemon.config`) and fills the derived fields from ``[stacks]``, ``[daemon] node``
    and ``[cluster] stale_after_s``."""

    fast_min_s: float = setting(
        15.0, parse=number(1, 600), doc="hung (K1/K2): shortest freeze of the train ranks that counts"
    )
    k_fast: float = setting(
        1.5, parse=number(1, 100), doc="... and at least this many learned step intervals"
    )
    k_remote: float = setting(
        2.5,
        parse=number(1, 100),
        doc="K2 with ranks on other nodes, K5 (asymmetric): this many step intervals",
    )
    spin_min_s: float = setting(
        10.0, parse=number(0, 600), doc="every job GPU in the spin band at least this long"
    )
    stall_min_s: float = setting(
        60.0, parse=number(1, 3600), doc="stalled/slow: shortest freeze without proof of a hang"
    )
    k_stall: float = setting(
        3.0, parse=number(1, 100), doc="... and at least this many learned step intervals"
    )
    disagree_min_s: float = setting(
        15.0, parse=number(1, 600), doc="phase disagreement with frozen train ranks"
    )
    power_only_after_s: float = setting(
        120.0, parse=number(10, 180), doc="no progress files: spin band (or asymmetric) this long -> stalled"
    )
    power_only_can_kill: bool = setting(
        False,
        parse=boolean,
        doc="let power alone (no progress files) be kill-worthy: a remote save looks the same",
    )
    confirm_after_s: float = setting(
        120.0, parse=number(1, 3600), doc="suspected this long -> deadlock_confirmed"
    )
    write_active_bytes: float = setting(
        4 * 2**20, parse=number(0), doc="bytes written within write_window_s = 'writing'"
    )
    read_active_bytes: float = setting(
        4 * 2**20, parse=number(0), doc="bytes read within write_window_s = 'reading'"
    )
    write_window_s: float = setting(
        10.0, parse=number(1, 600), doc="window for write_active_bytes and read_active_bytes"
    )
    lease_grace_s: float = setting(5.0, parse=number(0, 3600), doc="tolerance past an announced lease_until")
    starvation_after_s: float = setting(
        30.0, parse=number(1, 3600), doc="sustained starvation -> data_starvation"
    )
    telemetry_lost_after_s: float = setting(10.0, parse=number(1, 600), doc="failed reads -> telemetry_lost")
    default_step_interval_s: float = setting(
        60.0, parse=number(0.01, 3600), doc="step interval assumed until the job's is learned"
    )
    first_step_default_s: float = setting(
        600.0, parse=number(1, 86400), doc="first step after a start, before any first step was seen"
    )
    k_first: float = setting(2.0, parse=number(1, 100), doc="a first step may take this x the longest seen")
    interval_decay: float = setting(
        0.1, parse=number(0, 1), doc="how fast the learned step interval comes down"
    )
    cpu_contention_ratio: float = setting(
        0.9, parse=number(0, 64), doc="a starving rank using this share of a core is CPU-bound"
    )
    slow_max_budgets: float = setting(
        10.0,
        parse=number(1, 1000),
        doc="slow (GPUs computing, steps frozen) this many stall budgets -> stalled",
    )
    idle_held_after_s: float = setting(
        300.0,
        parse=number(10, 86400),
        doc="no progress files: job GPUs idle with memory held this long -> cannot_judge",
    )
    stacks: StacksConfig = derived(
        StacksConfig(), doc="stack evidence settings ([stacks] in the config file: frozen_s, fresh_s, ...)"
    )
    fleet_node: str = derived(
        "this node", doc="this node's name ([daemon] node): how its ranks are named among the world's"
    )
    fleet_stale_after_s: float = derived(
        ClusterConfig().stale_after_s,
        doc="other nodes' facts older than this are unknown ([cluster] stale_after_s)",
    )

    def fusion(self) -> FusionConfig:
        """The fleet rule's settings, from ``[cluster]`` and ``[stacks]``."""
        return FusionConfig(
            stale_after_s=self.fleet_stale_after_s, frozen_s=self.stacks.frozen_s, fresh_s=self.stacks.fresh_s
        )

    def timing(self) -> TimingConfig:
        """The step-timing settings, from ``[detector]``'s."""
        return TimingConfig(
            default_interval_s=self.default_step_interval_s,
            first_step_default_s=self.first_step_default_s,
            k_first=self.k_first,
            decay=self.interval_decay,
        )
