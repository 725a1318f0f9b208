"""A generic webhook: the alert as one JSON object (:meth:`Alert.to_dict`, with ``status``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_triage.alerts.model import SOURCE, Alert
from gpu_triage.alerts.sinks.protocol import RenderContext, SinkTraits


def webhook_payload(alert: Alert) -> dict[str, Any]:
    return {"version": "1", "source": SOURCE, **alert.to_dict()}


WEBHOOK_TRAITS = SinkTraits()


@dataclass(frozen=True, slots=True)
class Webhook:
    name: str = "webhook"
    traits: SinkTraits = WEBHOOK_TRAITS

    def payload(self, alert: Alert, context: RenderContext) -> Any:
        return webhook_payload(alert)
