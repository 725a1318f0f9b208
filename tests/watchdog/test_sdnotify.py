"""sd_notify against a real AF_UNIX datagram socket, and the systemd unit checked by systemd-analyze."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_triage.daemon.sdnotify import SdNotifier
from tests.conftest import REPO, require_binary

UNIT = REPO / "deploy" / "systemd" / "gpu-watchdog.service"


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    yield sock, str(path)
    sock.close()


def receive(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_no_op_outside_systemd() -> None:
    n = SdNotifier({})
    assert not n.enabled
    assert not n.ready() and not n.watchdog(0.0) and not n.stopping()
    assert n.watchdog_interval_s is None and not n.watchdog_due(0.0)


def test_messages_reach_the_socket(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    n = SdNotifier({"NOTIFY_SOCKET": path})
    assert n.ready("cycle 1: 8 GPUs\ncompute")
    assert receive(sock) == ["READY=1", "STATUS=cycle 1: 8 GPUs compute"]  # one line, always
    assert n.status("deadlock_suspected on qwen")
    assert receive(sock) == ["STATUS=deadlock_suspected on qwen"]
    assert n.reloading(monotonic_us=123456)
    assert receive(sock) == ["RELOADING=1", "MONOTONIC_USEC=123456"]
    assert n.stopping()
    assert receive(sock) == ["STOPPING=1"]
    assert n.sent_total == 4
    n.close()


def test_abstract_socket(notify_socket: tuple[socket.socket, str]) -> None:
    name = f"gpu-watchdog-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        n = SdNotifier({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert receive(sock) == ["READY=1"]
    finally:
        sock.close()


def test_watchdog_pings_every_half_timeout(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    n = SdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000"}, pid=1234)
    assert n.watchdog_timeout_s == 30.0 and n.watchdog_interval_s == 15.0
    assert n.watchdog_due(100.0)
    assert n.watchdog(100.0)
    assert receive(sock) == ["WATCHDOG=1"]
    assert not n.watchdog_due(114.9)
    assert n.watchdog_due(115.0)


def test_watchdog_pid_must_be_ours(notify_socket: tuple[socket.socket, str]) -> None:
    _, path = notify_socket
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1234"}
    assert SdNotifier(env, pid=1234).watchdog_interval_s == 15.0
    assert SdNotifier(env, pid=4321).watchdog_interval_s is None  # meant for our parent
    assert SdNotifier({**env, "WATCHDOG_USEC": "0"}, pid=1234).watchdog_interval_s is None


def test_a_dead_socket_never_raises(tmp_path: Path) -> None:
    n = SdNotifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.enabled
    assert not n.ready()
    assert not n.watchdog(0.0)
    assert n.sent_total == 0


# ------------------------------------------------------------------------------------------ unit


def unit_directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z]+)=(.*)$", line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


def test_unit_declares_what_the_design_asks() -> None:
    d = unit_directives(UNIT.read_text())
    assert d["Type"] == ["notify"] and d["WatchdogSec"] == ["30"] and d["Restart"] == ["on-failure"]
    assert d["ExecStart"] == [
        "/opt/gpu-triage/venv/bin/gpu-watchdog run --config /etc/gpu-watchdog/config.toml --source nvml"
    ]
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert d["StateDirectory"] == ["gpu-watchdog"]
    assert d["RuntimeDirectory"] == ["gpu-watchdog gpu-watchdog/progress"]
    assert d["RuntimeDirectoryPreserve"] == ["yes"]
    assert d["Group"] == ["gpu-train"]
    # the health signal reads the kernel log through the journal (/dev/kmsg stays closed)
    assert d["SupplementaryGroups"] == ["systemd-journal"] and d["ProtectKernelLogs"] == ["yes"]
    for key in ("NoNewPrivileges", "PrivateTmp", "ProtectKernelTunables", "ProtectKernelModules"):
        assert d[key] == ["yes"], key
    assert d["ProtectSystem"] == ["strict"] and d["ProtectHome"] == ["read-only"]
    assert "PrivateDevices" not in d  # it would hide /dev/nvidia*
    assert int(d["LimitNOFILE"][0]) >= 16384  # a thousand client sockets must not starve the scan
    for key in ("CapabilityBoundingSet", "AmbientCapabilities"):
        assert set(d[key][0].split()) == {"CAP_KILL", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}


def test_every_directive_is_explained_by_a_comment() -> None:
    unexplained = []
    block_has_comment = False
    for line in UNIT.read_text().splitlines():
        if not line.strip() or line.startswith("["):
            block_has_comment = False
        elif line.startswith("#"):
            block_has_comment = True
        elif not block_has_comment:
            unexplained.append(line)
    assert unexplained == []


def analyze_verify(unit_text: str, tmp_path: Path) -> tuple[int, list[str]]:
    """``systemd-analyze verify`` on a copy whose ExecStart points at an executable that exists here
    (verify insists on it); returns the exit code and every output line about the unit."""
    binary = require_binary("systemd-analyze", "Debian package 'systemd'")
    unit = tmp_path / "gpu-watchdog.service"
    unit.write_text(unit_text.replace("/opt/gpu-triage/venv/bin/gpu-watchdog", sys.executable))
    result = subprocess.run(
        [binary, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
    )
    lines = [ln for ln in (result.stdout + result.stderr).splitlines() if unit.name in ln]
    return result.returncode, lines


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    rc, problems = analyze_verify(UNIT.read_text(), tmp_path)
    assert (rc, problems) == (0, [])


def test_verify_check_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key and a bad value are reported (verify itself exits 0)."""
    broken = UNIT.read_text().replace("ProtectHome=read-only", "ProtectHome=maybe\nProtectHomme=yes")
    _, problems = analyze_verify(broken, tmp_path)
    assert any("ProtectHomme" in p for p in problems)
    assert any("protect home" in p.lower() for p in problems)


def test_the_daemon_raises_its_own_open_files_limit() -> None:
    import resource

    from gpu_triage.daemon.runner import raise_nofile

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        low = 512 if hard == resource.RLIM_INFINITY or hard >= 2048 else hard // 2
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
        before, after = raise_nofile(target=2048 if hard == resource.RLIM_INFINITY else min(2048, hard))
        assert before == low and after > low
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == after
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
