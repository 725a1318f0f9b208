"""Receiver kinds by name: the one place that lists them.

``[[alerts.sinks]] kind = "..."`` is checked against :data:`SINK_KINDS`; delivery and the action
engine look the kind up with :func:`sink_kind`. A new receiver: a module in ``alerts/sinks/`` and a
line here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gpu_triage.alerts.model import Alert
from gpu_triage.alerts.sinks.alertmanager import Alertmanager
from gpu_triage.alerts.sinks.pagerduty import PagerDuty
from gpu_triage.alerts.sinks.protocol import RenderContext, SinkKind
from gpu_triage.alerts.sinks.slack import Slack
from gpu_triage.alerts.sinks.webhook import Webhook

_KINDS: tuple[SinkKind, ...] = (Webhook(), Alertmanager(), PagerDuty(), Slack())
SINK_KINDS: Mapping[str, SinkKind] = MappingProxyType({kind.name: kind for kind in _KINDS})


def sink_kind(name: str) -> SinkKind:
    """The receiver kind called ``name``; ValueError naming the known kinds otherwise."""
    try:
        return SINK_KINDS[name]
    except KeyError:
        raise ValueError(f"unknown sink kind {name!r} (known: {', '.join(SINK_KINDS)})") from None


def render(
    kind: str,
    alert: Alert,
    *,
    now: float,
    resend_interval_s: float,
    routing_key: str | None = None,
    generator_url: str | None = None,
) -> Any:
    """The JSON body a sink of ``kind`` posts for ``alert``."""
    context = RenderContext(now, resend_interval_s, routing_key, generator_url)
    return sink_kind(kind).payload(alert, context)


def endpoint(kind: str, url: str) -> str:
    """Where a sink of ``kind`` configured with ``url`` posts."""
    return sink_kind(kind).traits.endpoint(url)
