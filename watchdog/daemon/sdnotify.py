"""systemd notifications (sd_notify) without libsystemd: one datagram to ``$NOTIFY_SOCKET``.

Used by the loop: :meth:`SdNotifier.ready` once the first cycle has run, :meth:`SdNotifier.watchdog_due`
/ :meth:`SdNotifier.watchdog` after each healthy cycle (systemd restarts the service if the pings stop
for ``WatchdogSec``), :meth:`SdNotifier.status` for a one-line state in ``systemctl status``,
:meth:`SdNotifier.reloading` + :meth:`SdNotifier.ready` around a SIGHUP reload and
:meth:`SdNotifier.stopping` on SIGTERM.

Not under systemd (no ``NOTIFY_SOCKET``) every call is a no-op returning False. A socket path starting
with ``@`` is in the abstract namespace. ``WATCHDOG_USEC`` gives the watchdog timeout; it applies to
this process only when ``WATCHDOG_PID`` is unset or equals our pid (systemd sets it so that children
do not ping on the parent's behalf). Pings are sent every half timeout, as sd_watchdog_enabled(3)
recommends. Sending never raises: a failure is logged once and reported as False.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)


def _clean(text: str) -> str:
    """One line: a newline would start a new assignment in the datagram."""
    return " ".join(text.split())


class SdNotifier:
    def __init__(self, env: Mapping[str, str] | None = None, *, pid: int | None = None) -> None:
        env = os.environ if env is None else env
        self.pid = os.getpid() if pid is None else pid
        raw = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if raw.startswith("@"):
            self.address = "\0" + raw[1:]
        elif raw.startswith("/"):
            self.address = raw
        elif raw:
            log.warning("NOTIFY_SOCKET=%r is neither a path nor an abstract name; not notifying", raw)
        self.watchdog_timeout_s: float | None = None
        usec, owner = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not owner or owner == str(self.pid)):
            self.watchdog_timeout_s = int(usec) / 1e6
        self._sock: socket.socket | None = None
        self._last_ping_s: float | None = None
        self._failed = False
        self.sent_total = 0

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to ping: half the watchdog timeout; None when the watchdog is off."""
        return None if self.watchdog_timeout_s is None else self.watchdog_timeout_s / 2

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram. True if sent."""
        if self.address is None:
            return False
        message = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message, self.address)
        except OSError as e:
            if not self._failed:
                log.warning("sd_notify to %r failed: %s", self.address.replace("\0", "@"), e)
                self._failed = True
            return False
        self._failed = False
        self.sent_total += 1
        return True

    def ready(self, status: str | None = None) -> bool:
        lines = ["READY=1"]
        if status:
            lines.append(f"STATUS={_clean(status)}")
        return self.notify(*lines)

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={_clean(text)}")

    def watchdog_due(self, now_s: float) -> bool:
        """Whether a ping is due at ``now_s`` (monotonic seconds)."""
        interval = self.watchdog_interval_s
        if interval is None or self.address is None:
            return False
        return self._last_ping_s is None or now_s - self._last_ping_s >= interval

    def watchdog(self, now_s: float) -> bool:
        """Ping the watchdog (call after a healthy cycle, when :meth:`watchdog_due`)."""
        self._last_ping_s = now_s
        return self.notify("WATCHDOG=1")

    def reloading(self, monotonic_us: int | None = None) -> bool:
        """Before re-reading the configuration; send :meth:`ready` when done. ``MONOTONIC_USEC`` is
        required by systemd >= 253 with Type=notify-reload and harmless before."""
        if monotonic_us is None:
            monotonic_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_us}")

    def stopping(self, status: str | None = None) -> bool:
        lines = ["STOPPING=1"]
        if status:
            lines.append(f"STATUS={_clean(status)}")
        return self.notify(*lines)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
