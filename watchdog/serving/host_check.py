"""The ``Host`` header check of the REST API (DNS rebinding).

A web page in a browser on the node (or on an operator's laptop with the port forwarded) can make its
own domain name resolve to 127.0.0.1 and then read ``/status`` as a same-origin request: the browser
sends ``Host: attacker.example``. So a request is answered only when its ``Host`` names this daemon:

- an IP address literal (``127.0.0.1:9410``, ``[::1]:9410``, ``10.0.0.5:9410``): a rebinding page
  always sends its own domain name, never an address;
- ``localhost`` (and ``*.localhost``), the node name (``daemon.node``), this machine's host name;
- a name listed in ``daemon.allowed_hosts`` (e.g. the node's DNS name used by Prometheus or
  ``gpu-watchdog cluster``); ``"*"`` there turns the check off.

Anything else is answered ``421 Misdirected Request`` before the app sees it. A request without a
``Host`` header (HTTP/1.0 tools) is accepted: a browser always sends one.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send


def host_name(header: str) -> str:
    """The host part of a Host header value, lower case, without port or IPv6 brackets."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    name, sep, port = value.rpartition(":")
    return name if sep and port.isdigit() else value


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


MISDIRECTED_BODY = json.dumps(
    {
        "detail": "misdirected request: the Host header names no host of this daemon "
        "(add the name to daemon.allowed_hosts)"
    }
).encode()
"""The 421 answer's JSON body."""


class HostPolicy:
    def __init__(self, names: Iterable[str]) -> None:
        self.any = False
        self.names: set[str] = {"localhost"}
        for n in names:
            if n.strip() == "*":
                self.any = True
            elif n.strip():
                self.names.add(host_name(n).rstrip("."))

    def allows(self, header: str | None) -> bool:
        if self.any or header is None:
            return True
        name = host_name(header).rstrip(".")
        return _is_address(name) or name in self.names or name.endswith(".localhost")


class HostCheck:
    """ASGI middleware: 421 for a request whose Host header names no host of this daemon."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = None
            for key, value in scope.get("headers", ()):
                if key == b"host":
                    host = value.decode("latin-1")
                    break
            if not self.policy.allows(host):
                body = MISDIRECTED_BODY
                await send(
                    {
                        "type": "http.response.start",
                        "status": 421,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
