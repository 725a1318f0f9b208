"""The durable alert outbox: one worker thread per sink, HTTP POST with timeouts, retries with
exponential backoff and jitter, surviving restarts through the event store's ``outbox`` table.

- :meth:`Delivery.enqueue` (called by the loop) writes one outbox row per sink
  (:meth:`EventStore.outbox_put`: a small SQLite insert) and wakes the workers; it never waits for the
  network. If the store cannot take the row, the delivery is kept in memory instead (it then does not
  survive a restart, and says so in the log).
- Each sink has its own worker thread, so a receiver that hangs only delays its own deliveries (each
  POST is bounded by the sink's ``timeout_s``).
- Per sink, rows go out strictly in the order they were queued (oldest first, the next only after the
  previous one was delivered or given up): a resolve can never overtake its trigger.
- A failed POST (connection refused, timeout, any HTTP error) is retried after
  ``min(retry_max_s, retry_initial_s x 2^attempts)`` scaled by a random factor in [0.5, 1] (jitter, so
  many daemons do not hammer a receiver that comes back in step). Only HTTP 400, 413 and 422 - the
  receiver refuses this very body - drop the row (an ``alert`` event records it): a wrong URL or key
  (401, 403, 404) is retried, so the queued alerts go out once the configuration is fixed. Redirects are
  not followed (a POST must not turn into a GET elsewhere).
- Rows of a daemon that stopped are delivered by the next one on the same state directory.

Secrets (PagerDuty routing key, Slack URL) are read with :func:`gpu_triage.config.secrets.load_secret` when a
sink first posts and never stored in the outbox, logged or put in events; errors name the sink, never
its URL. Time comes from an injectable ``clock`` (epoch seconds), so a five-minute outage can be played
on a fake clock; the workers re-read it at least every ``poll_interval_s`` of real time.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_triage.alerts.config import AlertsConfig, SinkConfig
from gpu_triage.alerts.model import ALERT_NAMES, Alert
from gpu_triage.alerts.registry import sink_kind
from gpu_triage.alerts.sinks.protocol import RenderContext
from gpu_triage.config.secrets import ConfigError, load_secret
from gpu_triage.journal import logs
from gpu_triage.journal.eventstore import EventStore, OutboxItem, StoreError

log = logging.getLogger(__name__)

Clock = Callable[[], float]
HEAD_ANY_TIME_S = 1e300
"""``outbox_due(HEAD_ANY_TIME_S)`` returns the oldest rows whatever their due time."""
MAX_RESPONSE_BYTES = 64 * 1024
USER_AGENT = "gpu-watchdog"
PERMANENT_STATUSES = frozenset({400, 413, 422})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx is then an HTTPError: retried, never followed


class _AttemptDeadline:
    """Bounds one POST as a whole: when ``timeout_s`` has passed since it began, its sockets are shut
    down (``timeout=`` alone bounds each socket operation, so a receiver dripping a header line every
    1.5 s held a worker for ~45 s with ``timeout_s = 2``)."""

    def __init__(self, timeout_s: float) -> None:
        self.fired = False
        self._conns: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> _AttemptDeadline:
        _ATTEMPT.deadline = self
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        _ATTEMPT.deadline = None

    def track(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conns.append(conn)
            if self.fired:
                _shutdown(conn)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            for conn in self._conns:
                _shutdown(conn)


def _shutdown(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


_ATTEMPT = threading.local()


def _tracked(base: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
    class Tracked(base):  # type: ignore[valid-type, misc]
        def connect(self) -> None:
            super().connect()
            deadline = getattr(_ATTEMPT, "deadline", None)
            if deadline is not None:
                deadline.track(self)

    return Tracked


_HTTPConnection = _tracked(http.client.HTTPConnection)
_HTTPSConnection = _tracked(http.client.HTTPSConnection)


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_HTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


_OPENER = urllib.request.build_opener(_NoRedirect, _HTTPHandler, _HTTPSHandler)


def backoff_s(attempts: int, initial_s: float, max_s: float, rng: random.Random) -> float:
    """Delay before the next try after ``attempts`` failures (>= 1): the doubling delay capped at
    ``max_s``, scaled by a uniform factor in [0.5, 1]."""
    base = min(max_s, initial_s * (2.0 ** min(max(attempts - 1, 0), 60)))
    return base * (0.5 + 0.5 * rng.random())


@dataclass(frozen=True, slots=True)
class PostResult:
    ok: bool
    status: int | None
    """HTTP status, None when no response came (refused, timeout)."""
    permanent: bool
    """True when the receiver refuses this very body (HTTP 400, 413, 422): retrying cannot help."""
    error: str | None
    duration_s: float


def post_json(url: str, body: Any, *, timeout_s: float) -> PostResult:
    """POST ``body`` as JSON; never raises. ``error`` never contains ``url`` (it may be a secret).
    The whole attempt - connect, send, headers, body - ends within about ``timeout_s``."""
    with _AttemptDeadline(timeout_s) as deadline:
        result = _post_json(url, body, timeout_s=timeout_s)
    if deadline.fired:  # even a "response": the sockets were shut mid-way, it may be cut short
        return PostResult(False, None, False, "timed out", result.duration_s)
    return result


def _post_json(url: str, body: Any, *, timeout_s: float) -> PostResult:
    data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
    )
    started = time.monotonic()
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            response.read(MAX_RESPONSE_BYTES)
            status = response.status
        return PostResult(True, status, False, None, time.monotonic() - started)
    except urllib.error.HTTPError as e:
        try:
            detail = e.read(512).decode("utf-8", "replace").strip()
        except OSError:
            detail = ""
        finally:
            e.close()
        permanent = e.code in PERMANENT_STATUSES
        error = f"HTTP {e.code}" + (f": {detail[:200]}" if detail else "")
        return PostResult(False, e.code, permanent, error, time.monotonic() - started)
    except urllib.error.URLError as e:
        reason = e.reason
        text = "timed out" if isinstance(reason, (TimeoutError, socket.timeout)) else str(reason)
        return PostResult(False, None, False, text, time.monotonic() - started)
    except TimeoutError:
        return PostResult(False, None, False, "timed out", time.monotonic() - started)
    except (OSError, ValueError, http.client.HTTPException) as e:
        return PostResult(False, None, False, f"{type(e).__name__}: {e}", time.monotonic() - started)


class SinkSender:
    """Renders an alert for one sink and posts it. Secrets are read on first use and cached."""

    def __init__(self, sink: SinkConfig, alerts: AlertsConfig, *, generator_url: str | None = None) -> None:
        self.sink = sink
        self.alerts = alerts
        self.generator_url = generator_url
        self._url: str | None = sink.url if sink.url_file is None else None
        self._routing_key: str | None = None

    def problems(self) -> list[str]:
        """Configuration problems found by reading the secrets now (empty when the sink can post)."""
        try:
            self._secrets()
        except ConfigError as e:
            return [f"sink {self.sink.name}: {p}" for p in e.problems]
        return []

    def _secrets(self) -> tuple[str, str | None]:
        if self._url is None:
            assert self.sink.url_file is not None
            self._url = load_secret(self.sink.url_file, f"{self.sink.kind} URL")
            if not self._url.startswith(("http://", "https://")):
                self._url = None
                raise ConfigError([f"{self.sink.url_file}: the URL file does not hold an http(s) URL"])
        if sink_kind(self.sink.kind).traits.needs_routing_key and self._routing_key is None:
            assert self.sink.routing_key_file is not None
            self._routing_key = load_secret(self.sink.routing_key_file, "PagerDuty routing key")
        return self._url, self._routing_key

    def post(self, alert: Alert, now: float) -> PostResult:
        try:
            url, routing_key = self._secrets()
            kind = sink_kind(self.sink.kind)
            context = RenderContext(now, self.alerts.resend_interval_s, routing_key, self.generator_url)
            body = kind.payload(alert, context)
        except (ConfigError, ValueError) as e:
            return PostResult(False, None, False, f"sink {self.sink.name}: {e}", 0.0)
        return post_json(kind.traits.endpoint(url), body, timeout_s=self.sink.timeout_s)


@dataclass(slots=True)
class _Sink:
    config: SinkConfig
    sender: SinkSender
    wake: threading.Event
    memory: deque[OutboxItem]
    thread: threading.Thread | None = None


class Delivery:
    """The outbox workers. Thread-safe: the loop enqueues, one thread per sink delivers."""

    def __init__(
        self,
        store: EventStore,
        alerts: AlertsConfig,
        *,
        clock: Clock = time.time,
        rng: random.Random | None = None,
        poll_interval_s: float = 0.5,
        generator_url: str | None = None,
        senders: Mapping[str, SinkSender] | None = None,
    ) -> None:
        self.store = store
        self.alerts = alerts
        self.clock = clock
        self.rng = rng or random.Random()
        self.poll_interval_s = poll_interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._counters: Counter[tuple[str, str]] = Counter()
        self._pending: Counter[tuple[str, str]] = Counter()
        self._memory_ids = 0
        self._sinks: dict[str, _Sink] = {}
        for sink in alerts.sinks:
            sender = (senders or {}).get(sink.name) or SinkSender(sink, alerts, generator_url=generator_url)
            self._sinks[sink.name] = _Sink(sink, sender, threading.Event(), deque())
        self._load_pending()

    # ------------------------------------------------------------------------------------ public

    @property
    def sinks(self) -> tuple[SinkConfig, ...]:
        return tuple(s.config for s in self._sinks.values())

    def problems(self) -> list[str]:
        """Sinks that cannot post now (unreadable or world-readable secret files)."""
        return [p for s in self._sinks.values() for p in s.sender.problems()]

    def start(self) -> None:
        for s in self._sinks.values():
            if s.thread is None:
                s.thread = threading.Thread(
                    target=self._run, args=(s,), name=f"alert-sink-{s.config.name}", daemon=True
                )
                s.thread.start()

    def enqueue(self, alert: Alert, now: float, *, sinks: Sequence[str] | None = None) -> list[str]:
        """Queue ``alert`` for every sink (or the sinks named in ``sinks``); returns the sink names
        queued. Never raises and never touches the network."""
        queued = []
        payload = {"alert": alert.to_dict()}
        for s in self._sinks.values():
            if sinks is not None and s.config.name not in sinks:
                continue
            with self._lock:  # counted before the row exists: a fast worker cannot finish it first
                self._pending[(s.config.name, alert.dedup_key)] += 1
            try:
                self.store.outbox_put(s.config.name, alert.dedup_key, payload, now)
            except (StoreError, ValueError) as e:
                log.warning(
                    "alert outbox: cannot store a delivery to %s (%s); kept in memory", s.config.name, e
                )
                with self._lock:
                    self._memory_ids -= 1
                    s.memory.append(
                        OutboxItem(
                            self._memory_ids, s.config.name, alert.dedup_key, payload, now, now, 0, None
                        )
                    )
            queued.append(s.config.name)
            s.wake.set()
        return queued

    def has_pending(self, sink_name: str, key: str) -> bool:
        with self._lock:
            return self._pending[(sink_name, key)] > 0

    def pending(self) -> int:
        with self._lock:
            return sum(self._pending.values())

    def counters(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counters)

    def wake(self) -> None:
        for s in self._sinks.values():
            s.wake.set()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the workers (a POST in flight is bounded by its sink's timeout). Undelivered rows stay
        in the outbox for the next daemon."""
        self._stop.set()
        self.wake()
        deadline = time.monotonic() + timeout_s
        for s in self._sinks.values():
            if s.thread is not None:
                s.thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            in_memory = sum(len(s.memory) for s in self._sinks.values())
        if in_memory:
            log.error("alert outbox: %d deliveries held only in memory are lost at shutdown", in_memory)

    # ----------------------------------------------------------------------------------- worker

    def _load_pending(self) -> None:
        try:
            rows = self.store.outbox_due(HEAD_ANY_TIME_S, limit=100_000)
        except StoreError as e:
            log.warning("alert outbox: cannot read queued deliveries: %s", e)
            return
        orphans = Counter(r.sink for r in rows if r.sink not in self._sinks)
        for row in rows:
            if row.sink in self._sinks:
                self._pending[(row.sink, row.dedup_key)] += 1
        if orphans:
            log.warning(
                "alert outbox: deliveries queued for sinks no longer configured (kept): %s", dict(orphans)
            )

    def _head(self, s: _Sink) -> OutboxItem | None:
        try:
            rows = self.store.outbox_due(HEAD_ANY_TIME_S, limit=1, sink=s.config.name)
        except Exception as e:  # a closed or broken store (StoreError and others): memory rows only
            log.debug("alert outbox read failed: %s", e)
            rows = []
        if rows:
            return rows[0]
        with self._lock:
            return s.memory[0] if s.memory else None

    def _run(self, s: _Sink) -> None:
        while not self._stop.is_set():
            try:
                item = self._head(s)
                if item is None:
                    s.wake.wait(self.poll_interval_s)
                    s.wake.clear()
                    continue
                now = self.clock()
                if item.next_attempt_s > now:
                    s.wake.wait(min(self.poll_interval_s, item.next_attempt_s - now))
                    s.wake.clear()
                    continue
                self._attempt(s, item, now)
            except Exception:  # the worker must never die
                log.exception("alert outbox worker for %s", s.config.name)
                self._stop.wait(self.poll_interval_s)

    def _attempt(self, s: _Sink, item: OutboxItem, now: float) -> None:
        alert = Alert.from_dict(item.payload["alert"])
        result = s.sender.post(alert, now)
        name = s.config.name
        if result.ok or result.permanent:
            self._finish(s, item)
            outcome = "ok" if result.ok else "rejected"
            with self._lock:
                self._counters[("alert_delivery", outcome)] += 1
            self._event(
                alert,
                now,
                {
                    "event": "delivered" if result.ok else "rejected",
                    "sink": name,
                    "sink_kind": s.config.kind,
                    "attempts": item.attempts + 1,
                    "http_status": result.status,
                    "queued_s": round(now - item.created_s, 3),
                    **({"error": result.error} if result.error else {}),
                },
            )
            if not result.ok:
                log.error("alert to %s rejected for good (%s): %s", name, result.error, alert.dedup_key)
            return
        attempts = item.attempts + 1
        delay = backoff_s(attempts, self.alerts.retry_initial_s, self.alerts.retry_max_s, self.rng)
        error = result.error or "failed"
        self._retry(s, item, now + delay, error)
        with self._lock:
            self._counters[("alert_delivery", "retry")] += 1
        if attempts == 1:
            log.warning("alert to %s failed (%s); retrying with backoff", name, error)
            self._event(
                alert,
                now,
                {
                    "event": "retrying",
                    "sink": name,
                    "sink_kind": s.config.kind,
                    "error": error,
                    "next_attempt_s": round(delay, 3),
                },
            )

    def _finish(self, s: _Sink, item: OutboxItem) -> None:
        if item.id < 0:
            with self._lock:
                if s.memory and s.memory[0].id == item.id:
                    s.memory.popleft()
        else:
            try:
                self.store.outbox_done(item.id)
            except StoreError as e:
                log.warning("alert outbox: cannot mark %d done: %s", item.id, e)
        with self._lock:
            key = (item.sink, item.dedup_key)
            self._pending[key] -= 1
            if self._pending[key] <= 0:
                del self._pending[key]

    def _retry(self, s: _Sink, item: OutboxItem, next_attempt_s: float, error: str) -> None:
        if item.id < 0:
            with self._lock:
                if s.memory and s.memory[0].id == item.id:
                    s.memory[0] = OutboxItem(
                        item.id,
                        item.sink,
                        item.dedup_key,
                        item.payload,
                        item.created_s,
                        next_attempt_s,
                        item.attempts + 1,
                        error,
                    )
            return
        try:
            self.store.outbox_retry(item.id, next_attempt_s, error)
        except StoreError as e:
            log.warning("alert outbox: cannot reschedule %d: %s", item.id, e)
            self._stop.wait(self.poll_interval_s)

    def _event(self, alert: Alert, now: float, payload: dict[str, Any]) -> None:
        payload = {
            **payload,
            "dedup_key": alert.dedup_key,
            "condition": alert.condition,
            "status": alert.status,
        }
        with contextlib.suppress(StoreError):
            self.store.append("alert", payload, time_s=now, job=alert.job)
        logs.EVENTS.delivery(
            ALERT_NAMES.get(alert.condition, alert.condition),  # type: ignore[call-overload]
            alert.job,
            alert.status,
            str(payload.get("event")),
            **{
                k: payload[k]
                for k in ("sink", "sink_kind", "http_status", "attempts", "error")
                if k in payload
            },
            dedup_key=alert.dedup_key,
        )


__all__ = ["Delivery", "PostResult", "SinkSender", "backoff_s", "post_json"]
