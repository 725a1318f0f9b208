"""``[alerts]`` and its ``[[alerts.sinks]]`` receivers.

The rules between a sink's keys (a PagerDuty sink needs a routing key, exactly one of ``url`` and
``url_file``, unique names) are checked where the file is read (:mod:`gpu_triage.daemon.config`), each
problem reported at ``alerts.sinks[i].key`` with its line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_triage.alerts.registry import SINK_KINDS
from gpu_triage.model.config_checks import (
    choice,
    nonempty_text,
    number,
    optional_path,
    optional_text,
    runbook_base,
)
from gpu_triage.model.config_schema import setting


@dataclass(frozen=True, slots=True)
class SinkConfig:
    kind: str = setting("webhook", parse=choice(*SINK_KINDS), doc="receiver type")
    name: str = setting("", parse=nonempty_text, doc="name in logs and metrics (default: kind-N)")
    url: str | None = setting(None, parse=optional_text, doc="receiver URL")
    url_file: Path | None = setting(
        None, parse=optional_path, doc="file holding the URL (Slack's is a secret)"
    )
    routing_key_file: Path | None = setting(None, parse=optional_path, doc="PagerDuty routing key file")
    timeout_s: float = setting(5.0, parse=number(0.1, 60), doc="HTTP timeout of one delivery")


@dataclass(frozen=True, slots=True)
class AlertsConfig:
    resend_interval_s: float = setting(60.0, parse=number(10, 3600), doc="re-send active alerts")
    retry_initial_s: float = setting(
        1.0, parse=number(0.1, 600), doc="first retry delay (doubles, with jitter)"
    )
    retry_max_s: float = setting(300.0, parse=number(1, 3600), doc="longest retry delay")
    runbook_url: str | None = setting(
        None, parse=runbook_base, doc="absolute base URL of the runbook (alerts and render-rules)"
    )
    sinks: tuple[SinkConfig, ...] = setting((), doc="[[alerts.sinks]] receivers")


__all__ = ["AlertsConfig", "SinkConfig"]
