"""Slack incoming webhook: ``{text, blocks}`` (``text`` is the notification fallback). The webhook URL
is a secret: configure it with ``url_file``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_triage.alerts.model import Alert, gpu_ranges, rfc3339, truncate
from gpu_triage.alerts.sinks.protocol import RenderContext, SinkTraits

SLACK_SECTION_MAX = 2900
"""Slack limits a section's text to 3000 characters."""


def slack_payload(alert: Alert) -> dict[str, Any]:
    """An incoming-webhook message: ``text`` (notification fallback) and ``blocks``."""
    icon = ":rotating_light:" if alert.firing else ":white_check_mark:"
    text = f"{icon} [{alert.severity}] {alert.summary}"
    fields = [
        f"*Node*\n{alert.node}",
        f"*Job*\n{alert.job}",
        f"*Verdict*\n{alert.verdict}",
        f"*Since*\n{rfc3339(alert.starts_at)}",
        f"*Ranks*\n{', '.join(str(r['rank']) for r in alert.ranks) or '-'}",
        f"*GPUs*\n{gpu_ranges(alert.gpus) or '-'}",
        f"*GPU-hours burned*\n{alert.gpu_hours:g}",
        f"*Signals*\n{', '.join(alert.signals) or '-'}",
    ]
    context = f"Runbook: {alert.runbook}"
    if alert.bundle:
        context += f" | Evidence: {alert.bundle}"
    return {
        "text": truncate(text, SLACK_SECTION_MAX),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": truncate(text, SLACK_SECTION_MAX)}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": truncate(f, 1900)} for f in fields]},
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": truncate(context, SLACK_SECTION_MAX)}],
            },
        ],
    }


SLACK_TRAITS = SinkTraits()


@dataclass(frozen=True, slots=True)
class Slack:
    name: str = "slack"
    traits: SinkTraits = SLACK_TRAITS

    def payload(self, alert: Alert, context: RenderContext) -> Any:
        return slack_payload(alert)
