"""``gpu-watchdog slurm-health-check``: Slurm's ``HealthCheckProgram`` asks the node's daemon whether
the node can take work, and drains it when not.

slurm.conf (HealthCheckProgram takes no arguments: deploy/slurm/health-check.sh runs this with
--drain)::

    HealthCheckProgram=/etc/slurm/gpu-watchdog/health-check.sh
    HealthCheckInterval=60
    HealthCheckNodeState=ANY

slurmd runs it as root every ``HealthCheckInterval`` seconds (its exit status is only logged: the
program drains the node itself, with ``scontrol update nodename=<node> state=drain reason=...``).
Reasons, from the daemon's ``GET /status`` (:func:`health_reasons`, pure):

- a **wedged or lost GPU**: a GPU whose state is ``unknown`` with no power reading for
  ``--unknown-after`` seconds (the daemon's NVML reads time out or fail: a wedged GPU, ``GpuIsLost``);
- a job whose verdict is ``telemetry_lost`` (the daemon cannot see the GPUs of a running job);
- an **unhealthy node verdict**: the daemon's node health (``/status``'s ``node_health``, or an object
  under ``node``; anything else is unknown and drains nothing) is ``unhealthy`` - each unhealthy GPU is
  named with its faults, ``GPU 3 Xid 79``, as the daemon's own drain names them (:func:`node_reasons`);
  ``degraded`` (a throttle, a correctable ECC burst, a PCIe width drop) drains nothing;
- a **stale daemon**: its last cycle is older than ``--stale-after`` seconds (its loop is stuck);
- a **dead daemon** (``/status`` unreachable) is its own reason: a node whose watchdog is down runs
  jobs nobody watches. ``--on-unreachable ignore`` reports it without draining (exit 2).

**Slow is not dead.** A busy daemon (a ``/metrics`` flood, a loaded node) may answer late; draining a
node for that would take it out of service for nothing. The check first asks the cheap ``/healthz``,
up to ``--tries`` times with a doubling pause (``--backoff``: 1, 2, 4 s...) between tries that got no
answer, and counts the daemon unreachable only when every try failed. A ``/healthz`` that answers
(200) while ``/status`` does not (after as many tries) is a slow daemon: reported, never drained. The
loop's age comes from ``/healthz`` (``last_cycle_age_s``, measured by the daemon on its monotonic
clock), so a step of the node's wall clock never reads as a stuck loop.

Exit status: 0 healthy; 1 a reason was found (drained with ``--drain``); 2 the daemon was unreachable;
3 the drain itself failed. The node is never resumed automatically: once the cause is fixed,
``scontrol update nodename=<node> state=resume``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNREACHABLE = 2
EXIT_DRAIN_FAILED = 3
REASON_PREFIX = "gpu-watchdog: "
MAX_REASON_CHARS = 200
MAX_STATUS_BYTES = 16 * 1024 * 1024


def health_reasons(
    status: Mapping[str, Any],
    *,
    now_s: float,
    unknown_after_s: float = 60.0,
    stale_after_s: float = 60.0,
    cycle_age_s: float | None = None,
) -> list[str]:
    """Why this node should take no work, from a ``/status`` document (empty: healthy). Pure.
    ``cycle_age_s``: the loop's age as ``/healthz`` measured it (monotonic); None: ``now_s - time``."""
    reasons: list[str] = []
    cycle_time = status.get("time")
    if cycle_age_s is None and isinstance(cycle_time, int | float):
        cycle_age_s = now_s - cycle_time
    if cycle_age_s is not None and cycle_age_s > stale_after_s:
        reasons.append(f"daemon's last cycle was {cycle_age_s:.0f} s ago")
    doc_time = cycle_time if isinstance(cycle_time, int | float) else now_s
    for gpu in status.get("gpus") or ():
        if not isinstance(gpu, Mapping) or gpu.get("state") != "unknown" or gpu.get("power_w") is not None:
            continue
        since = gpu.get("state_since")
        unread_s = doc_time - since if isinstance(since, int | float) else None
        if unread_s is None or unread_s >= unknown_after_s:
            how_long = f" for {unread_s:.0f} s" if unread_s is not None else ""
            reasons.append(f"gpu {gpu.get('gpu')} unreadable{how_long} (wedged or lost)")
    for job in status.get("jobs") or ():
        if isinstance(job, Mapping) and job.get("verdict") == "telemetry_lost":
            reasons.append(f"job {job.get('job')} telemetry_lost")
    reasons.extend(node_reasons(status))
    return reasons


