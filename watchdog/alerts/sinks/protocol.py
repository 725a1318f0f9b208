"""What a receiver kind is: its name, what its configuration needs, where it posts, what it posts.

A new receiver is one module beside this one with a class implementing :class:`SinkKind`, and one
line in :mod:`gpu_triage.alerts.registry`. The configuration (``[[alerts.sinks]] kind = "..."``), the
delivery worker and the action engine find it there by name; none of them switches on kind strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gpu_triage.alerts.model import Alert


@dataclass(frozen=True, slots=True)
class RenderContext:
    """What a payload may depend on besides the alert."""

    now: float
    resend_interval_s: float
    routing_key: str | None = None
    generator_url: str | None = None


class SinkKind(Protocol):
    """A receiver kind. Payload builders are pure: the secrets come in through the context."""

    @property
    def name(self) -> str:
        """The ``kind`` in ``[[alerts.sinks]]``."""
        ...

    @property
    def needs_routing_key(self) -> bool:
        """True when the sink needs ``routing_key_file`` (a secret kept out of the event store)."""
        ...

    @property
    def default_url(self) -> str | None:
        """The URL used when the sink names neither ``url`` nor ``url_file`` (None: one is required)."""
        ...

    @property
    def resends_active(self) -> bool:
        """True for receivers that expire alerts unless the active ones are re-sent (Alertmanager)."""
        ...

    def endpoint(self, url: str) -> str:
        """Where the POST goes, from the configured URL."""
        ...

    def payload(self, alert: Alert, context: RenderContext) -> Any:
        """The JSON body for one alert (firing or resolved)."""
        ...
