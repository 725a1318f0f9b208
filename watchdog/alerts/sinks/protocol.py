"""What a receiver kind is: its name and what it posts (the one thing a sink does), and as data what its
configuration needs and where it posts (:class:`SinkTraits`).

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


@dataclass(frozen=True, slots=True)
class SinkTraits:
    """What a receiver asks of its configuration and of delivery: data, no code."""

    needs_routing_key: bool = False
    """The sink needs ``routing_key_file`` (a secret kept out of the event store)."""
    default_url: str | None = None
    """The URL used when the sink names neither ``url`` nor ``url_file`` (None: one is required)."""
    resends_active: bool = False
    """The receiver expires alerts unless the active ones are re-sent (Alertmanager)."""
    endpoint_path: str | None = None
    """Appended to the configured URL unless it already ends with it (``/api/v2/alerts``)."""

    def endpoint(self, url: str) -> str:
        """Where the POST goes, from the configured URL."""
        if self.endpoint_path is None:
            return url
        base = url.rstrip("/")
        return base if base.endswith(self.endpoint_path) else f"{base}{self.endpoint_path}"


class SinkKind(Protocol):
    """A receiver kind: what a sink must do is render an alert; the rest is data (:class:`SinkTraits`).
    Payload builders are pure: the secrets come in through the context."""

    @property
    def name(self) -> str:
        """The ``kind`` in ``[[alerts.sinks]]``."""
        ...

    @property
    def traits(self) -> SinkTraits: ...

    def payload(self, alert: Alert, context: RenderContext) -> Any:
        """The JSON body for one alert (firing or resolved)."""
        ...
