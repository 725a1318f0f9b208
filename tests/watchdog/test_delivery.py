"""The durable alert outbox against real HTTP receivers on loopback (and a real Alertmanager).

Receivers are ``http.server`` servers in threads: one that answers, one whose port is closed, one that
answers 500 before recovering, one that never answers. Retry delays run on a fake clock the workers
read, so backoff is checked exactly and a long outage takes no real time.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.actions.delivery import Delivery, backoff_s
from gpu_triage.alerts.model import Alert, Condition, build_alert, resolve
from gpu_triage.daemon.config import AlertsConfig, SinkConfig
from gpu_triage.journal.eventstore import EventStore
from tests.conftest import require_binary
from tests.watchdog.snapshots import T0
from tests.watchdog.test_alerts import make_job

# --------------------------------------------------------------------------------------------------
# Helpers shared with test_action_engine.py


class FakeClock:
    """Epoch seconds that move only when told (thread-safe reads)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    time: float


class Receiver:
    """A real HTTP server on 127.0.0.1. ``statuses``: answers for the first requests (then
    ``default_status``); ``hang``: never answer until stopped."""

    def __init__(
        self,
        *,
        port: int = 0,
        statuses: list[int] | None = None,
        default_status: int = 200,
        hang: bool = False,
    ) -> None:
        self.requests: list[Received] = []
        self.statuses = deque(statuses or [])
        self.default_status = default_status
        self.hang = hang
        self._release = threading.Event()
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if receiver.hang:
                    receiver._release.wait(30)
                    return
                with receiver._cond:
                    status = receiver.statuses.popleft() if receiver.statuses else receiver.default_status
                    if 200 <= status < 300:
                        receiver.requests.append(
                            Received(self.path, dict(self.headers), json.loads(raw), time.monotonic())
                        )
                    receiver._cond.notify_all()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"status":"success"}' if status < 300 else b'{"error":"nope"}')

            def log_message(self, format: str, *args: Any) -> None:
                pass

        release_port(port)
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_for(self, n: int, timeout_s: float = 5.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return list(self.requests)

    def stop(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def receiver(**kw: Any) -> Iterator[Receiver]:
    r = Receiver(**kw)
    try:
        yield r
    finally:
        r.stop()


_HELD: dict[int, socket.socket] = {}


def free_port() -> int:
    """A port where a receiver is down: bound but not listening, so connections are refused and no
    other process (the machine is shared) nor an outgoing connection's ephemeral port can take it, until
    :func:`release_port` (a :class:`Receiver` on that port calls it)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    _HELD[port] = s
    return port


def release_port(port: int) -> None:
    held = _HELD.pop(port, None)
    if held is not None:
        held.close()


def secret_file(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    os.chmod(path, 0o600)
    return path


def wait_until(check: Callable[[], Any], timeout_s: float = 5.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def sample_alert(now: float = T0, node: str = "node-a") -> Alert:
    return build_alert(make_job(), node=node, condition=Condition.DEADLOCK, now=now, first_seen=now - 30.0)


# --------------------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    s = EventStore(tmp_path / "state", T0)
    yield s
    s.close()


def _delivery(store: EventStore, sinks: list[SinkConfig], clock: FakeClock, **alerts_kw: Any) -> Delivery:
    alerts = AlertsConfig(sinks=tuple(sinks), **alerts_kw)
    d = Delivery(store, alerts, clock=clock, rng=random.Random(7), poll_interval_s=0.02)
    d.start()
    return d


def test_backoff_doubles_to_the_cap_with_jitter() -> None:
    rng = random.Random(1)
    for attempts, base in [(1, 1.0), (2, 2.0), (3, 4.0), (9, 256.0), (10, 300.0), (500, 300.0)]:
        for _ in range(50):
            delay = backoff_s(attempts, 1.0, 300.0, rng)
            assert base * 0.5 <= delay <= base
    delays = {round(backoff_s(3, 1.0, 300.0, rng), 6) for _ in range(20)}
    assert len(delays) > 10  # jittered, not lock-step


def test_every_sink_kind_receives_its_payload(tmp_path: Path, store: EventStore) -> None:
    clock = FakeClock()
    with receiver() as am, receiver(default_status=202) as pd, receiver() as slack, receiver() as hook:
        sinks = [
            SinkConfig(kind="alertmanager", name="am", url=am.url),
            SinkConfig(
                kind="pagerduty",
                name="pd",
                url=f"{pd.url}/v2/enqueue",
                routing_key_file=secret_file(tmp_path / "pd.key", "R0UTING-KEY"),
            ),
            SinkConfig(
                kind="slack",
                name="slack",
                url_file=secret_file(tmp_path / "slack.url", f"{slack.url}/services/T0/B0/SECRET"),
            ),
            SinkConfig(kind="webhook", name="hook", url=f"{hook.url}/hook"),
        ]
        d = _delivery(store, sinks, clock)
        try:
            assert d.problems() == []
            alert = sample_alert()
            assert d.enqueue(alert, T0) == ["am", "pd", "slack", "hook"]
            gone = resolve(alert, T0 + 90.0, "verdict is now healthy")
            clock.advance(90.0)
            d.enqueue(gone, clock())
            for r in (am, pd, slack, hook):
                assert len(r.wait_for(2)) == 2
        finally:
            d.close()
        fire, clear = am.requests
        assert fire.path == clear.path == "/api/v2/alerts"
        assert fire.headers["Content-Type"] == "application/json"
        assert fire.body[0]["labels"]["alertname"] == "GpuTrainingDeadlock"
        assert fire.body[0]["labels"]["node"] == "node-a"
        assert fire.body[0]["annotations"]["summary"] == alert.summary
        assert fire.body[0]["startsAt"] == "2025-12-02T11:50:00.000Z"  # the onset
        assert fire.body[0]["endsAt"] > "2025-12-02T12:00:00"  # firing: ends in the future
        assert clear.body[0]["endsAt"] == "2025-12-02T12:01:30.000Z"  # resolved when it cleared
        trigger, resolved = pd.requests
        assert trigger.path == "/v2/enqueue"
        assert trigger.body["routing_key"] == "R0UTING-KEY"
        assert trigger.body["event_action"] == "trigger"
        assert trigger.body["dedup_key"] == "node-a:qwen3-32b-ft:deadlock"
        assert len(trigger.body["payload"]["summary"]) <= 1024
        assert trigger.body["payload"]["severity"] == "critical"
        assert resolved.body == {
            "routing_key": "R0UTING-KEY",
            "event_action": "resolve",
            "dedup_key": "node-a:qwen3-32b-ft:deadlock",
        }
        assert slack.requests[0].path == "/services/T0/B0/SECRET"
        assert "qwen3-32b-ft" in slack.requests[0].body["text"]
        assert slack.requests[0].body["blocks"]
        assert hook.requests[0].body["status"] == "firing" and hook.requests[1].body["status"] == "resolved"
        assert store.outbox_size() == 0
        assert d.counters()[("alert_delivery", "ok")] == 8
        events = [e.payload for e in store.since(0, 100) if e.kind == "alert"]
        assert sum(e["event"] == "delivered" for e in events) == 8
        stored = json.dumps([e.payload for e in store.since(0, 1000)])
        assert "SECRET" not in stored and "R0UTING-KEY" not in stored  # secrets never reach the store


def test_down_receiver_retries_with_backoff_then_delivers_in_order(store: EventStore) -> None:
    clock = FakeClock()
    port = free_port()
    d = _delivery(
        store,
        [SinkConfig(kind="alertmanager", name="am", url=f"http://127.0.0.1:{port}")],
        clock,
        retry_initial_s=2.0,
        retry_max_s=60.0,
    )
    try:
        alert = sample_alert()
        d.enqueue(alert, T0)
        d.enqueue(resolve(alert, T0, "healthy"), T0)
        row = wait_until(
            lambda: [r for r in store.outbox_due(1e300) if r.attempts == 1], what="a first failure"
        )[0]
        assert "refused" in (row.last_error or "").lower()
        assert T0 + 1.0 <= row.next_attempt_s <= T0 + 2.0  # 2 s x jitter in [0.5, 1]
        assert store.outbox_size() == 2  # the resolve waits behind its trigger
        clock.advance(2.0)
        row = wait_until(
            lambda: [r for r in store.outbox_due(1e300) if r.attempts == 2], what="a second failure"
        )[0]
        assert clock() + 2.0 <= row.next_attempt_s <= clock() + 4.0  # doubled
        with receiver(port=port) as am:
            clock.advance(60.0)
            got = am.wait_for(2)
        assert [r.body[0]["endsAt"] == "2025-12-02T12:00:00.000Z" for r in got] == [False, True]
        wait_until(lambda: store.outbox_size() == 0, what="both rows done")
        assert d.counters()[("alert_delivery", "retry")] == 2
    finally:
        d.close()


def test_500_then_recovery(store: EventStore) -> None:
    clock = FakeClock()
    with receiver(statuses=[500, 503]) as hook:
        d = _delivery(store, [SinkConfig(kind="webhook", name="hook", url=hook.url)], clock)
        try:
            d.enqueue(sample_alert(), T0)
            wait_until(lambda: store.outbox_due(1e300)[0].attempts == 1, what="first 500")
            assert store.outbox_due(1e300)[0].last_error.startswith("HTTP 500")
            clock.advance(1.0)
            wait_until(lambda: store.outbox_due(1e300)[0].attempts == 2, what="the 503")
            clock.advance(2.0)
            assert len(hook.wait_for(1)) == 1
            wait_until(lambda: store.outbox_size() == 0, what="row done")
        finally:
            d.close()
    counters = d.counters()
    assert counters[("alert_delivery", "retry")] == 2 and counters[("alert_delivery", "ok")] == 1
    kinds = [e.payload["event"] for e in store.since(0, 100) if e.kind == "alert"]
    assert kinds == ["retrying", "delivered"]


def test_hanging_receiver_only_delays_its_own_sink(store: EventStore) -> None:
    clock = FakeClock()
    with receiver(hang=True) as stuck, receiver() as fine:
        sinks = [
            SinkConfig(kind="webhook", name="stuck", url=stuck.url, timeout_s=0.3),
            SinkConfig(kind="webhook", name="fine", url=fine.url),
        ]
        d = _delivery(store, sinks, clock)
        try:
            started = time.perf_counter()
            for i in range(3):
                d.enqueue(sample_alert(T0 + i), T0)
            assert time.perf_counter() - started < 0.1  # queuing never waits for a receiver
            assert len(fine.wait_for(3, timeout_s=2.0)) == 3
            row = wait_until(
                lambda: [r for r in store.outbox_due(1e300, sink="stuck") if r.attempts >= 1],
                what="the timeout",
            )[0]
            assert row.last_error == "timed out"
            assert len(store.outbox_due(1e300, sink="stuck")) == 3  # nothing lost, nothing reordered
        finally:
            d.close(timeout_s=2.0)


def test_outbox_survives_a_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    port = free_port()
    sinks = (SinkConfig(kind="webhook", name="hook", url=f"http://127.0.0.1:{port}/hook"),)
    first_store = EventStore(tmp_path / "state", T0)
    d = Delivery(first_store, AlertsConfig(sinks=sinks), clock=clock, poll_interval_s=0.02)
    d.start()
    alert = sample_alert()
    d.enqueue(alert, T0)
    wait_until(lambda: first_store.outbox_due(1e300)[0].attempts >= 1, what="a failure")
    d.close()
    first_store.close()  # the daemon is gone; the row is on disk

    second_store = EventStore(tmp_path / "state", T0 + 10)
    try:
        assert second_store.outbox_size() == 1
        with receiver(port=port) as hook:
            d2 = Delivery(second_store, AlertsConfig(sinks=sinks), clock=clock, poll_interval_s=0.02)
            assert d2.has_pending("hook", alert.dedup_key)
            d2.start()
            clock.advance(400.0)
            got = hook.wait_for(1)
            d2.close()
        assert got[0].body["dedup_key"] == alert.dedup_key and got[0].body["time"] == T0
        assert second_store.outbox_size() == 0
        assert not d2.has_pending("hook", alert.dedup_key)
    finally:
        second_store.close()


def test_rejected_body_is_dropped_not_retried_forever(store: EventStore) -> None:
    clock = FakeClock()
    with receiver(default_status=400) as hook:
        d = _delivery(store, [SinkConfig(kind="webhook", name="hook", url=hook.url)], clock)
        try:
            d.enqueue(sample_alert(), T0)
            wait_until(lambda: store.outbox_size() == 0, what="the row dropped")
        finally:
            d.close()
    assert d.counters()[("alert_delivery", "rejected")] == 1
    event = [e for e in store.since(0, 100) if e.kind == "alert"][-1]
    assert event.payload["event"] == "rejected" and event.payload["http_status"] == 400


def test_wrong_url_and_redirect_are_retried_not_dropped(store: EventStore) -> None:
    clock = FakeClock()
    with receiver(statuses=[404, 302]) as hook:
        d = _delivery(store, [SinkConfig(kind="webhook", name="hook", url=hook.url)], clock)
        try:
            d.enqueue(sample_alert(), T0)
            wait_until(lambda: store.outbox_due(1e300)[0].attempts == 1, what="the 404")
            clock.advance(1.0)
            wait_until(lambda: store.outbox_due(1e300)[0].attempts == 2, what="the 302, not followed")
            assert store.outbox_due(1e300)[0].last_error.startswith("HTTP 302")
            clock.advance(2.0)
            assert len(hook.wait_for(1)) == 1
        finally:
            d.close()
    assert d.counters()[("alert_delivery", "ok")] == 1 and ("alert_delivery", "rejected") not in d.counters()


def test_unreadable_secret_is_reported_and_retried_never_leaked(tmp_path: Path, store: EventStore) -> None:
    clock = FakeClock()
    url_file = tmp_path / "slack.url"
    url_file.write_text("http://127.0.0.1:9/services/SECRET\n")
    os.chmod(url_file, 0o644)  # world-readable: refused
    d = _delivery(store, [SinkConfig(kind="slack", name="slack", url_file=url_file)], clock)
    try:
        problems = d.problems()
        assert len(problems) == 1 and "world-readable" in problems[0] and "SECRET" not in problems[0]
        d.enqueue(sample_alert(), T0)
        row = wait_until(lambda: [r for r in store.outbox_due(1e300) if r.attempts >= 1], what="a failure")[0]
        assert "world-readable" in (row.last_error or "") and "SECRET" not in (row.last_error or "")
    finally:
        d.close()


# --------------------------------------------------------------------------------------------------
# A real Alertmanager (Debian's prometheus-alertmanager).


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2.0) as response:
        return json.loads(response.read())


def test_real_alertmanager_takes_and_resolves_the_alert(tmp_path: Path, store: EventStore) -> None:
    binary = require_binary("prometheus-alertmanager", "the real Alertmanager v2 API check")
    config = tmp_path / "alertmanager.yml"
    config.write_text("route:\n  receiver: blackhole\nreceivers:\n  - name: blackhole\n")
    port = free_port()
    release_port(port)
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=0.5) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until(ready, timeout_s=20.0, what="Alertmanager ready")
        d = Delivery(
            store,
            AlertsConfig(sinks=(SinkConfig(kind="alertmanager", name="am", url=base),)),
            clock=time.time,
            poll_interval_s=0.02,
        )
        d.start()
        try:
            now = time.time()
            job = make_job(onset=now - 600)
            alert = build_alert(job, node="node-a", condition=Condition.DEADLOCK, now=now, first_seen=now)
            d.enqueue(alert, now)

            def ours() -> list[dict[str, Any]]:
                return [
                    a
                    for a in _get_json(f"{base}/api/v2/alerts")
                    if a["labels"].get("training_job") == "qwen3-32b-ft"
                ]

            got = wait_until(ours, what="the alert in Alertmanager")[0]
            assert got["labels"]["alertname"] == "GpuTrainingDeadlock"
            assert got["labels"]["severity"] == "critical"
            assert got["annotations"]["runbook_url"].endswith("#deadlock_confirmed")
            assert got["status"]["state"] == "active"
            assert got["startsAt"].startswith(time.strftime("%Y-%m-%dT", time.gmtime(now - 600)))
            d.enqueue(resolve(alert, time.time(), "verdict is now healthy"), time.time())
            wait_until(lambda: not ours(), what="the alert resolved in Alertmanager")
            wait_until(
                lambda: d.counters().get(("alert_delivery", "ok")) == 2, what="both deliveries counted"
            )
            assert store.outbox_size() == 0
        finally:
            d.close()
    finally:
        proc.terminate()
        proc.wait(10)
