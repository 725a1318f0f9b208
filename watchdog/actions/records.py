"""What one engine cycle records (:class:`Records`) and the engine's durable state (:class:`KvState`).

A record is the dict the event store, the logs and ``/status`` already know: ``{time, node, action,
result, ...details}``; its action and result are given as :class:`~gpu_triage.model.actions.Action`
and :class:`~gpu_triage.model.actions.Result` members and stored as their plain string values.
"""

from __future__ import annotations

import logging
from typing import Any

from gpu_triage.journal.eventstore import EventStore, StoreError
from gpu_triage.model.actions import Action, Result

log = logging.getLogger("gpu_triage.actions.engine")

#: The kv keys of the engine's durable state (a restarted daemon reads them back; never rename one).
KV_ACTIVE = "actions.active_alerts"
KV_KILLS = "actions.kill_times"
KV_SIGNATURES = "actions.hang_signatures"
KV_EPISODES = "actions.episodes"
KV_CAPTURES = "actions.last_capture"
KV_KILLS_IN_PROGRESS = "actions.kills_in_progress"


class Records:
    """The records of one cycle, in order."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.items: list[dict[str, Any]] = []

    def add(self, now: float, action: Action, result: Result, **details: Any) -> None:
        record = {"time": now, "node": self.node, "action": action.value, "result": result.value}
        self.items.append(record | details)

    def __bool__(self) -> bool:
        return bool(self.items)


class KvState:
    """The event store's kv table; a failing store is logged, never raised."""

    def __init__(self, store: EventStore) -> None:
        self.store = store

    def get(self, key: str, default: Any) -> Any:
        try:
            return self.store.kv_get(key, default)
        except (StoreError, ValueError) as e:
            log.warning("cannot read %s from the event store: %s", key, e)
            return default

    def set(self, key: str, value: Any, now: float) -> None:
        try:
            self.store.kv_set(key, value, now)
        except (StoreError, ValueError) as e:
            log.warning("cannot persist %s: %s", key, e)


__all__ = [
    "KV_ACTIVE",
    "KV_CAPTURES",
    "KV_EPISODES",
    "KV_KILLS",
    "KV_KILLS_IN_PROGRESS",
    "KV_SIGNATURES",
    "KvState",
    "Records",
]
