"""``gpu-watchdog status [--url URL] [--json]``: one daemon's ``/status`` as tables.

GPUs (state, power against the limit, utilisation, since when) and jobs (verdict, onset, raised,
steps, the evidence signals behind the verdict). ``--json`` prints the daemon's ``/status`` document
as it came (the REST contract), or ``{"url", "error"}`` when there is none.

Exit codes (contract, as for ``cluster``): 0 ok; 1 a deadlock verdict on some job; 2 the daemon is
unreachable or answers something that is not a ``/status`` document (the URL is named).
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

import httpx

from gpu_triage.cluster import (
    DEADLOCK_VERDICTS,
    DEFAULT_TIMEOUT_S,
    EXIT_DEADLOCK,
    EXIT_OK,
    EXIT_UNREACHABLE,
    duration,
    fetch_status,
    table,
    utc,
)

DEFAULT_URL = "http://127.0.0.1:9410"
MAX_EVIDENCE_CHARS = 100


def _watts(value: Any) -> str:
    return "-" if value is None else f"{value:.0f} W"


def _power(gpu: dict[str, Any]) -> str:
    power, limit = gpu.get("power_w"), gpu.get("power_limit_w")
    if power is None:
        return "-"
    if limit:
        return f"{_watts(power)} / {_watts(limit)} ({power / limit:.0%})"
    return _watts(power)


def _ratio(value: Any) -> str:
    return "-" if value is None else f"{value:.0%}"


def _since(epoch: Any, now: Any) -> str:
    if epoch is None:
        return "-"
    age = f" ({duration(now - epoch)} ago)" if now is not None else ""
    return f"{utc(epoch)}{age}"


def _steps(job: dict[str, Any]) -> str:
    steps = [r["step"] for r in job.get("ranks", []) if r.get("step") is not None]
    if not steps:
        return "-"
    low, high = min(steps), max(steps)
    return str(high) if low == high else f"{low}..{high}"


def _evidence_value(value: Any) -> str:
    text = json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= MAX_EVIDENCE_CHARS else text[: MAX_EVIDENCE_CHARS - 3] + "..."


def render(status: dict[str, Any], url: str) -> str:
    """The human view of one ``/status`` document."""
    now = status.get("time")
    mode = status.get("mode") or "-"
    if status.get("armed"):
        mode += " (armed)"
    head = [
        f"{status['node']} ({url}): source {status.get('source', '-')}, mode {mode}, "
        f"cycle {status.get('cycle', '-')}, version {status.get('version') or '-'}",
        f"cycle at {utc(now)}; last telemetry sample {_since(status.get('last_sample_time'), now)}",
        "",
    ]
    gpu_rows = [
        [
            str(gpu["gpu"]),
            str(gpu.get("model") or "-"),
            gpu["state"],
            _power(gpu),
            _ratio(gpu.get("utilization_ratio")),
            _since(gpu.get("state_since"), now),
        ]
        for gpu in status["gpus"]
    ]
    lines = head
    if gpu_rows:
        lines.append(table(["GPU", "MODEL", "STATE", "POWER", "UTIL", "SINCE"], gpu_rows))
    else:
        lines.append("No GPU telemetry (source none, or no GPU found).")
    lines.append("")
    if not status["jobs"]:
        lines.append("No training job found (no progress files and no GPU processes).")
        return "\n".join(lines)
    job_rows = [
        [
            job["job"],
            job["verdict"] + (f" ({job['cause']})" if job.get("cause") else ""),
            _since(job.get("onset"), now),
            _since(job.get("raised"), now),
            str(len(job.get("ranks", []))),
            _steps(job),
        ]
        for job in status["jobs"]
    ]
    lines.append(table(["JOB", "VERDICT", "ONSET", "RAISED", "RANKS", "STEPS"], job_rows))
    for job in status["jobs"]:
        evidence = job.get("evidence") or {}
        if evidence:
            lines.append(f"  {job['job']} evidence:")
            lines.extend(f"    {signal}: {_evidence_value(value)}" for signal, value in evidence.items())
    return "\n".join(lines)


def exit_code(status: dict[str, Any]) -> int:
    return EXIT_DEADLOCK if any(job["verdict"] in DEADLOCK_VERDICTS for job in status["jobs"]) else EXIT_OK


def run(
    url: str = DEFAULT_URL,
    *,
    as_json: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Fetch one daemon's ``/status``, print it, return the exit code."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    with httpx.Client(timeout=httpx.Timeout(timeout_s)) as client:
        fetched = fetch_status(client, url, timeout_s=timeout_s)
    if fetched.status is None:
        err.write(f"gpu-watchdog status: error: {fetched.url}: {fetched.error}\n")
        if as_json:
            json.dump({"url": fetched.url, "error": fetched.error}, out)
            out.write("\n")
        return EXIT_UNREACHABLE
    if as_json:
        json.dump(fetched.status, out, indent=1, allow_nan=False)
        out.write("\n")
    else:
        out.write(render(fetched.status, fetched.url) + "\n")
    return exit_code(fetched.status)
