"""``/healthz`` answered apart from the scrape path: the front door of the HTTP server.

A Slurm health check or a Kubernetes probe that times out drains the node or restarts the daemon, so
its answer must not wait on ``/metrics`` scrapes. On uvicorn's event loop it did: under 64 keep-alive
connections flooding ``/metrics`` a fresh ``/healthz`` connection waited for its accept, its read and
its answer to come round in turn (p50 ~70 ms, p99 ~200 ms on a 2-core machine).

The front door is a thread of its own that owns the listening socket. It accepts every connection and
reads its first bytes:

- ``GET``/``HEAD /healthz`` (query string allowed) with its headers complete: answered here, from the
  latest snapshot, with the app's own Host check, and closed (``Connection: close``, as probes ask);
- anything else - as soon as the bytes cannot be such a request - is handed to uvicorn's event loop
  with the bytes read so far (replayed to the protocol before anything else), which serves it exactly
  as before (routing, the connection guard, keep-alive);
- a connection that completes no request line within ``request_timeout_s`` is closed, and at most
  ``max_pending`` wait here (one more closes the oldest): descriptors stay bounded whatever a client
  does, as in :class:`~gpu_triage.serving.http_server.HttpServer`'s guard.

The door does a handful of system calls per probe and never waits on the event loop; the interpreter's
switch interval is lowered to :data:`SWITCH_INTERVAL_S` so that the door gets the GIL within half a
millisecond of each call even while the loop thread renders (``make bench``: ``python -m benchmarks
health``, baseline: the same probes answered on the event loop).
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Literal

log = logging.getLogger(__name__)

#: The GIL switch interval while a door runs (CPython's default is 5 ms: a probe makes ~6 system calls,
#: each of which may wait one interval for a busy thread to let go of the GIL; an idle daemon pays
#: nothing for a shorter one, a busy one a few switches more per second).
SWITCH_INTERVAL_S = 0.0005
MAX_HEAD_BYTES = 8192
"""A health request's line and headers must fit in this many bytes (else the app answers it)."""

_REQUEST_LINES = (b"GET /healthz", b"HEAD /healthz")
_VERSIONS = (b" HTTP/1.1", b" HTTP/1.0")
_REASONS = {200: b"OK", 421: b"Misdirected Request", 503: b"Service Unavailable"}

Kind = Literal["health", "app", "wait"]

HealthAnswer = Callable[[str | None], tuple[int, bytes]]
"""``answer(host_header)`` -> (status code, JSON body): the app's health document and Host check."""


def classify(head: bytes) -> Kind:
    """What the first bytes of a connection are: a complete ``GET``/``HEAD /healthz`` request
    (``health``), something else (``app``), or too few bytes yet to tell (``wait``)."""
    for start in _REQUEST_LINES:
        if not head.startswith(start):
            if start.startswith(head):
                return "wait"
            continue
        after = head[len(start) : len(start) + 1]
        if not after:
            return "wait"
        if after not in (b" ", b"?"):
            return "app"  # /healthzfoo
        end = _head_end(head)
        if end < 0:
            return "wait" if len(head) < MAX_HEAD_BYTES else "app"
        request_line = head.split(b"\n", 1)[0].rstrip(b"\r")
        return "health" if request_line.endswith(_VERSIONS) else "app"
    return "app"


def _head_end(head: bytes) -> int:
    """The length of the request line and headers (up to the blank line), or -1 if incomplete."""
    for blank in (b"\r\n\r\n", b"\n\n"):
        at = head.find(blank)
        if at >= 0:
            return at + len(blank)
    return -1


def host_header(head: bytes) -> str | None:
    """The ``Host`` header of a request head, or None."""
    for raw in head[: _head_end(head)].split(b"\n")[1:]:
        name, sep, value = raw.partition(b":")
        if sep and name.strip().lower() == b"host":
            return value.strip().decode("latin-1")
    return None


def response(head: bytes, answer: HealthAnswer) -> bytes:
    """The whole HTTP response to one health request head (``HEAD``: the headers alone)."""
    status, body = answer(host_header(head))
    lines = [
        b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"")),
        b"date: " + email.utils.formatdate(usegmt=True).encode(),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + (b"" if head.startswith(b"HEAD") else body)


_switch_lock = threading.Lock()
_switch_users = 0
_switch_before_s = 0.0


def _lower_switch_interval() -> None:
    """Lower the interpreter's switch interval while at least one door runs (counted: two servers
    in one process, started and stopped in any order, leave the interval as they found it)."""
    global _switch_users, _switch_before_s
    with _switch_lock:
        if _switch_users == 0:
            _switch_before_s = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_before_s, SWITCH_INTERVAL_S))
        _switch_users += 1


def _restore_switch_interval() -> None:
    global _switch_users
    with _switch_lock:
        _switch_users -= 1
        if _switch_users == 0:
            sys.setswitchinterval(_switch_before_s)


