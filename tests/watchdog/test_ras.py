"""The NCCL RAS client against a loopback server replaying the protocol and report forms that NCCL's
own client and server use (``src/ras/client.cc``, ``src/ras/client_support.cc``)."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_triage.signals.nccl_ras.client import query_status, summarize_json, summarize_text
from tests.watchdog.test_delivery import free_port

TEXT_REPORT = """\
NCCL version 2.26.2+cuda12.8 compiled with CUDA 12.8
CUDA runtime version 12080, driver version 12080

Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      2          8            1         16       16

Communicators... (0.00s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         2         8        16        16  MISMATCH      OK

Errors
======

Warnings
========

#0-0 (9a8b7c6d5e4f3a2b) MISMATCH
  Communicator ranks have different collective operation counts
  15 ranks have launched up to operation 1201
  1 rank has launched up to operation 1200
  Rank 3 has launched up to operation 1200 (node-a pid 4242)
"""


def _rank(rank: int, allreduce: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "host": "10.0.0.1" if rank < 8 else "10.0.0.2",
        "pid": 4200 + rank,
        "cuda_dev": rank % 8,
        "nvml_dev": rank % 8,
        "status": {
            "init_state": 0,
            "async_error": 0,
            "finalize_called": False,
            "destroy_flag": False,
            "abort_flag": False,
        },
        "collective_counts": {
            "Broadcast": 3,
            "Reduce": 0,
            "AllGather": 5000,
            "ReduceScatter": 2400,
            "AllReduce": allreduce,
        },
    }


JSON_REPORT = {
    "nccl_version": "2.28.7",
    "cuda_runtime_version": 12080,
    "cuda_driver_version": 12080,
    "timestamp": "2025-12-02 12:00:00",
    "communicators_count": 1,
    "communicators": [
        {
            "hash": "0x9a8b7c6d5e4f3a2b",
            "secondary_hash": "0x1:0x2",
            "size": 16,
            "ranks_count": 15,
            "missing_ranks_count": 1,
            "ranks": [_rank(r, 1200 if r == 3 else 1201) for r in range(16) if r != 9],
            "missing_ranks": [
                {
                    "rank": 9,
                    "host": "10.0.0.2",
                    "pid": 4209,
                    "cuda_dev": 1,
                    "nvml_dev": 1,
                    "status": {"unresponsive": True, "considered_dead": False},
                }
            ],
        }
    ],
    "ras": {"collection_time_sec": 0.012, "timeouts_count": 1},
}


class RasServer:
    """A TCP server speaking the RAS client protocol. ``json``: whether ``SET FORMAT json`` is taken
    (NCCL >= 2.28.7); ``silent``: accept and never answer."""

    def __init__(
        self, *, json_ok: bool = True, silent: bool = False, handshake: str = "SERVER PROTOCOL 2"
    ) -> None:
        self.commands: list[str] = []
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                fmt = "text"
                if silent:
                    time.sleep(2.0)
                    return
                for raw in self.rfile:
                    line = raw.decode().rstrip("\r\n")
                    server.commands.append(line)
                    upper = line.upper()
                    if upper.startswith("CLIENT PROTOCOL "):
                        self.wfile.write(f"{handshake}\n".encode())
                    elif upper.startswith("TIMEOUT "):
                        self.wfile.write(b"OK\n")
                    elif upper.startswith("SET FORMAT "):
                        if json_ok and line[len("SET FORMAT ") :].lower() in ("json", "text"):
                            fmt = line[len("SET FORMAT ") :].lower()
                            self.wfile.write(b"OK\n")
                        else:
                            self.wfile.write(f"ERROR: Unknown command {line}\n".encode())
                    elif upper in ("STATUS", "VERBOSE STATUS"):
                        body = json.dumps(JSON_REPORT, indent=2) + "\n" if fmt == "json" else TEXT_REPORT
                        data = body.encode()
                        for i in range(0, len(data), 700):  # streamed in pieces, then closed
                            self.wfile.write(data[i : i + 700])
                            self.wfile.flush()
                        return
                    else:
                        self.wfile.write(f"ERROR: Unknown command {line}\n".encode())

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ras_server(request: pytest.FixtureRequest) -> Iterator[RasServer]:
    server = RasServer(**getattr(request, "param", {}))
    yield server
    server.stop()


def test_json_form_from_a_current_nccl(ras_server: RasServer) -> None:
    report = query_status("127.0.0.1", ras_server.port, timeout_s=5.0)
    assert report.status == "ok" and report.ok
    assert report.format == "json"
    assert report.server_protocol == 2
    assert ras_server.commands == ["CLIENT PROTOCOL 2", "SET FORMAT json", "VERBOSE STATUS"]
    assert report.data["communicators_count"] == 1
    summary = report.summary
    assert summary["nccl_version"] == "2.28.7"
    assert summary["missing_ranks"] == [
        {
            "communicator": "0x9a8b7c6d5e4f3a2b",
            "rank": 9,
            "host": "10.0.0.2",
            "pid": 4209,
            "status": {"unresponsive": True, "considered_dead": False},
        }
    ]
    assert summary["count_mismatches"] == [
        {"communicator": "0x9a8b7c6d5e4f3a2b", "op": "AllReduce", "max": 1201, "ranks_behind": [3]}
    ]
    assert summary["timeouts"] == 1
    assert json.loads(report.text) == JSON_REPORT


@pytest.mark.parametrize("ras_server", [{"json_ok": False}], indirect=True)
def test_text_form_from_an_older_nccl(ras_server: RasServer) -> None:
    report = query_status("127.0.0.1", ras_server.port, timeout_s=5.0)
    assert report.ok and report.format == "text"
    assert ras_server.commands == ["CLIENT PROTOCOL 2", "SET FORMAT json", "VERBOSE STATUS"]
    assert report.text == TEXT_REPORT
    assert report.summary["nccl_version"] == "2.26.2+cuda12.8"
    assert report.summary["statuses"] == {"MISMATCH": 1}
    assert report.summary["errors"] == []
    assert "Rank 3 has launched up to operation 1200 (node-a pid 4242)" in report.summary["warnings"]


def test_plain_status_and_collective_timeout(ras_server: RasServer) -> None:
    report = query_status(
        "127.0.0.1",
        ras_server.port,
        verbose=False,
        json_format=False,
        collective_timeout_s=2.5,
        timeout_s=5.0,
    )
    assert report.ok and report.format == "text"
    assert ras_server.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 2.5", "STATUS"]


def test_absent_service_is_reported_not_raised() -> None:
    started = time.monotonic()
    report = query_status("127.0.0.1", free_port(), timeout_s=5.0)
    assert report.status == "absent" and not report.ok
    assert "connection refused" in (report.error or "")
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("ras_server", [{"silent": True}], indirect=True)
def test_a_silent_service_times_out_within_the_limit(ras_server: RasServer) -> None:
    started = time.monotonic()
    report = query_status("127.0.0.1", ras_server.port, timeout_s=0.3)
    assert report.status == "timeout"
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("ras_server", [{"handshake": "HTTP/1.1 400 Bad Request"}], indirect=True)
def test_something_else_on_the_port_is_an_error(ras_server: RasServer) -> None:
    report = query_status("127.0.0.1", ras_server.port, timeout_s=2.0)
    assert report.status == "error" and "handshake" in (report.error or "")


def test_summaries_of_healthy_reports() -> None:
    healthy = {
        **JSON_REPORT,
        "communicators": [{"hash": "0x1", "ranks": [_rank(0, 7), _rank(1, 7)], "missing_ranks": []}],
    }
    summary = summarize_json(healthy)
    assert summary["count_mismatches"] == [] and summary["missing_ranks"] == []
    assert summarize_json([1, 2])["error"]
    text = TEXT_REPORT.replace("MISMATCH", "RUNNING").split("\nErrors\n")[0]
    assert summarize_text(text)["statuses"] == {"RUNNING": 1}


def test_listener_that_closes_at_once_is_an_error() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def accept_and_close() -> None:
            conn, _ = listener.accept()
            conn.close()

        threading.Thread(target=accept_and_close, daemon=True).start()
        report = query_status("127.0.0.1", port, timeout_s=2.0)
    assert report.status == "error"
    assert "closed" in (report.error or "") or "reset" in (report.error or "")
