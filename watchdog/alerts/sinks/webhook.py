"""A generic webhook: the alert as one JSON object (:meth:`Alert.to_dict`, with ``status``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_triage.alerts.model import SOURCE, Alert
from gpu_triage.alerts.sinks.protocol import RenderContext


def webhook_payload(alert: Alert) -> dict[str, Any]:
    return {"version": "1", "source": SOURCE, **alert.to_dict()}


@dataclass(frozen=True, slots=True)
class Webhook:
    name: str = "webhook"
    needs_routing_key: bool = False
    default_url: str | None = None
    resends_active: bool = False

    def endpoint(self, url: str) -> str:
        return url

    def payload(self, alert: Alert, context: RenderContext) -> Any:
        return webhook_payload(alert)
