"""tests/ports.py: a port is never handed out twice in one process, even where the kernel offers it."""

from __future__ import annotations

import socket

import pytest

from tests import ports


def test_the_kernel_offering_a_port_again_gets_another(monkeypatch: pytest.MonkeyPatch) -> None:
    offered = iter([41000, 41000, 41000, 41001])

    class Socket(socket.socket):
        def getsockname(self):  # the kernel's answer, scripted: the same just-closed port three times
            return ("127.0.0.1", next(offered))

    monkeypatch.setattr(ports, "_HANDED_OUT", set())
    monkeypatch.setattr(ports.socket, "socket", Socket)
    assert [ports.free_port(), ports.free_port()] == [41000, 41001]


def test_many_ports_in_a_row_are_distinct() -> None:
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
