"""Read other nodes' facts about a job from Prometheus, off the cycle thread, only while it matters.

The loop calls :meth:`FleetPoller.request` each process cycle for each job whose world is larger than
its ranks on this node, saying whether the job is suspicious; a query starts (one worker thread, one
query at a time) only for a suspicious job and at most every ``min_interval_s`` per job.
:meth:`FleetPoller.latest` hands back the last answer (or the last error) without blocking: the
cycle never waits for Prometheus. Each query is bounded by the client's deadline and size cap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpu_triage.signals.fleet.config import ClusterConfig
from gpu_triage.signals.fleet.prom_client import PromClient, PromError
from gpu_triage.signals.fleet.remote import RemoteFacts, job_query, remote_facts

log = logging.getLogger("gpu_watchdog.fleet")


class FleetPoller:
    def __init__(
        self,
        config: ClusterConfig,
        *,
        node: str = "localhost",
        clock: Callable[[], float] = time.time,
        client: PromClient | None = None,
    ) -> None:
        self.config = config
        self.node = node
        self.clock = clock
        self._client = client
        if self._client is None and config.prometheus_url:
            self._client = PromClient(
                config.prometheus_url, timeout_s=config.timeout_s, max_bytes=config.max_response_bytes
            )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[str] = []
        self._last_request: dict[str, float] = {}
        self._latest: dict[str, RemoteFacts] = {}
        self._closed = False
        self._busy = False
        self._thread: threading.Thread | None = None
        self.queries_total = 0
        self.errors_total = 0
        self.last_query_s = 0.0
        self.last_error: str | None = None

    @property
    def enabled(self) -> bool:
        return self._client is not None

    def request(self, now: float, job: str, suspicious: bool) -> bool:
        """Queue a query for ``job`` when suspicious and due; True when one was queued."""
        if self._client is None or not suspicious:
            return False
        with self._lock:
            last = self._last_request.get(job)
            if job in self._queue or (last is not None and now - last < self.config.min_interval_s):
                return False
            self._last_request[job] = now
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fleet-prometheus", daemon=True)
                self._thread.start()
            self._wake.notify()
        return True

    def latest(self, job: str) -> RemoteFacts | None:
        with self._lock:
            return self._latest.get(job)

    def forget(self, jobs: set[str]) -> None:
        """Drop what is kept for jobs no longer on this node."""
        with self._lock:
            for gone in set(self._latest) - jobs:
                del self._latest[gone]
            for gone in set(self._last_request) - jobs:
                del self._last_request[gone]

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                job = self._queue.pop(0)
                self._busy = True
            try:
                self._query(job)
            finally:
                with self._lock:
                    self._busy = False

    def _query(self, job: str) -> None:
        assert self._client is not None
        t0 = time.monotonic()
        try:
            result = self._client.query(job_query(job))
            facts = remote_facts(
                job,
                result.samples,
                own_node=self.node,
                asked_at=self.clock(),
                query_s=result.seconds,
                size=result.bytes,
            )
            error = None
        except PromError as e:
            facts = RemoteFacts(job, self.clock(), error=str(e), query_s=time.monotonic() - t0)
            error = str(e)
        except Exception as e:  # the poller never dies: an unexpected failure is an unknown answer
            log.exception("fleet query for %s failed", job)
            facts = RemoteFacts(job, self.clock(), error=f"{type(e).__name__}: {e}"[:300])
            error = facts.error
        with self._lock:
            self.queries_total += 1
            self.last_query_s = time.monotonic() - t0
            if error is not None:
                if error != self.last_error:
                    log.warning("Prometheus query for job %s: %s (per-node judgment)", job, error)
                self.errors_total += 1
            self.last_error = error
            self._latest[job] = facts

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Tests: wait until the queue is empty and no query runs."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                busy = bool(self._queue) or self._busy
            if not busy:
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        if self._client is not None:
            self._client.close()

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "prometheus_url": self.config.prometheus_url,
                "node": self.node,
                "min_interval_s": self.config.min_interval_s,
                "queries_total": self.queries_total,
                "errors_total": self.errors_total,
                "last_query_s": round(self.last_query_s, 4),
                "last_error": self.last_error,
            }


__all__ = ["FleetPoller"]
