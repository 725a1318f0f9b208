"""The alert book: the alerts that are firing, the pages, escalations, resends and resolves, and the
silences applied on the way.

Firing alerts are persisted in ``actions.active_alerts``; the ones a previous daemon left are held in
*limbo* until their job comes back with the same condition (adopted without paging twice) or
``adopt_window_s`` runs out (resolved).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_triage.actions.config import ActionsConfig
from gpu_triage.actions.delivery import Delivery
from gpu_triage.actions.episode import Episode
from gpu_triage.actions.ladder import next_step_text
from gpu_triage.actions.records import KV_ACTIVE, KvState, Records
from gpu_triage.actions.turn import JobTurn
from gpu_triage.alerts.config import AlertsConfig
from gpu_triage.alerts.model import Alert, build_alert, gpu_hours, resolve
from gpu_triage.alerts.registry import sink_kind
from gpu_triage.model.actions import Action, Result
from gpu_triage.model.snapshot import GpuStatus, JobStatus
from gpu_triage.model.states import Mode

log = logging.getLogger("gpu_triage.actions.engine")


@dataclass(slots=True)
class ActiveAlert:
    alert: Alert
    job: str
    delivered: bool
    """Queued to the sinks (False: the engine had no sink)."""
    last_sent: float


class AlertBook:
    """Pages and resolves through :class:`~gpu_triage.actions.delivery.Delivery`."""

    def __init__(
        self,
        *,
        delivery: Delivery,
        alerts: AlertsConfig,
        actions: ActionsConfig,
        kv: KvState,
        node: str,
        count: Callable[[Action, Result], None],
    ) -> None:
        self.delivery = delivery
        self.alerts = alerts
        self.actions = actions
        self.node = node
        self._kv = kv
        self._count = count
        self._active: dict[str, ActiveAlert] = {}
        self._limbo: dict[str, Alert] = {}
        self._limbo_until: float | None = None
        self._next_resend: float | None = None
        self._am_sinks = tuple(s.name for s in alerts.sinks if sink_kind(s.kind).traits.resends_active)
        persisted = kv.get(KV_ACTIVE, {})
        for key, value in (persisted if isinstance(persisted, dict) else {}).items():
            try:
                self._limbo[key] = Alert.from_dict(value)
            except (TypeError, ValueError) as e:
                log.warning("dropping unreadable persisted alert %s: %s", key, e)

    def start(self, now: float, adopt_window_s: float) -> None:
        """The first cycle: the previous daemon's alerts wait ``adopt_window_s`` for their job."""
        self._limbo_until = now + adopt_window_s if self._limbo else None
        if self._limbo:
            self._next_resend = now

    def is_active(self, key: str | None) -> bool:
        return key is not None and key in self._active

    # ------------------------------------------------------------------------------ adoption

    def adopt_resumed(self, ep: Episode, now: float, records: Records) -> None:
        """A resumed episode takes its alert back from limbo, or forgets an alert no longer firing."""
        if ep.alert_key is not None and ep.alert_key in self._limbo:
            self._active[ep.alert_key] = ActiveAlert(self._limbo.pop(ep.alert_key), ep.job, True, now)
            records.add(now, Action.ALERT, Result.ADOPTED, job=ep.job, dedup_key=ep.alert_key)
        elif ep.alert_key is not None and ep.alert_key not in self._active:
            ep.alert_key, ep.alerted_verdict = None, None

    def adopt_matching(self, ep: Episode, now: float, records: Records) -> None:
        """A new episode adopts the limbo alert of its job and condition (no second page)."""
        for key, alert in list(self._limbo.items()):
            if alert.job == ep.job and alert.condition == str(ep.alert_condition):
                del self._limbo[key]
                self._active[key] = ActiveAlert(alert, ep.job, True, now)
                ep.alert_key, ep.alerted_verdict = key, alert.verdict
                records.add(now, Action.ALERT, Result.ADOPTED, job=ep.job, dedup_key=key)

    # -------------------------------------------------------------------------------- paging

    def page(self, turn: JobTurn, escalation: bool) -> None:
        """The alert rung: page (or escalate) unless a silence matches."""
        ep, job, now, records = turn.ep, turn.job, turn.now, turn.records
        labels = {"node": self.node, "job": job.job, "verdict": str(job.verdict)}
        silence = turn.cycle.silences.silenced_by(labels, now)
        if silence is not None:
            if ep.once_only(f"silenced:{silence.id}:{job.verdict}"):
                records.add(
                    now,
                    Action.ALERT,
                    Result.SILENCED,
                    job=job.job,
                    verdict=str(job.verdict),
                    silence=silence.id,
                    comment=silence.comment,
                )
            return
        alert = self.build(ep, job, now, turn.mode, turn.cycle.gpus)
        self.send(alert, ep.job, now, records, Result.UPDATED if escalation else Result.QUEUED)
        ep.alert_key, ep.alerted_verdict = alert.dedup_key, str(job.verdict)

    def update_after_kill(
        self, ep: Episode | None, now: float, mode: Mode, kill: Mapping[str, Any], records: Records
    ) -> None:
        """Tell the sinks what the kill rung did (an ``updated`` alert)."""
        if ep is None or not self.is_active(ep.alert_key):
            return
        alert = self.build(ep, ep.last, now, mode, ep.gpus, kill=kill)
        self.send(alert, ep.job, now, records, Result.UPDATED)

    def build(
        self,
        ep: Episode,
        job: JobStatus,
        now: float,
        mode: Mode,
        gpus: Sequence[GpuStatus] = (),
        kill: Mapping[str, Any] | None = None,
    ) -> Alert:
        notes: dict[str, Any] = {"mode": str(mode), "next": next_step_text(ep, mode, self.actions)}
        if ep.capture_state:
            notes["capture"] = str(ep.capture_state)
        if ep.signature:
            notes |= {"signature": ep.signature, "sightings": ep.sightings}
        if kill:
            notes["kill"] = dict(kill)
        return build_alert(
            job,
            node=self.node,
            condition=ep.alert_condition,
            now=now,
            first_seen=ep.first_seen,
            gpus=gpus,
            runbook_base=self.alerts.runbook_url,
            bundle=ep.capture_path,
            actions=notes,
        )

    def send(self, alert: Alert, job: str, now: float, records: Records, result: Result) -> None:
        queued = self.delivery.enqueue(alert, now)
        self._active[alert.dedup_key] = ActiveAlert(alert, job, bool(queued), now)
        if self._next_resend is None and self._am_sinks:
            self._next_resend = now + self.alerts.resend_interval_s
        self._persist(now)
        records.add(
            now,
            Action.ALERT,
            result if queued else Result.NO_SINKS,
            job=job,
            dedup_key=alert.dedup_key,
            condition=alert.condition,
            verdict=alert.verdict,
            severity=alert.severity,
            sinks=queued,
            summary=alert.summary,
            bundle=alert.bundle,
            gpu_hours=alert.gpu_hours,
        )

    # ------------------------------------------------------------------------------ resolving

    def resolve_episode(self, ep: Episode, now: float, reason: str, records: Records) -> None:
        if ep.alert_key is not None and ep.alert_key in self._active:
            self.resolve(ep.alert_key, now, reason, records)

    def resolve(self, key: str, now: float, reason: str, records: Records) -> None:
        active = self._active.pop(key)
        resolved = resolve(active.alert, now, reason)
        queued = self.delivery.enqueue(resolved, now) if active.delivered else []
        self._persist(now)
        records.add(
            now,
            Action.RESOLVE,
            Result.QUEUED if queued else Result.NO_SINKS,
            job=active.job,
            dedup_key=key,
            condition=resolved.condition,
            reason=reason,
            sinks=queued,
        )

    # ---------------------------------------------------------------------------- each cycle

    def tick(self, now: float, records: Records) -> None:
        """Resend what is due; resolve the limbo alerts whose adoption window ran out."""
        if self._next_resend is not None and now >= self._next_resend:
            self._resend(now)
        if self._limbo_until is not None and now >= self._limbo_until:
            self._expire_limbo(now, records)

    def _resend(self, now: float) -> None:
        """Re-send firing alerts to Alertmanager sinks that have nothing queued for them already."""
        self._next_resend = now + self.alerts.resend_interval_s if (self._active or self._limbo) else None
        if not self._am_sinks:
            self._next_resend = None
            return
        firing = [(a.alert, a.job) for a in self._active.values() if a.delivered] + [
            (alert, alert.job) for alert in self._limbo.values()
        ]
        for alert, _job in firing:
            if alert.dedup_key in self._active:
                alert = dataclasses.replace(
                    alert, time=now, gpu_hours=gpu_hours(len(alert.gpus), alert.starts_at, now)
                )
                self._active[alert.dedup_key].alert = alert
            sinks = [s for s in self._am_sinks if not self.delivery.has_pending(s, alert.dedup_key)]
            if sinks:
                self.delivery.enqueue(alert, now, sinks=sinks)
                self._count(Action.ALERT_RESEND, Result.QUEUED)

    def _expire_limbo(self, now: float, records: Records) -> None:
        self._limbo_until = None
        for key, alert in list(self._limbo.items()):
            del self._limbo[key]
            self._active[key] = ActiveAlert(alert, alert.job, True, now)
            self.resolve(key, now, "cleared while the watchdog was restarting", records)

    def _persist(self, now: float) -> None:
        value = {k: a.alert.to_dict() for k, a in self._active.items() if a.delivered}
        value |= {k: alert.to_dict() for k, alert in self._limbo.items()}
        self._kv.set(KV_ACTIVE, value, now)


__all__ = ["ActiveAlert", "AlertBook"]
