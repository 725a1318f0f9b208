"""Loopback ports for the tests' servers, daemons and torchrun masters."""

from __future__ import annotations

import socket

_HANDED_OUT: set[int] = set()
"""Ports this process has handed out: never handed out again."""


def free_port() -> int:
    """A loopback port nothing listens on now, and one this process never handed out before.

    Asked twice in a row, the kernel can answer the same just-closed port: a test that took a torchrun
    master port and then a daemon port got one port for both (EADDRINUSE, in a fresh-clone run at four
    workers). Another process may still take the port before the test binds it."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no loopback port left that this process has not handed out already")