class HealthDoor:
    """The front-door thread over a bound, listening ``listener`` (see the module doc). ``hand_off``
    gives non-health connections, each with the bytes read from it so far, to the event loop (called
    from the door's thread, once per round of the door's selector)."""

    def __init__(
        self,
        listener: socket.socket,
        answer: HealthAnswer,
        hand_off: Callable[[list[tuple[socket.socket, bytes]]], None],
        *,
        max_pending: int,
        request_timeout_s: float,
    ) -> None:
        self.listener = listener
        self.answer = answer
        self.hand_off = hand_off
        self.max_pending = max_pending
        self.request_timeout_s = request_timeout_s
        self.answered = 0
        """Health requests answered by the door (tests, the bench)."""
        self.evicted = 0
        """Connections the door closed: no request line in time, or over ``max_pending``."""
        self._pending: dict[socket.socket, _Waiting] = {}  # oldest first
        self._handoffs: list[tuple[socket.socket, bytes]] = []
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="http-health-door", daemon=True)
        self._switch_lowered = False

    def start(self) -> None:
        self.listener.setblocking(False)
        self._wake_r.setblocking(False)
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        _lower_switch_interval()
        self._switch_lowered = True
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop accepting (the listener stays open: its owner closes it) and close what waits here."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._switch_lowered:
            _restore_switch_interval()
            self._switch_lowered = False
        for conn in list(self._pending):
            conn.close()
        self._pending.clear()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        while not self._stopping:
            timeout_s = None
            if self._pending:
                first_deadline = next(iter(self._pending.values())).deadline_m
                timeout_s = max(0.0, first_deadline - time.monotonic())
            try:
                events = self._selector.select(timeout_s)
            except OSError as error:  # never kills the server
                log.warning("health door: select failed: %s", error)
                time.sleep(0.05)
                continue
            for key, _mask in events:
                sock = key.fileobj
                try:
                    if sock is self.listener:
                        self._accept()
                    elif sock is not self._wake_r and sock in self._pending:  # not closed meanwhile
                        assert isinstance(sock, socket.socket)
                        self._read(sock)
                except Exception:  # one bad connection never stops the door
                    log.exception("health door: a connection failed")
                    if isinstance(sock, socket.socket) and sock in self._pending:
                        self._close(sock)
            self._expire()
            self._flush()

    def _accept(self) -> None:
        while True:
            try:
                conn, _address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # EMFILE and the like: the oldest waiting connection makes room
                log.warning("health door: accept failed: %s", error)
                if self._pending:
                    self._close(next(iter(self._pending)))
                return
            # left blocking: reads below say MSG_DONTWAIT (one system call less; the event loop makes the
            # connections it adopts non-blocking itself)
            self._pending[conn] = _Waiting(time.monotonic() + self.request_timeout_s)
            if len(self._pending) > self.max_pending:
                self._close(next(iter(self._pending)))
            if conn in self._pending:
                # A client usually sends its request with the connection: read it now, and watch the
                # connection only if nothing is there yet (fewer system calls, each of which may
                # wait for the GIL while the loop thread is busy).
                self._read(conn)

    def _read(self, conn: socket.socket) -> None:
        waiting = self._pending[conn]
        try:
            data = conn.recv(MAX_HEAD_BYTES - len(waiting.head), socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            self._watch(conn, waiting)
            return
        except OSError:
            data = b""
        if not data:  # closed (or reset) before a request
            self._forget(conn)
            conn.close()
            return
        waiting.head += data
        head = bytes(waiting.head)
        kind = classify(head)
        if kind == "wait":
            self._watch(conn, waiting)
            return
        self._forget(conn)
        if kind == "app":
            self._handoffs.append((conn, head))
            return
        self._answer(conn, head)

    def _watch(self, conn: socket.socket, waiting: _Waiting) -> None:
        if not waiting.watched:
            self._selector.register(conn, selectors.EVENT_READ)
            waiting.watched = True

    def _flush(self) -> None:
        """Hand the connections of this round to the event loop, in one wake-up of the loop."""
        if not self._handoffs:
            return
        batch, self._handoffs = self._handoffs, []
        try:
            self.hand_off(batch)
        except Exception:  # the loop is gone (stopping): nobody serves them
            for conn, _head in batch:
                conn.close()

    def _answer(self, conn: socket.socket, head: bytes) -> None:
        try:
            answer = response(head, self.answer)
            self.answered += 1
            conn.settimeout(1.0)
            conn.sendall(answer)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        except Exception:
            log.exception("health door: answering /healthz failed")
        finally:
            conn.close()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._pending:
            conn, waiting = next(iter(self._pending.items()))
            if waiting.deadline_m > now:
                return
            self._close(conn)

    def _forget(self, conn: socket.socket) -> None:
        waiting = self._pending.pop(conn, None)
        if waiting is not None and waiting.watched:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn)

    def _close(self, conn: socket.socket) -> None:
        self._forget(conn)
        self.evicted += 1  # counted before the client can see the close
        conn.close()


class _Waiting:
    """A connection at the door: its deadline, the bytes read so far, whether the selector watches it."""

    __slots__ = ("deadline_m", "head", "watched")

    def __init__(self, deadline_m: float) -> None:
        self.deadline_m = deadline_m
        self.head = bytearray()
        self.watched = False
