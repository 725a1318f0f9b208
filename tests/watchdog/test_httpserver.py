"""uvicorn in a thread: a real server on loopback, answered over real HTTP."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from gpu_triage.serving.api import create_app
from gpu_triage.serving.control import QueuedControl
from gpu_triage.serving.http_server import HttpServer, PortInUseError
from gpu_triage.serving.publish import SnapshotHolder
from tests.watchdog.snapshots import snapshot

TOKEN = "tok-http-4e1b"


def make_app(holder: SnapshotHolder, control: QueuedControl | None = None) -> FastAPI:
    return create_app(snapshots=holder, events=None, table=dict, control=control, token=TOKEN, period_s=1.0)


@pytest.fixture
def server() -> Iterator[HttpServer]:
    holder = SnapshotHolder()
    http = HttpServer(make_app(holder), "127.0.0.1", 0)
    http.start()
    http.app.state.snapshots.publish(snapshot(cycle=7, time=_now()))
    try:
        yield http
    finally:
        http.stop(2.0)


def _now() -> float:
    return time.time()


def test_port_zero_serves_healthz_over_real_http(server: HttpServer) -> None:
    assert server.port != 0
    assert server.url == f"http://127.0.0.1:{server.port}"
    with httpx.Client(base_url=server.url, timeout=5.0) as client:
        response = client.get("/healthz")
        assert response.status_code == 200
        assert response.json()["status"] == "ok"
        assert response.json()["cycle"] == 7
        assert "server" not in response.headers
        assert client.get("/status").json()["cycle"] == 7  # keep-alive: same connection


def test_a_taken_port_fails_start_clearly() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        http = HttpServer(make_app(SnapshotHolder()), "127.0.0.1", port)
        with pytest.raises(PortInUseError, match=rf"^127\.0\.0\.1:{port} is in use$"):
            http.start()
        assert not http.running


def test_a_second_server_on_the_same_port_is_refused(server: HttpServer) -> None:
    with pytest.raises(PortInUseError, match="is in use"):
        HttpServer(make_app(SnapshotHolder()), "127.0.0.1", server.port).start()
    with httpx.Client(base_url=server.url, timeout=5.0) as client:
        assert client.get("/healthz").status_code == 200  # the first one is unharmed


def test_stop_closes_the_port_even_with_a_keep_alive_client() -> None:
    http = HttpServer(make_app(SnapshotHolder(snapshot(time=_now()))), "127.0.0.1", 0)
    http.start()
    client = httpx.Client(base_url=http.url, timeout=5.0)
    assert client.get("/healthz").status_code == 200
    http.stop(2.0)
    assert not http.running
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{http.port}/healthz", timeout=2.0)
    client.close()
    http.stop()  # idempotent


def test_signal_handlers_and_logging_are_left_to_the_daemon() -> None:
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.getsignal(sig) for sig in handled}
    root_handlers = list(logging.getLogger().handlers)
    with HttpServer(make_app(SnapshotHolder()), "127.0.0.1", 0):
        assert {sig: signal.getsignal(sig) for sig in handled} == before
    assert {sig: signal.getsignal(sig) for sig in handled} == before
    assert logging.getLogger().handlers == root_handlers


def test_a_streamed_oversized_body_is_413_over_real_http(server: HttpServer) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            yield b"x" * 1024

    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, timeout=5.0) as client:
        response = client.post("/arm", content=chunks(), headers=headers)  # chunked: no Content-Length
        assert response.status_code == 413
        assert client.post("/arm", content=b"x" * 70_000, headers=headers).status_code == 413


def test_mutations_over_real_http_reach_the_control() -> None:
    control = QueuedControl()
    with HttpServer(make_app(SnapshotHolder(snapshot()), control), "127.0.0.1", 0) as http:
        response = httpx.post(
            f"{http.url}/arm",
            json={"mode": "alert"},
            timeout=5.0,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert response.status_code == 202
        refused = httpx.post(f"{http.url}/disarm", timeout=5.0)
        assert refused.status_code == 401
    assert [c.mode.value for c in control.drain()] == ["alert"]


def test_keep_alive_responses_are_not_held_back_by_nagle(server: HttpServer) -> None:
    # Without TCP_NODELAY on the accepted sockets every keep-alive response waited for the client's
    # delayed ACK: 44 ms each, measured here before the fix. The median of 20 must be far below that.
    listener = server._socket
    assert listener is not None and listener.proto == socket.IPPROTO_TCP
    with httpx.Client(base_url=server.url, timeout=5.0) as client:
        client.get("/status")
        durations_s = []
        for _ in range(20):
            start = time.perf_counter()
            assert client.get("/status").status_code == 200
            durations_s.append(time.perf_counter() - start)
    assert sorted(durations_s)[10] < 0.030


def test_slow_sockets_are_bounded_and_never_keep_healthz_out() -> None:
    """1.1 x the connection cap of slowloris sockets (partial headers, never finished): the server keeps
    at most ``max_connections`` of them, closes each after ``request_timeout_s`` without a request,
    and a fresh /healthz connection is answered meanwhile. (Timeouts here prove nothing blocks.)"""
    holder = SnapshotHolder(snapshot(cycle=3, time=_now()))
    http = HttpServer(make_app(holder), "127.0.0.1", 0, max_connections=40, request_timeout_s=1.0)
    http.start()
    slow: list[socket.socket] = []
    try:
        for _ in range(44):
            s = socket.create_connection(("127.0.0.1", http.port), timeout=5.0)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # never finished
            slow.append(s)
        with httpx.Client(base_url=http.url, timeout=3.0) as client:
            response = client.get("/healthz")
        assert response.status_code == 200 and response.json()["status"] == "ok"
        deadline = time.monotonic() + 5.0  # the door hands them to the loop: evictions follow shortly
        while http.protocol.evicted < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert http.protocol.evicted >= 4  # over the cap: the oldest slow ones went first
        deadline = time.monotonic() + 10.0
        for s in slow:  # every slow socket is closed by the server (EOF), none held for ever
            s.settimeout(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(1024) == b""
    finally:
        for s in slow:
            s.close()
        http.stop(2.0)


def test_a_request_whose_app_is_still_answering_is_not_cut() -> None:
    app = FastAPI()

    @app.get("/slow")
    async def slow_route() -> dict[str, str]:
        import asyncio

        await asyncio.sleep(1.5)
        return {"ok": "yes"}

    http = HttpServer(app, "127.0.0.1", 0, request_timeout_s=0.5)
    http.start()
    try:
        response = httpx.get(f"{http.url}/slow", timeout=5.0)
        assert response.json() == {"ok": "yes"}
    finally:
        http.stop(2.0)


def test_healthz_is_answered_while_the_event_loop_is_busy() -> None:
    """/healthz apart from the scrape path (issue 30): a route that holds uvicorn's event loop for 3 s
    (as a long render or a flood of scrapes does) does not delay a probe on a new connection."""
    app = make_app(SnapshotHolder(snapshot(cycle=5, time=_now())))

    @app.get("/hog")
    async def hog() -> dict[str, str]:
        time.sleep(3.0)  # blocks the event loop on purpose
        return {"ok": "yes"}

    http = HttpServer(app, "127.0.0.1", 0)
    http.start()
    try:
        import threading

        hogging = threading.Thread(target=lambda: httpx.get(f"{http.url}/hog", timeout=10.0))
        hogging.start()
        time.sleep(0.5)  # the loop is inside /hog now
        start = time.monotonic()
        response = httpx.get(f"{http.url}/healthz", timeout=2.0)
        assert time.monotonic() - start < 2.0
        assert response.status_code == 200 and response.json()["cycle"] == 5
        assert response.headers["connection"] == "close"
        assert http.door is not None and http.door.answered == 1
        hogging.join(10.0)
    finally:
        http.stop(2.0)


def test_the_health_door_keeps_the_host_check_and_hands_everything_else_to_the_app() -> None:
    holder = SnapshotHolder(snapshot(cycle=9, time=_now()))
    app = create_app(
        snapshots=holder, events=None, table=dict, control=None, token=None, period_s=1.0, allowed_hosts=[]
    )
    with HttpServer(app, "127.0.0.1", 0) as http:
        assert http.door is not None
        evil = httpx.get(f"{http.url}/healthz", headers={"host": "evil.example"}, timeout=5.0)
        assert evil.status_code == 421 and "allowed_hosts" in evil.json()["detail"]
        assert httpx.head(f"{http.url}/healthz?probe=1", timeout=5.0).status_code == 200
        assert http.door.answered == 2
        # a request line that arrives in pieces, then a keep-alive second request: served by the app
        with socket.create_connection(("127.0.0.1", http.port), timeout=5.0) as s:
            s.sendall(b"GET /st")
            time.sleep(0.2)
            s.sendall(b"atus HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            first = _read_response(s)
            s.sendall(b"GET /healthzz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            second = _read_response(s)
        assert first.startswith(b"HTTP/1.1 200") and b'"cycle":9' in first
        assert second.startswith(b"HTTP/1.1 404")
        assert http.door.answered == 2


def test_a_connection_that_never_completes_its_request_line_is_closed_by_the_door() -> None:
    http = HttpServer(make_app(SnapshotHolder(snapshot(time=_now()))), "127.0.0.1", 0, request_timeout_s=0.5)
    with http, socket.create_connection(("127.0.0.1", http.port), timeout=5.0) as s:
        s.sendall(b"GET /heal")  # could still become a probe: waits at the door, not for ever
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(1024) == b""
        assert http.door is not None and http.door.evicted == 1


def _read_response(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def _switches(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/status") as f:
        return sum(int(r.split()[1]) for r in f if r.split(":")[0].endswith("ctxt_switches"))


def test_an_idle_server_never_wakes_and_its_date_header_stays_current(server: HttpServer) -> None:
    """Issue 30: uvicorn's housekeeping tick woke the server's thread every second (0.03 % of a core
    on an idle daemon) to keep the Date header current; each connection refreshes it instead."""
    from email.utils import parsedate_to_datetime

    thread = server._thread
    assert thread is not None and thread.native_id is not None
    with httpx.Client(base_url=server.url, timeout=5.0) as client:
        first = client.get("/status").headers["date"]
        before = _switches(thread.native_id)
        time.sleep(3.5)
        assert _switches(thread.native_id) - before <= 1  # a tick a second: 3 or more
        second = client.get("/status").headers["date"]  # the same keep-alive connection
    assert second != first
    assert abs(parsedate_to_datetime(second).timestamp() - time.time()) < 2.0
