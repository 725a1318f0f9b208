"""Alertmanager v2: ``POST {url}/api/v2/alerts`` with a JSON array of
``{labels, annotations, startsAt, endsAt[, generatorURL]}``.

Labels identify the alert and never change within it (``alertname``, ``node``, ``training_job``,
``condition``, ``severity``, ``service``: the same label names as the Prometheus rules, so one
Alertmanager routing serves both). A firing alert's ``endsAt`` is ``send time + 4 x resend_interval_s``
(as Prometheus does), so a dead daemon's alerts expire; the active alerts are therefore re-sent every
``resend_interval_s``. A resolve sends ``endsAt`` = the time it cleared.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_triage.alerts.model import (
    ALERT_NAMES,
    LABEL_SEVERITY,
    SOURCE,
    Alert,
    Condition,
    gpu_ranges,
    pod_text,
    rfc3339,
)
from gpu_triage.alerts.sinks.protocol import RenderContext, SinkTraits

ALERTMANAGER_EXPIRY_RESENDS = 4
"""A firing alert's ``endsAt`` lies this many resend intervals after it was sent."""


def alertmanager_payload(
    alerts: Sequence[Alert], *, now: float, resend_interval_s: float, generator_url: str | None = None
) -> list[dict[str, Any]]:
    """The body of ``POST /api/v2/alerts``."""
    out = []
    for a in alerts:
        condition = Condition(a.condition)
        ends = a.ends_at if a.ends_at is not None else now + ALERTMANAGER_EXPIRY_RESENDS * resend_interval_s
        annotations = {
            "summary": a.summary,
            "description": a.description,
            "runbook_url": a.runbook,
            "verdict": a.verdict,
            "onset": rfc3339(a.starts_at),
            "gpu_hours": f"{a.gpu_hours:g}",
            "ranks": ",".join(str(r["rank"]) for r in a.ranks),
            "pids": ",".join(str(r["pid"]) for r in a.ranks if r.get("pid") is not None),
            "pods": ",".join(sorted({pod_text(r) for r in a.ranks} - {""})),
            "gpus": gpu_ranges(a.gpus),
            "signals": ",".join(a.signals),
            "evidence": json.dumps(a.evidence, sort_keys=True, separators=(",", ":")),
            "stacks": str(a.evidence.get("stacks_where") or ""),
            "bundle": a.bundle or "",
        }
        item: dict[str, Any] = {
            "labels": {
                "alertname": ALERT_NAMES[condition],
                "node": a.node,
                "training_job": a.job,
                "condition": a.condition,
                "severity": LABEL_SEVERITY[condition],
                "service": SOURCE,
            },
            "annotations": {k: v for k, v in annotations.items() if v != ""},
            "startsAt": rfc3339(min(a.starts_at, ends)),
            "endsAt": rfc3339(ends),
        }
        if generator_url:
            item["generatorURL"] = generator_url
        out.append(item)
    return out


ALERTMANAGER_TRAITS = SinkTraits(resends_active=True, endpoint_path="/api/v2/alerts")


@dataclass(frozen=True, slots=True)
class Alertmanager:
    name: str = "alertmanager"
    traits: SinkTraits = ALERTMANAGER_TRAITS

    def payload(self, alert: Alert, context: RenderContext) -> Any:
        return alertmanager_payload(
            [alert],
            now=context.now,
            resend_interval_s=context.resend_interval_s,
            generator_url=context.generator_url,
        )
