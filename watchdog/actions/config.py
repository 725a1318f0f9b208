"""``[actions]`` (what the action engine does on a verdict, and when) and ``[evidence]`` (how many
evidence bundles it keeps); :class:`EngineConfig`, what the engine is built from: those sections and
``[alerts]``, ``[ras]`` and ``[stacks]`` whole, and where it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpu_triage.alerts.config import AlertsConfig
from gpu_triage.model.config_checks import (
    argv,
    boolean,
    choice,
    enum_value,
    integer,
    number,
    optional_path,
    optional_text,
)
from gpu_triage.model.config_schema import setting
from gpu_triage.model.states import Mode
from gpu_triage.signals.nccl_ras.poller import RasConfig
from gpu_triage.signals.stacks.config import StacksConfig


@dataclass(frozen=True, slots=True)
class EvidenceConfig:
    retention_days: float = setting(
        30.0, parse=number(0, 3650, low_open=True), doc="age limit of evidence bundles"
    )
    max_bundles: int = setting(
        50, parse=integer(1, 100000), doc="most evidence bundles kept (the oldest go first)"
    )


@dataclass(frozen=True, slots=True)
class ActionsConfig:
    mode: Mode = setting(Mode.OBSERVE, parse=enum_value(Mode), doc="observe, alert or kill")
    capture_after_s: float = setting(0.0, parse=number(0, 3600), doc="suspected -> evidence capture")
    capture_timeout_s: float = setting(30.0, parse=number(1, 600), doc="limit of one capture command")
    alert_after_s: float = setting(30.0, parse=number(0, 3600), doc="suspected -> alert")
    sigterm_after_s: float = setting(60.0, parse=number(0, 86400), doc="confirmed -> SIGTERM (kill mode)")
    sigkill_grace_s: float = setting(30.0, parse=number(1, 3600), doc="SIGTERM -> SIGKILL")
    max_kills_per_hour: int = setting(1, parse=integer(0, 100), doc="kills allowed per rolling hour")
    kill_hook: tuple[str, ...] = setting((), parse=argv, doc="command run instead of signals")
    dry_run: bool = setting(False, parse=boolean, doc="log what would be signalled, signal nothing")
    kill_via: str = setting(
        "auto", parse=choice("auto", "signal", "slurm"), doc="stop a job with signals or Slurm's scancel"
    )
    slurm_cancel: str = setting(
        "job", parse=choice("job", "step"), doc="scancel the whole job or the ranks' step"
    )
    slurm_bin_dir: Path | None = setting(
        None, parse=optional_path, doc="directory of scancel/squeue/scontrol (default: PATH)"
    )
    drain: bool = setting(
        False,
        parse=boolean,
        doc="drain this node through Slurm (scontrol) on a hardware fault: a hang that blames the node, "
        "or a finding whose action is drain_node (modes alert and kill)",
    )
    requeue: bool = setting(
        False,
        parse=boolean,
        doc="a hang that blames the node: scontrol requeue a requeueable Slurm job instead of cancelling it",
    )
    slurm_node_name: str | None = setting(
        None, parse=optional_text, doc="this node's Slurm NodeName for drains (empty: daemon.node)"
    )


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the action engine is built from: its sections whole (each read once, never copied field by
    field), where it runs, and two timings the tests shorten.

    From ``[ras]`` the capture takes the RAS address (``host``, ``port``), from ``[stacks]`` the py-spy
    binary (``py_spy``: a path, or ``auto``); a path that is not an executable file means no py-spy."""

    node: str
    state_dir: Path
    actions: ActionsConfig = field(default_factory=ActionsConfig)
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    ras: RasConfig = field(default_factory=RasConfig)
    stacks: StacksConfig = field(default_factory=StacksConfig)
    generator_url: str | None = None
    """Sent to Alertmanager as ``generatorURL`` (the daemon's ``/status``)."""
    adopt_window_s: float = 300.0
    """How long alerts and episodes a previous daemon left wait for their job to come back."""
    delivery_poll_interval_s: float = 0.5
    """How often, in real time, a delivery worker re-reads the clock while it waits for a retry."""


__all__ = ["ActionsConfig", "EngineConfig", "EvidenceConfig"]
