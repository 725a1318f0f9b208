"""``gpu-watchdog status [--url URL] [--json] [--watch [S]]``: one daemon's ``/status`` as tables.

GPUs (PCI bus id, state, health, power against the limit, utilisation, since when), the node health
(the verdict and each finding: level, blame, action, reason) and jobs (verdict, onset, raised,
steps, the ranks that lag, the evidence signals behind the verdict). Times are shown in this
machine's local time with their age (``2026-12-03 07:12:01 CET (1m10s ago)``). ``--watch`` redraws
the view in place every few seconds until Ctrl-C. ``--json`` prints the daemon's ``/status``
document as it came (the REST contract), or ``{"url", "error"}`` when there is none.

Exit codes (contract, as for ``cluster``): 0 ok; 1 a deadlock verdict on some job; 2 the daemon is
unreachable or answers something that is not a ``/status`` document (the URL is named).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime, tzinfo
from typing import Any, TextIO

import httpx

from gpu_triage.cli.cluster import (
    DEADLOCK_VERDICTS,
    DEFAULT_TIMEOUT_S,
    EXIT_DEADLOCK,
    EXIT_OK,
    EXIT_UNREACHABLE,
    duration,
    fetch_status,
    table,
)

DEFAULT_URL = "http://127.0.0.1:9410"
MAX_EVIDENCE_CHARS = 100
MAX_CAUSE_CHARS = 60
"""The cause shown beside the verdict in the jobs table; longer ones are cut (the evidence has all)."""
TIME_KEY_SUFFIXES = ("_since", "_at", "_until", "onset")
TIME_MAP_KEYS = frozenset({"live_leases", "expired_leases"})
EPOCH_FLOOR_S = 1e9
"""Numbers above this under a time key are epoch seconds (2001 on); smaller ones are durations."""
LAG_STEPS = 1
"""A rank more than this many steps behind the job's furthest rank here is named as lagging."""
MAX_LAGGING_SHOWN = 8
CLEAR = "\x1b[H\x1b[2J"
"""Cursor home and clear screen: ``--watch`` redraws in place on a terminal."""


def local(epoch: Any, tz: tzinfo | None = None) -> str:
    """Epoch seconds as local time with its zone (``tz``: another zone, for tests), ``-`` for none."""
    if epoch is None:
        return "-"
    moment = (
        datetime.fromtimestamp(epoch, tz) if tz is not None else datetime.fromtimestamp(epoch).astimezone()
    )
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


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


def _since(epoch: Any, now: Any, tz: tzinfo | None = None) -> str:
    """Local time with its age, or how far ahead (a lease's end): ``... (1m10s ago)``, ``... (in 20.0 s)``."""
    if epoch is None:
        return "-"
    age = ""
    if now is not None:
        age = f" ({duration(now - epoch)} ago)" if now >= epoch else f" (in {duration(epoch - now)})"
    return f"{local(epoch, tz)}{age}"


def lagging_ranks(job: dict[str, Any], lag_steps: int = LAG_STEPS) -> list[tuple[int, int, int]]:
    """``(rank, step, steps behind)`` of each rank more than ``lag_steps`` behind the job's furthest
    rank on this node, furthest behind first."""
    steps = {r["rank"]: r["step"] for r in job.get("ranks", []) if r.get("step") is not None}
    if not steps:
        return []
    top = max(steps.values())
    behind = [(rank, step, top - step) for rank, step in steps.items() if top - step > lag_steps]
    return sorted(behind, key=lambda x: (-x[2], x[0]))


def _lagging(job: dict[str, Any]) -> str:
    behind = lagging_ranks(job)
    if not behind:
        return "-"
    text = ", ".join(f"{rank} (-{gap})" for rank, _step, gap in behind[:MAX_LAGGING_SHOWN])
    return text + (f" +{len(behind) - MAX_LAGGING_SHOWN} more" if len(behind) > MAX_LAGGING_SHOWN else "")


def _steps(job: dict[str, Any]) -> str:
    steps = [r["step"] for r in job.get("ranks", []) if r.get("step") is not None]
    if not steps:
        return "-"
    low, high = min(steps), max(steps)
    return str(high) if low == high else f"{low}..{high}"


