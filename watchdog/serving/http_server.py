"""uvicorn in a daemon thread, with its own event loop, beside the sampling loop.

The main thread belongs to the loop, which owns the signals (SIGTERM, SIGHUP): uvicorn here installs
no signal handlers (as glances' ``GlancesUvicornServer`` does) and leaves logging configuration to the
daemon (``log_config=None``; access log off by default). The listening socket is bound before the
thread starts, so a taken port fails :meth:`HttpServer.start` at once with "HOST:PORT is in use", and
``port=0`` picks a free port that :attr:`HttpServer.port` then reports.

**Health that a flood cannot starve.** Every connection is guarded (:class:`_GuardedH11Protocol`): a
connection must complete a request within ``request_timeout_s`` of opening or of its previous response
(a slow-header or slow-body client - slowloris - is closed, never held for ever; a request whose body
has fully arrived is never cut while the app answers it), and at most ``max_connections`` are open
(half the open-files limit, at most 4096):
one more closes the connection that has gone longest without completing a request. File descriptors
therefore stay bounded whatever a client does, and a fresh ``/healthz`` connection always gets in.
Together with the cheap ``/healthz`` path and the ``/metrics`` body rendered once per cycle
(:mod:`gpu_triage.serving.api`), a ``/metrics`` flood or a thousand slow sockets leave ``/healthz``
answering in milliseconds (``make bench``: ``python -m benchmarks health``).

**Health apart from the scrape path.** For an app that answers health itself (``create_app`` puts
its ``health_answer`` in ``app.state``), the listening socket belongs to a front-door thread
(:class:`~gpu_triage.serving.health_door.HealthDoor`): it answers ``GET``/``HEAD /healthz`` on its
own and hands every other connection, with the bytes read so far, to uvicorn's event loop. A probe
then never waits behind a ``/metrics`` scrape on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from gpu_triage.serving.health_door import HealthAnswer, HealthDoor

log = logging.getLogger(__name__)


class PortInUseError(OSError):
    """The address to listen on is taken by another process: ``str()`` is "HOST:PORT is in use"."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(errno.EADDRINUSE, f"{host}:{port} is in use")

    def __str__(self) -> str:
        return str(self.strerror)


def fresh_date_header(server_state: Any, config: uvicorn.Config) -> None:
    """uvicorn's default headers (``Date``, and the configured ones) as its ``on_tick`` makes them, made
    again only when the second changed since the last time: called by each connection as it reads,
    so an idle server never needs its tick to keep the header current."""
    now = time.time()
    if int(now) == getattr(server_state, "date_second", None):
        return
    date = [(b"date", formatdate(now, usegmt=True).encode())] if config.date_header else []
    server_state.default_headers = date + config.encoded_headers
    server_state.date_second = int(now)


class _ThreadServer(uvicorn.Server):
    """A uvicorn server that never touches signal handlers (the main loop owns them) and never ticks:
    uvicorn's tick (ten a second; one a second here before issue 30 - still ~0.3 ms of CPU a second in
    wake-ups on an idle daemon) keeps the ``Date`` header current and checks for the exit; here each
    connection refreshes the header as it reads (:func:`fresh_date_header`) and :meth:`request_exit`
    wakes the loop, which otherwise sleeps until it is asked to stop."""

    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _create: Callable[[bytes], asyncio.Protocol] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        config, loop = self.config, asyncio.get_running_loop()
        self._loop = loop

        def create(head: bytes) -> asyncio.Protocol:  # as uvicorn's own factory, plus the bytes read
            protocol: Any = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=loop
            )
            protocol._replay = head
            return protocol

        self._create = create
        await super().startup(sockets)

    def adopt(self, batch: list[tuple[socket.socket, bytes]]) -> None:
        """Serve accepted connections (from any thread), each with the first bytes read from it."""
        loop = self._loop
        if loop is None or self.should_exit:
            raise RuntimeError("the server is not running")
        loop.call_soon_threadsafe(self._adopt, batch)

    def _adopt(self, batch: list[tuple[socket.socket, bytes]]) -> None:
        assert self._loop is not None and self._create is not None
        for conn, head in batch:
            self._adopt_one(conn, head)

    def _adopt_one(self, conn: socket.socket, head: bytes) -> None:
        assert self._loop is not None and self._create is not None
        create = self._create
        task = self._loop.create_task(self._loop.connect_accepted_socket(lambda: create(head), conn))

        def done(task: asyncio.Task[Any]) -> None:
            if task.cancelled() or task.exception() is not None:
                conn.close()

        task.add_done_callback(done)

    async def main_loop(self) -> None:
        self._wake = asyncio.Event()
        if self.should_exit:  # asked before the loop ran
            return
        await self._wake.wait()

    def request_exit(self, *, force: bool = False) -> None:
        """Ask the server to stop (from any thread): the loop wakes now."""
        self.should_exit = True
        if force:
            self.force_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(wake.set)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # uvicorn >= 0.29
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn
        return None


MAX_CONNECTIONS = 4096
"""Open connections at most (and never more than half the open-files limit: 512 at the usual 1024);
one more evicts the connection that has gone longest without a response."""


