"""An action engine for a test: the real :class:`~gpu_triage.actions.engine.ActionEngine`, built from its
config sections with the defaults most tests want - no py-spy, a RAS address nothing listens on, a
delivery worker that re-reads a fake clock every 20 ms. Pass what the test is about."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from gpu_triage.actions.config import ActionsConfig, EngineConfig, EvidenceConfig
from gpu_triage.actions.engine import ActionEngine
from gpu_triage.actions.kill_targets import CommandRunner, SubprocessRunner
from gpu_triage.actions.ports import EnginePorts
from gpu_triage.alerts.config import AlertsConfig
from gpu_triage.journal.eventstore import EventStore
from gpu_triage.signals.nccl_ras.poller import RasConfig
from gpu_triage.signals.stacks.config import StacksConfig

NO_PY_SPY = "/nonexistent/py-spy"
"""A ``stacks.py_spy`` that is no executable file: the engine runs without py-spy."""
NO_RAS = RasConfig(host="127.0.0.1", port=9)
"""The discard port: a RAS query is refused at once."""


def build_engine(
    store: EventStore,
    state_dir: Path,
    *,
    clock: Callable[[], float] = time.time,
    node: str = "node-a",
    actions: ActionsConfig | None = None,
    alerts: AlertsConfig | None = None,
    evidence: EvidenceConfig | None = None,
    ras: RasConfig = NO_RAS,
    py_spy: str | None = None,
    runner: CommandRunner | None = None,
    adopt_window_s: float = 300.0,
) -> ActionEngine:
    """``py_spy``: a binary, or None for none."""
    config = EngineConfig(
        node=node,
        state_dir=state_dir,
        actions=actions or ActionsConfig(),
        evidence=evidence or EvidenceConfig(),
        alerts=alerts or AlertsConfig(),
        ras=ras,
        stacks=StacksConfig(py_spy=py_spy or NO_PY_SPY),
        adopt_window_s=adopt_window_s,
        delivery_poll_interval_s=0.02,
    )
    return ActionEngine(config, store, EnginePorts(runner=runner or SubprocessRunner(), clock=clock))