def _is_epoch(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > EPOCH_FLOOR_S


def _is_time_key(key: str) -> bool:
    """Evidence keys whose values are epoch seconds (``steps_frozen_since``, ``live_leases``...)."""
    return key.endswith(TIME_KEY_SUFFIXES) or key in TIME_MAP_KEYS


def _evidence_value(key: str, value: Any, now: Any = None, tz: tzinfo | None = None) -> str:
    """One evidence entry as text; epoch seconds as local times with their age (the promise of the
    module docstring), also inside a per-rank map such as ``live_leases``."""
    if _is_time_key(key):
        if _is_epoch(value):
            return _since(value, now, tz)
        if isinstance(value, dict) and value and all(_is_epoch(v) or v is None for v in value.values()):
            items = [f"{k}: {_since(v, now, tz)}" for k, v in value.items()]
            text = "{" + ", ".join(items) + "}"
            return text if len(text) <= 3 * MAX_EVIDENCE_CHARS else text[: 3 * MAX_EVIDENCE_CHARS - 3] + "..."
    text = json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= MAX_EVIDENCE_CHARS else text[: MAX_EVIDENCE_CHARS - 3] + "..."


def _verdict_cell(job: dict[str, Any]) -> str:
    """``verdict (cause)``, the cause cut to keep the column narrow (the evidence block has it whole)."""
    cause = job.get("cause")
    if not cause:
        return str(job["verdict"])
    cause = str(cause)
    if len(cause) > MAX_CAUSE_CHARS:
        cause = cause[: MAX_CAUSE_CHARS - 3] + "..."
    return f"{job['verdict']} ({cause})"


def _blame(job: dict[str, Any]) -> str:
    """Whom the verdict blames (``job``, ``node``, ``network``, ``unknown``), with the first hardware
    fault behind a hardware blame: ``node (GPU 3 Xid 79)``; ``-`` from a daemon that says none."""
    raw = job.get("evidence")
    evidence: dict[str, Any] = raw if isinstance(raw, dict) else {}
    blame = job.get("blame") or evidence.get("blame")
    if not isinstance(blame, str):
        return "-"
    hardware = evidence.get("hardware")
    faults = (
        [h for h in hardware if isinstance(h, dict) and h.get("level") == "unhealthy"]
        if isinstance(hardware, list)
        else []
    )
    if blame in ("node", "network") and faults:
        f = faults[0]
        what = f"Xid {f['xid']}" if isinstance(f.get("xid"), int) else str(f.get("kind"))
        where = f"GPU {f['gpu']}" if isinstance(f.get("gpu"), int) else "node"
        return f"{blame} ({where} {what})"[:40]
    return blame[:20]


def render(status: dict[str, Any], url: str, *, tz: tzinfo | None = None) -> str:
    """The human view of one ``/status`` document (times in local time, or ``tz``)."""
    now = status.get("time")
    mode = status.get("mode") or "-"
    if status.get("armed"):
        mode += " (armed)"
    head = [
        f"{status['node']} ({url}): source {status.get('source', '-')}, mode {mode}, "
        f"cycle {status.get('cycle', '-')}, version {status.get('version') or '-'}",
        f"cycle at {local(now, tz)}; last telemetry sample {_since(status.get('last_sample_time'), now, tz)}",
        "",
    ]
    health = status.get("node_health") if isinstance(status.get("node_health"), dict) else None
    gpu_health = {g.get("gpu"): g for g in (health or {}).get("gpus") or [] if isinstance(g, dict)}
    gpu_rows = [
        [
            str(gpu["gpu"]),
            str(gpu.get("pci_bus_id") or "-"),
            str(gpu.get("model") or "-"),
            gpu["state"],
            str(gpu_health.get(gpu["gpu"], {}).get("level") or "-"),
            _power(gpu),
            _ratio(gpu.get("utilization_ratio")),
            _since(gpu.get("state_since"), now, tz),
        ]
        for gpu in status["gpus"]
    ]
    lines = head
    if gpu_rows:
        lines.append(table(["GPU", "PCI", "MODEL", "STATE", "HEALTH", "POWER", "UTIL", "SINCE"], gpu_rows))
    else:
        lines.append("No GPU telemetry (source none, or no GPU found).")
    lines.append("")
    if health is not None:
        lines.extend(_health_lines(health))
        lines.append("")
    if not status["jobs"]:
        lines.append("No training job found (no progress files and no GPU processes).")
        return "\n".join(lines)
    job_rows = [
        [
            job["job"],
            _verdict_cell(job),
            _blame(job),
            _since(job.get("onset"), now, tz),
            _since(job.get("raised"), now, tz),
            str(len(job.get("ranks", []))),
            _steps(job),
            _lagging(job),
        ]
        for job in status["jobs"]
    ]
    lines.append(table(["JOB", "VERDICT", "BLAME", "ONSET", "RAISED", "RANKS", "STEPS", "LAGGING"], job_rows))
    for job in status["jobs"]:
        evidence = dict(job.get("evidence") or {})
        cause = job.get("cause")
        if cause and len(str(cause)) > MAX_CAUSE_CHARS:
            evidence.setdefault("cause", cause)  # cut in the table: whole here
        limits = evidence.get("cannot_judge") or []
        if limits and isinstance(limits, list):
            said = "; ".join(f"{x.get('what')} ({x.get('why')})" for x in limits if isinstance(x, dict))
            lines.append(f"  {job['job']} cannot judge: {said}")
        if evidence:
            lines.append(f"  {job['job']} evidence:")
            lines.extend(
                f"    {signal}: {_evidence_value(signal, value, now, tz)}"
                for signal, value in evidence.items()
            )
    return "\n".join(lines)


MAX_REASON_CHARS = 100


def _health_lines(health: dict[str, Any]) -> list[str]:
    """The node verdict and, for each GPU or node-wide finding not healthy, its reasons as a table."""
    lines = [f"Node health: {health.get('level', '-')}"]
    rows = []
    for g in health.get("gpus") or []:
        for f in g.get("findings") or []:
            rows.append(_finding_row(str(g.get("gpu")), f))
    for f in health.get("findings") or []:
        rows.append(_finding_row(f"node ({f.get('pci_bus_id') or '-'})", f))
    if rows:
        lines.append(table(["GPU", "LEVEL", "BLAME", "ACTION", "COUNT", "REASON"], rows))
    for error in (health.get("read_errors") or [])[:5]:
        lines.append(f"  health read error: {error}")
    return lines


def _finding_row(where: str, f: dict[str, Any]) -> list[str]:
    reason = str(f.get("detail") or "-")
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[: MAX_REASON_CHARS - 3] + "..."
    return [
        where,
        str(f.get("level")),
        str(f.get("blame")),
        str(f.get("action")),
        str(f.get("count", 1)),
        reason,
    ]


def exit_code(status: dict[str, Any]) -> int:
    return EXIT_DEADLOCK if any(job["verdict"] in DEADLOCK_VERDICTS for job in status["jobs"]) else EXIT_OK


def run(
    url: str = DEFAULT_URL,
    *,
    as_json: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    out: TextIO | None = None,
    err: TextIO | None = None,
    watch_s: float | None = None,
    iterations: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Fetch one daemon's ``/status``, print it, return the exit code. With ``watch_s``, redraw every
    ``watch_s`` seconds (in place on a terminal) until Ctrl-C (or ``iterations`` views, for tests);
    the exit code is the last view's."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    if watch_s is None:
        return _once(url, as_json=as_json, timeout_s=timeout_s, out=out, err=err)
    code = EXIT_OK
    shown = 0
    try:
        while iterations is None or shown < iterations:
            if out.isatty():
                out.write(CLEAR)
            elif shown:
                out.write("\n")
            out.write(f"every {watch_s:g} s, Ctrl-C to stop; at {local(time.time())}\n")
            code = _once(url, as_json=as_json, timeout_s=timeout_s, out=out, err=err)
            out.flush()
            shown += 1
            if iterations is None or shown < iterations:
                sleep(watch_s)
    except KeyboardInterrupt:
        pass
    return code


def _once(url: str, *, as_json: bool, timeout_s: float, out: TextIO, err: TextIO) -> int:
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
