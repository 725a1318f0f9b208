"""Poll NCCL's RAS service rarely, only while a job is under suspicion, off the cycle thread.

Polling RAS has crashed jobs (NCCL's own issue tracker), so the poller is conservative: nothing is
sent unless the loop reports a suspicion, never more often than ``min_interval_s`` (60 s), one query
at a time, each under ``timeout_s`` (the client's overall deadline). A refused connection is
``absent`` (no NCCL job, NCCL < 2.24, ``NCCL_RAS_ENABLE=0``): normal, not an error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_triage.model.config_checks import boolean, integer, nonempty_text, number
from gpu_triage.model.config_schema import setting
from gpu_triage.signals.nccl_ras import client as ras
from gpu_triage.signals.nccl_ras.ras_facts import RasFacts, RasPoll, parse_report, ras_facts


@dataclass(frozen=True, slots=True)
class RasConfig:
    """NCCL RAS as live evidence: polled rarely, only while a job is under suspicion."""

    enabled: bool = setting(True, parse=boolean, doc="poll NCCL's RAS service on suspicion")
    host: str = setting(ras.DEFAULT_HOST, parse=nonempty_text, doc="RAS address (NCCL_RAS_ADDR)")
    port: int = setting(ras.DEFAULT_PORT, parse=integer(1, 65535), doc="RAS port")
    min_interval_s: float = setting(60.0, parse=number(10, 86400), doc="at most one poll this often")
    timeout_s: float = setting(5.0, parse=number(0.5, 60), doc="limit of one poll")


class RasPoller:
    def __init__(self, config: RasConfig = RasConfig(), *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self._lock = threading.Lock()
        self._last_request: float | None = None
        self._in_flight = False
        self._latest: RasPoll | None = None
        self._first_same: RasPoll | None = None
        self.polls_total = 0

    def request(self, now: float, suspicious: bool) -> bool:
        """Start a poll if a job is suspicious and the rate limit allows; True when one started."""
        if not self.config.enabled or not suspicious:
            return False
        with self._lock:
            if self._in_flight:
                return False
            if self._last_request is not None and now - self._last_request < self.config.min_interval_s:
                return False
            self._last_request, self._in_flight = now, True
        threading.Thread(target=self._poll, name="nccl-ras", daemon=True).start()
        return True

    def _poll(self) -> None:
        try:
            cfg = self.config
            report = ras.query_status(cfg.host, cfg.port, timeout_s=cfg.timeout_s)
            poll = parse_report(self.clock(), report.status, report.data, report.summary, report.error)
            with self._lock:
                self.polls_total += 1
                prev = self._latest
                same = (
                    prev is not None and prev.status == poll.status == "ok" and prev.counts() == poll.counts()
                )
                self._first_same = self._first_same if same else poll
                self._latest = poll
        finally:
            with self._lock:
                self._in_flight = False

    def facts(self, pids: set[int]) -> RasFacts | None:
        with self._lock:
            return ras_facts(self._first_same, self._latest, pids)

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if not self._in_flight:
                    return True
            time.sleep(0.01)
        return False

    def status(self) -> dict[str, Any]:
        with self._lock:
            latest = self._latest
        return {
            "enabled": self.config.enabled,
            "address": f"{self.config.host}:{self.config.port}",
            "min_interval_s": self.config.min_interval_s,
            "polls_total": self.polls_total,
            "last_status": latest.status if latest is not None else None,
            "last_poll_at": latest.at if latest is not None else None,
        }


__all__ = ["RasConfig", "RasPoller"]