def connection_cap(ceiling: int = MAX_CONNECTIONS) -> int:
    """The connection cap for this process: half its soft open-files limit, at most ``ceiling``."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return ceiling
    return max(16, min(ceiling, soft // 2))


REQUEST_TIMEOUT_S = 10.0
"""A connection must complete a request within this long of opening or of its previous response."""
LISTEN_BACKLOG = 1024


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request deadline and a connection cap (see the module doc)."""

    max_connections = MAX_CONNECTIONS
    request_timeout_s = REQUEST_TIMEOUT_S
    evicted = 0
    """Connections closed by the guard (slow or over the cap), for tests and the bench."""

    _replay = b""
    """The bytes the health door read before handing the connection over (fed in first)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._progress_m = time.monotonic()
        self._guard = self.loop.call_later(self.request_timeout_s, self._check_progress)
        if len(self.connections) > self.max_connections:
            others = [c for c in self.connections if c is not self and isinstance(c, _GuardedH11Protocol)]
            victim = min(others, key=lambda c: c._progress_m, default=None)
            (victim or self)._guard_close()
        if self._replay and not transport.is_closing():
            self.data_received(self._replay)

    def handle_events(self) -> None:
        fresh_date_header(self.server_state, self.config)
        super().handle_events()

    def connection_lost(self, exc: Exception | None) -> None:
        guard = getattr(self, "_guard", None)
        if guard is not None:
            guard.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        self._progress_m = time.monotonic()
        super().on_response_complete()

    def _answering(self) -> bool:
        """The request has fully arrived and the app is still answering it: never cut."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and self.conn.their_state is h11.DONE

    def _check_progress(self) -> None:
        if self.transport.is_closing():
            return
        due = self._progress_m + self.request_timeout_s
        now = time.monotonic()
        if now < due or self._answering():
            self._guard = self.loop.call_later(
                max(0.05, due - now) if now < due else self.request_timeout_s, self._check_progress
            )
            return
        self._guard_close()

    def _guard_close(self) -> None:
        type(self).evicted += 1
        self.transport.close()


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(
            host, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, _type, proto, _name, address = infos[0]
    except socket.gaierror as error:
        raise OSError(f"cannot resolve listen address {host!r}: {error}") from error
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it Nagle + delayed ACK add 40 ms to every keep-alive response (headers and body are
    # written separately).
    sock = socket.socket(family, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # As uvicorn does: allows a restart while old connections sit in TIME_WAIT, but never two
        # listeners on one port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise PortInUseError(host, port) from error
        raise OSError(error.errno, f"cannot listen on {host}:{port}: {error.strerror}") from error
    return sock


class HttpServer:
    """Serve ``app`` on ``host:port`` from a daemon thread. ``start()`` returns once listening.
    ``health_door=False`` answers /healthz on the event loop like every other path (the benchmark's
    baseline)."""

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 9410,
        *,
        access_log: bool = False,
        log_level: str = "warning",
        max_connections: int | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        health_door: bool = True,
    ) -> None:
        self.app = app
        self.host = host
        self._requested_port = port
        self._access_log = access_log
        self._log_level = log_level
        self._socket: socket.socket | None = None
        self._bound_port: int | None = None
        self._server: _ThreadServer | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        state = getattr(app, "state", None)
        self._health: HealthAnswer | None = getattr(state, "health_answer", None) if health_door else None
        self.door: HealthDoor | None = None
        """The front door answering /healthz apart from the event loop (None: the app has no health)."""
        self._max_connections = connection_cap() if max_connections is None else max_connections
        self._request_timeout_s = request_timeout_s
        self.protocol = type(
            "GuardedH11Protocol",
            (_GuardedH11Protocol,),
            {
                "max_connections": self._max_connections,
                "request_timeout_s": request_timeout_s,
                "evicted": 0,
            },
        )
        """This server's protocol class: its ``evicted`` counts connections the guard closed."""

    @property
    def port(self) -> int:
        """The bound port (the free one chosen for ``port=0``) once started, else the requested one."""
        return self._bound_port if self._bound_port is not None else self._requested_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout_s: float = 10.0) -> None:
        """Bind, start serving and wait until uvicorn is accepting. Raises :class:`PortInUseError`
        ("127.0.0.1:9410 is in use") or RuntimeError when the server does not come up in time."""
        if self._thread is not None:
            raise RuntimeError("HttpServer already started")
        self._socket = _bind(self.host, self._requested_port)
        self._bound_port = int(self._socket.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            loop="asyncio",
            lifespan="auto",
            log_config=None,
            log_level=self._log_level,
            access_log=self._access_log,
            timeout_graceful_shutdown=5,
            server_header=False,
            http=self.protocol,
            backlog=LISTEN_BACKLOG,
        )
        self._server = _ThreadServer(config)
        self._thread = threading.Thread(target=self._serve, name="http-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                self._cleanup()
                raise RuntimeError(f"HTTP server on {self.host}:{self.port} exited at start: {self._error!r}")
            if time.monotonic() > deadline:
                self.stop(1.0)
                raise RuntimeError(
                    f"HTTP server on {self.host}:{self.port} not listening after {timeout_s} s"
                )
            time.sleep(0.005)
        if self._health is not None:
            self.door = HealthDoor(
                self._socket,
                self._health,
                self._server.adopt,
                max_pending=max(16, self._max_connections // 2),
                request_timeout_s=self._request_timeout_s,
            )
            self.door.start()
        log.info("listening on %s", self.url)

    def _serve(self) -> None:
        assert self._server is not None and self._socket is not None
        try:  # with a health door, the door owns the listener and hands uvicorn its connections
            self._server.run(sockets=[] if self._health is not None else [self._socket])
        except BaseException as error:  # reported by start()/stop(); never kills the process
            self._error = error
            log.exception("HTTP server failed")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, let requests in flight finish (up to ``timeout_s``), then force-close."""
        server, thread = self._server, self._thread
        if self.door is not None:
            self.door.stop()
            self.door = None
        if server is None or thread is None:
            self._cleanup()
            return
        server.request_exit()
        thread.join(timeout_s)
        if thread.is_alive():
            server.request_exit(force=True)
            thread.join(1.0)
        if thread.is_alive():
            log.warning("HTTP server thread did not stop within %.1f s", timeout_s + 1.0)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._server = None
        self._thread = None

    def __enter__(self) -> HttpServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
