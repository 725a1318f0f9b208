"""PagerDuty Events API v2: ``routing_key``, ``event_action`` trigger/resolve, ``dedup_key`` <= 255
characters, ``payload.summary`` <= 1024 characters, ``severity`` critical|error|warning|info.

The routing key is a secret: it is read from ``routing_key_file`` at delivery time and never reaches
the event store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_triage.alerts.model import SOURCE, Alert, rfc3339, truncate
from gpu_triage.alerts.sinks.protocol import RenderContext, SinkTraits

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
PAGERDUTY_SUMMARY_MAX = 1024
"""PagerDuty cuts ``payload.summary`` at 1024 characters (the key's limit: ``model.DEDUP_KEY_MAX``)."""


def pagerduty_payload(alert: Alert, routing_key: str) -> dict[str, Any]:
    """An Events API v2 event: trigger while firing, resolve once cleared."""
    if not alert.firing:
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": alert.dedup_key}
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": alert.dedup_key,
        "payload": {
            "summary": truncate(alert.summary, PAGERDUTY_SUMMARY_MAX),
            "source": alert.node,
            "severity": alert.severity,
            "timestamp": rfc3339(alert.time),
            "component": alert.job,
            "group": alert.node,
            "class": alert.condition,
            "custom_details": {
                "verdict": alert.verdict,
                "since": rfc3339(alert.starts_at),
                "ranks": list(alert.ranks),
                "gpus": list(alert.gpus),
                "gpu_hours_burned": alert.gpu_hours,
                "signals": list(alert.signals),
                "evidence": alert.evidence,
                "runbook": alert.runbook,
                "evidence_bundle": alert.bundle,
                "actions": alert.actions,
            },
        },
        "client": SOURCE,
    }
    if alert.runbook.startswith(("http://", "https://")):
        event["links"] = [{"href": alert.runbook, "text": "Runbook"}]
    return event


PAGERDUTY_TRAITS = SinkTraits(needs_routing_key=True, default_url=PAGERDUTY_EVENTS_URL)


@dataclass(frozen=True, slots=True)
class PagerDuty:
    name: str = "pagerduty"
    traits: SinkTraits = PAGERDUTY_TRAITS

    def payload(self, alert: Alert, context: RenderContext) -> Any:
        if not context.routing_key:
            raise ValueError("a PagerDuty sink needs a routing key")
        return pagerduty_payload(alert, context.routing_key)
