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
- a **stale daemon**: its last cycle is older than ``--stale-after`` seconds (its loop is stuck);
- a **dead daemon** (``/status`` unreachable) is its own reason: a node whose watchdog is down runs
  jobs nobody watches. ``--on-unreachable ignore`` reports it without draining (exit 2).

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
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNREACHABLE = 2
EXIT_DRAIN_FAILED = 3
REASON_PREFIX = "gpu-watchdog: "
MAX_REASON_CHARS = 200
MAX_STATUS_BYTES = 16 * 1024 * 1024


def health_reasons(
    status: Mapping[str, Any], *, now_s: float, unknown_after_s: float = 60.0, stale_after_s: float = 60.0
) -> list[str]:
    """Why this node should take no work, from a ``/status`` document (empty: healthy). Pure."""
    reasons: list[str] = []
    cycle_time = status.get("time")
    if isinstance(cycle_time, int | float) and now_s - cycle_time > stale_after_s:
        reasons.append(f"daemon's last cycle was {now_s - cycle_time:.0f} s ago")
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
    return reasons


def drain_reason(reasons: Sequence[str]) -> str:
    """One line for ``scontrol ... reason=`` (Slurm shows it in ``sinfo -R``), bounded."""
    text = REASON_PREFIX + "; ".join(reasons)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def drain_argv(scontrol: str, node: str, reason: str) -> list[str]:
    return [scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason}"]


def node_name(explicit: str | None, environ: Mapping[str, str]) -> str:
    """``--node``, else ``$SLURMD_NODENAME`` (set by slurmd for its health check), else the short hostname."""
    return explicit or environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def fetch_status(url: str, timeout_s: float) -> dict[str, Any]:
    """``GET <url>/status``; raises OSError (unreachable, HTTP error) or ValueError (not a JSON object)."""
    with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=timeout_s) as response:
        body = response.read(MAX_STATUS_BYTES + 1)
    if len(body) > MAX_STATUS_BYTES:
        raise ValueError(f"/status is larger than {MAX_STATUS_BYTES} bytes")
    document = json.loads(body)
    if not isinstance(document, dict):
        raise ValueError("/status is not a JSON object")
    return document


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
        "--on-unreachable",
        choices=["drain", "ignore"],
        default="drain",
        help="a daemon that does not answer: drain (default, with --drain) or only report",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    node = node_name(args.node, os.environ)
    try:
        status = fetch_status(args.url, args.timeout)
    except (OSError, ValueError) as e:
        print(f"gpu-watchdog slurm-health-check: {args.url}/status: {e}", file=sys.stderr)
        if args.on_unreachable == "ignore":
            return EXIT_UNREACHABLE
        reasons = [f"daemon unreachable at {args.url} ({type(e).__name__})"]
        code = EXIT_UNREACHABLE
    else:
        reasons = health_reasons(
            status, now_s=time.time(), unknown_after_s=args.unknown_after, stale_after_s=args.stale_after
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
    "run",
]
