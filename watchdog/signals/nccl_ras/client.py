"""A small client of NCCL's RAS socket (NCCL >= 2.24): what ``ncclras -v`` asks, in text or JSON.

The protocol, as NCCL's own client (``src/ras/client.cc``) and server (``src/ras/client_support.cc``)
speak it - newline-terminated ASCII commands over TCP, by default to ``localhost:28028`` (a job may move
it with ``NCCL_RAS_ADDR``):

1. the client sends ``CLIENT PROTOCOL <n>`` (NCCL's client sends 2); the server answers
   ``SERVER PROTOCOL <m>`` (a different ``m`` is only a warning);
2. optionally ``TIMEOUT <seconds>`` -> ``OK`` (how long the local NCCL process waits for its peers
   while gathering; default 5 s per leg);
3. optionally ``SET FORMAT json`` -> ``OK`` (NCCL >= 2.28.7; older servers answer
   ``ERROR: Unknown command ...``, and this client then reads the text form);
4. ``STATUS`` or ``VERBOSE STATUS``: the server streams the report and closes the connection.

The text report starts with ``NCCL version ...``, a ``Job summary`` table and a ``Communicators...``
section whose status column reads ``RUNNING``, ``INIT``, ``FINALIZE``, ``ABORT``, ``MISMATCH``
(launched-operation counts differ between ranks) or ``INCOMPLETE`` (missing ranks), followed by
``Errors`` and ``Warnings`` sections. The JSON report is one object: ``nccl_version``,
``cuda_runtime_version``, ``cuda_driver_version``, ``timestamp``, ``communicators_count``,
``communicators`` (each with ``hash``, ``size``, ``ranks`` - ``rank``, ``host``, ``pid``, ``cuda_dev``,
``nvml_dev``, ``status``, ``collective_counts`` - and ``missing_ranks``) and ``ras``
(``collection_time_sec``, ``timeouts_count``).

Absence is normal: no NCCL job, NCCL < 2.24, ``NCCL_RAS_ENABLE=0``, or another job on the node holding
the port. :func:`query_status` never raises; a refused connection is ``status="absent"``.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 28028
CLIENT_PROTOCOL = 2
MAX_REPORT_BYTES = 16 * 1024 * 1024
TEXT_STATUSES = ("RUNNING", "INIT", "FINALIZE", "ABORT", "MISMATCH", "INCOMPLETE", "ERROR")


@dataclass(frozen=True, slots=True)
class RasReport:
    status: str
    """``ok``, ``absent`` (nothing listens), ``timeout`` or ``error``."""
    format: str | None = None
    """``json`` or ``text`` (what the server sent)."""
    text: str = ""
    """The raw report as received."""
    data: Any = None
    """The parsed JSON report (JSON form only)."""
    server_protocol: int | None = None
    error: str | None = None
    duration_s: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "format": self.format,
            "server_protocol": self.server_protocol,
            "error": self.error,
            "duration_s": round(self.duration_s, 3),
            "summary": self.summary,
        }


class _Conn:
    """Line-oriented reads over a socket with one overall deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buffer = b""

    def _settimeout(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.sock.settimeout(left)

    def send_line(self, line: str) -> None:
        self._settimeout()
        self.sock.sendall(line.encode("ascii") + b"\n")

    def read_line(self) -> str:
        while b"\n" not in self.buffer:
            self._settimeout()
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the RAS server closed the connection")
            self.buffer += chunk
            if len(self.buffer) > 64 * 1024:
                raise ConnectionError("no line end within 64 KiB")
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8", "replace").rstrip("\r")

    def read_to_eof(self) -> bytes:
        out = bytearray(self.buffer)
        self.buffer = b""
        while True:
            self._settimeout()
            chunk = self.sock.recv(65536)
            if not chunk:
                return bytes(out)
            out += chunk
            if len(out) > MAX_REPORT_BYTES:
                raise ConnectionError(f"report larger than {MAX_REPORT_BYTES} bytes")


def query_status(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    verbose: bool = True,
    json_format: bool = True,
    timeout_s: float = 10.0,
    collective_timeout_s: float | None = None,
) -> RasReport:
    """Ask the RAS service for its (``VERBOSE``) ``STATUS``. ``timeout_s`` bounds the whole exchange;
    ``collective_timeout_s`` is sent as ``TIMEOUT`` (how long NCCL waits for its peers). With
    ``json_format`` the JSON form is requested and the text form accepted from servers that refuse."""
    started = time.monotonic()
    deadline = started + timeout_s

    def done(status: str, **kw: Any) -> RasReport:
        return RasReport(status, duration_s=time.monotonic() - started, **kw)

    try:
        sock = socket.create_connection((host, port), timeout=max(0.01, timeout_s))
    except ConnectionRefusedError:
        return done("absent", error=f"connection refused: no NCCL RAS listener on {host}:{port}")
    except TimeoutError:
        return done("timeout", error=f"connecting to {host}:{port} timed out")
    except OSError as e:
        return done("absent" if _unreachable(e) else "error", error=f"{host}:{port}: {e}")
    server_protocol: int | None = None
    fmt = "text"
    try:
        with sock:
            conn = _Conn(sock, deadline)
            conn.send_line(f"CLIENT PROTOCOL {CLIENT_PROTOCOL}")
            answer = conn.read_line()
            if not answer.upper().startswith("SERVER PROTOCOL "):
                return done("error", error=f"unexpected handshake answer: {answer[:200]!r}")
            number = answer[len("SERVER PROTOCOL ") :].strip()
            server_protocol = int(number) if number.isdigit() else None
            if collective_timeout_s is not None:
                conn.send_line(f"TIMEOUT {collective_timeout_s:g}")
                answer = conn.read_line()
                if answer.upper() != "OK":
                    return done(
                        "error", error=f"TIMEOUT refused: {answer[:200]!r}", server_protocol=server_protocol
                    )
            if json_format:
                conn.send_line("SET FORMAT json")
                answer = conn.read_line()
                fmt = "json" if answer.upper() == "OK" else "text"
            conn.send_line("VERBOSE STATUS" if verbose else "STATUS")
            raw = conn.read_to_eof()
    except TimeoutError:
        return done(
            "timeout", error=f"no complete answer within {timeout_s:g} s", server_protocol=server_protocol
        )
    except (OSError, ConnectionError, UnicodeEncodeError) as e:
        return done("error", error=str(e), server_protocol=server_protocol)
    text = raw.decode("utf-8", "replace")
    if fmt == "json":
        try:
            data = json.loads(text)
        except ValueError as e:
            return done(
                "error",
                format="json",
                text=text,
                error=f"invalid JSON report: {e}",
                server_protocol=server_protocol,
            )
        return done(
            "ok",
            format="json",
            text=text,
            data=data,
            server_protocol=server_protocol,
            summary=summarize_json(data),
        )
    return done("ok", format="text", text=text, server_protocol=server_protocol, summary=summarize_text(text))


def _unreachable(error: OSError) -> bool:
    return isinstance(error, (ConnectionError, socket.gaierror)) or error.errno in (99, 101, 111, 113)


# --------------------------------------------------------------------------------------------------
# Summaries (pure): the few facts worth putting in an alert or an index.


_VERSION = re.compile(r"NCCL version (\S+)")


def summarize_text(text: str) -> dict[str, Any]:
    """NCCL version, the communicator statuses seen, and the lines of the Errors/Warnings sections."""
    version = _VERSION.search(text)
    statuses: dict[str, int] = {}
    sections: dict[str, list[str]] = {"errors": [], "warnings": []}
    current: str | None = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        underline = i + 1 < len(lines) and set(lines[i + 1].strip()) == {"="}
        if underline and stripped in ("Errors", "Warnings"):
            current = stripped.lower()
            continue
        if underline or set(stripped) == {"="}:
            if underline:
                current = None
            continue
        if current is not None and stripped:
            sections[current].append(stripped)
        for word in stripped.split():
            if word in TEXT_STATUSES and current is None:
                statuses[word] = statuses.get(word, 0) + 1
    return {
        "nccl_version": version.group(1) if version else None,
        "statuses": statuses,
        "errors": sections["errors"][:50],
        "warnings": sections["warnings"][:50],
    }


def summarize_json(data: Any) -> dict[str, Any]:
    """Communicators, missing ranks, and whether the ranks' launched-collective counts differ
    (a rank behind the others in a communicator is the usual culprit of a hang)."""
    if not isinstance(data, Mapping):
        return {"error": "the JSON report is not an object"}
    comms = data.get("communicators") or []
    mismatched: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    for comm in comms if isinstance(comms, list) else []:
        if not isinstance(comm, Mapping):
            continue
        ranks = [r for r in comm.get("ranks") or [] if isinstance(r, Mapping)]
        counts = {r.get("rank"): r.get("collective_counts") or {} for r in ranks}
        ops = {op for c in counts.values() if isinstance(c, Mapping) for op in c}
        for op in sorted(ops):
            by_rank = {rank: c.get(op) for rank, c in counts.items() if isinstance(c, Mapping)}
            if len(set(by_rank.values())) > 1:
                top = max(v for v in by_rank.values() if isinstance(v, int))
                behind = sorted(r for r, v in by_rank.items() if v != top and r is not None)
                mismatched.append(
                    {"communicator": comm.get("hash"), "op": op, "max": top, "ranks_behind": behind}
                )
        for m in comm.get("missing_ranks") or []:
            if isinstance(m, Mapping):
                missing.append(
                    {
                        "communicator": comm.get("hash"),
                        "rank": m.get("rank"),
                        "host": m.get("host"),
                        "pid": m.get("pid"),
                        "status": m.get("status"),
                    }
                )
    return {
        "nccl_version": data.get("nccl_version"),
        "communicators": data.get("communicators_count", len(comms) if isinstance(comms, list) else None),
        "count_mismatches": mismatched[:50],
        "missing_ranks": missing[:50],
        "timeouts": (data.get("ras") or {}).get("timeouts_count")
        if isinstance(data.get("ras"), Mapping)
        else None,
    }


__all__ = ["DEFAULT_PORT", "RasReport", "query_status", "summarize_json", "summarize_text"]