NODE_LEVELS = ("healthy", "degraded", "unhealthy")
MAX_NODE_REASONS = 16


def node_verdict(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The daemon's node verdict in ``/status`` (``node_health``, else an object under ``node``), or
    None when it reports none (an older daemon: ``node`` is its name) - unknown, never a reason."""
    for key in ("node_health", "node"):
        doc = status.get(key)
        if isinstance(doc, Mapping) and doc.get("level") in NODE_LEVELS:
            return doc
    return None


def _fault_name(f: Mapping[str, Any]) -> str:
    xid = f.get("xid")
    if isinstance(xid, int) and not isinstance(xid, bool):
        return f"Xid {xid}"
    kind = f.get("kind")
    return "".join(c for c in str(kind)[:40] if c.isalnum() or c in "_-") or "fault"


def node_reasons(status: Mapping[str, Any]) -> list[str]:
    """``GPU 3 Xid 79``, ... for an unhealthy node verdict (empty otherwise). Pure, bounded."""
    node = node_verdict(status)
    if node is None or node.get("level") != "unhealthy":
        return []
    out: list[str] = []
    gpus = node.get("gpus")
    for g in gpus if isinstance(gpus, list) else ():
        if not isinstance(g, Mapping) or g.get("level") != "unhealthy":
            continue
        index = g.get("gpu")
        where = f"GPU {index}" if isinstance(index, int) and not isinstance(index, bool) else "GPU ?"
        findings = g.get("findings")
        faults = [
            f"{where} {_fault_name(f)}"
            for f in (findings if isinstance(findings, list) else ())
            if isinstance(f, Mapping) and f.get("level") == "unhealthy"
        ]
        out.extend(faults or [f"{where} unhealthy"])
    wide = node.get("findings")
    out.extend(
        f"node {_fault_name(f)}"
        for f in (wide if isinstance(wide, list) else ())
        if isinstance(f, Mapping) and f.get("level") == "unhealthy"
    )
    out = list(dict.fromkeys(out))[:MAX_NODE_REASONS]
    return out or ["node unhealthy"]


def drain_reason(reasons: Sequence[str]) -> str:
    """One line for ``scontrol ... reason=`` (Slurm shows it in ``sinfo -R``), bounded."""
    text = REASON_PREFIX + "; ".join(reasons)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def drain_argv(scontrol: str, node: str, reason: str) -> list[str]:
    return [scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason}"]


def node_name(explicit: str | None, environ: Mapping[str, str]) -> str:
    """``--node``, else ``$SLURMD_NODENAME`` (set by slurmd for its health check), else the short hostname."""
    return explicit or environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def fetch_status(url: str, timeout_s: float, path: str = "/status") -> dict[str, Any]:
    """``GET <url><path>``; raises OSError (unreachable, HTTP error) or ValueError (not a JSON object)."""
    with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout_s) as response:
        body = response.read(MAX_STATUS_BYTES + 1)
    if len(body) > MAX_STATUS_BYTES:
        raise ValueError(f"{path} is larger than {MAX_STATUS_BYTES} bytes")
    return parse_status(body, path)


def parse_status(body: bytes, path: str = "/status") -> dict[str, Any]:
    """A JSON object from ``body``; ValueError for anything else (nesting too deep included: a hostile
    answer never crashes the check)."""
    try:
        document = json.loads(body)
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path} is not a JSON object")
    return document


@dataclass(frozen=True, slots=True)
class Probe:
    """What tries of one GET gave: a document (with its HTTP status), or the last error."""

    document: dict[str, Any] | None
    http_status: int | None
    error: str | None
    tries: int


def probe(
    url: str,
    path: str,
    *,
    timeout_s: float,
    tries: int,
    backoff_s: float,
    sleep: Callable[[float], None] = time.sleep,
    fetch: Callable[[str, float, str], dict[str, Any]] = fetch_status,
) -> Probe:
    """GET ``path`` up to ``tries`` times, pausing ``backoff_s``, then twice that, ... after each try
    that got no answer. An HTTP error status with a JSON body (``/healthz`` 503) is an answer."""
    error = "not tried"
    for attempt in range(max(1, tries)):
        if attempt:
            sleep(backoff_s * 2 ** (attempt - 1))
        try:
            return Probe(fetch(url, timeout_s, path), 200, None, attempt + 1)
        except urllib.error.HTTPError as e:
            try:
                document = json.loads(e.read(MAX_STATUS_BYTES))
            except (OSError, ValueError):
                document = None
            if isinstance(document, dict):
                return Probe(document, e.code, None, attempt + 1)
            error = f"HTTP {e.code}"
        except (OSError, ValueError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            error = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
    return Probe(None, None, error, max(1, tries))


def add_subparser(sub: Any) -> None:
    """Register ``slurm-health-check`` on the CLI's subparsers."""
    p = sub.add_parser(
        "slurm-health-check",
        help="Slurm HealthCheckProgram: drain this node when its GPUs or its watchdog are unwell",
        description=__doc__.split("\n\n", 1)[1].replace("``", "") if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  gpu-watchdog slurm-health-check                 # report only\n"
        "  gpu-watchdog slurm-health-check --drain         # what slurm.conf runs\n"
        "  gpu-watchdog slurm-health-check --url http://127.0.0.1:9410 --node gpu-a01 --drain",
    )
    p.add_argument("--url", default="http://127.0.0.1:9410", help="daemon URL (default %(default)s)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="S", help="HTTP timeout (default 5)")
    p.add_argument("--drain", action="store_true", help="drain the node through scontrol on a reason")
    p.add_argument("--node", help="Slurm node name (default $SLURMD_NODENAME, else the short hostname)")
    p.add_argument("--scontrol", default="scontrol", help="scontrol binary (default: on PATH)")
    p.add_argument(
        "--unknown-after",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds a GPU may stay unreadable before it counts (default 60)",
    )
    p.add_argument(
        "--stale-after",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds since the daemon's last cycle before it counts as stuck (default 60)",
    )
    p.add_argument(
        "--tries",
        type=int,
        default=3,
        metavar="N",
        help="tries of each request before the daemon counts as unreachable (default 3)",
    )
    p.add_argument(
        "--backoff",
        type=float,
        default=1.0,
        metavar="S",
        help="pause after the first failed try, doubled after each next one (default 1)",
    )
    p.add_argument(
        "--on-unreachable",
        choices=["drain", "ignore"],
        default="drain",
        help="a daemon that does not answer: drain (default, with --drain) or only report",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    node = node_name(args.node, os.environ)
    ask = {"timeout_s": args.timeout, "tries": args.tries, "backoff_s": args.backoff}
    health = probe(args.url, "/healthz", **ask)
    status = probe(args.url, "/status", **ask) if health.document is not None else health
    if status.document is None or status.http_status != 200:
        what = "/healthz" if health.document is None else "/status"
        error = status.error or f"HTTP {status.http_status}"
        print(
            f"gpu-watchdog slurm-health-check: {args.url}{what}: no answer in {status.tries} tries ({error})",
            file=sys.stderr,
        )
        if health.document is not None and health.http_status == 200:
            # /healthz answers and says the loop is fine: a slow daemon, not a dead one - never drained
            print(f"node {node}: healthy (daemon slow: {what} did not answer, /healthz did)")
            return EXIT_HEALTHY
        if args.on_unreachable == "ignore":
            return EXIT_UNREACHABLE
        reasons = [f"daemon unreachable at {args.url} ({error}, {status.tries} tries)"]
        code = EXIT_UNREACHABLE
    else:
        age = health.document.get("last_cycle_age_s") if health.document is not None else None
        reasons = health_reasons(
            status.document,
            now_s=time.time(),
            unknown_after_s=args.unknown_after,
            stale_after_s=args.stale_after,
            cycle_age_s=float(age) if isinstance(age, int | float) and not isinstance(age, bool) else None,
        )
        code = EXIT_UNHEALTHY if reasons else EXIT_HEALTHY
    if not reasons:
        print(f"node {node}: healthy")
        return EXIT_HEALTHY
    reason = drain_reason(reasons)
    print(f"node {node}: {reason}")
    if args.drain:
        try:
            done = subprocess.run(
                drain_argv(args.scontrol, node, reason), capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"gpu-watchdog slurm-health-check: cannot drain {node}: {e}", file=sys.stderr)
            return EXIT_DRAIN_FAILED
        if done.returncode != 0:
            print(f"gpu-watchdog slurm-health-check: scontrol: {done.stderr.strip()}", file=sys.stderr)
            return EXIT_DRAIN_FAILED
        print(f"node {node}: drained")
    return code


__all__ = [
    "add_subparser",
    "drain_argv",
    "drain_reason",
    "fetch_status",
    "health_reasons",
    "node_name",
    "node_reasons",
    "node_verdict",
    "parse_status",
    "probe",
    "run",
]
