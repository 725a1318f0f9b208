"""One job, many nodes through Prometheus (issue 21): 256 simulated nodes exporting their facts about
one 2,048-rank job, scraped every second by a real Prometheus; one node's daemon side reads the other
255 nodes' facts back the way the daemon does (the bounded client, the parser, the pure fusion rule).

The simulated nodes are one loopback HTTP server in a child process (so its CPU is not counted)
serving each node's ``gpu_watchdog_fleet_*`` text, rendered by the daemon's own exposition code, at
``/node/<i>/metrics``. The job trains (stacks moving), then hangs: every node's ranks freeze in a
collective, rank 0 in the epoch-end barrier, except the last node, whose facts arrive
``LAST_LATE_S`` later (already frozen long enough). Measured:

- per query (the poller's thread): wall time, CPU of this process (client, JSON, parsing), bytes and
  series; per cycle (the loop's thread): the fusion rule's CPU;
- the time from the last node's facts (first served) to the job-wide verdict (``complete``, the odd
  rank named), with the shipped ``min_interval_s`` (5 s) and a 1 s scrape interval.

Baseline side by side: the same with 2 nodes of 8 ranks (a 16-rank job).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import yaml

from benchmarks.bench_daemon import _free_port
from benchmarks.common import header, line
from gpu_triage.signals.fleet.facts import JobFacts, RankFacts
from gpu_triage.signals.fleet.fusion import FleetState, FusionConfig, fuse
from gpu_triage.signals.fleet.prom_client import PromClient, PromError
from gpu_triage.signals.fleet.remote import job_query, remote_facts
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.signals.stacks.dumps import RankStack, StackInfo, StackPhase, StackSummary
from gpu_triage.signals.stacks.evidence import stack_facts

JOB = "master-10.0.0.1:29500"
PER_NODE = 8
LAST_LATE_S = 20.0
FROZEN_S = 20.0
MIN_INTERVAL_S = 5.0
REDUCE = "collective reduce_scatter_tensor @ train.py:40 main"
BARRIER = "collective barrier @ train.py:90 main"


def node_name(i: int) -> str:
    return f"node-{i:03d}"


def node_facts(i: int, now: float, hang_at: float, last_at: float, nodes: int) -> JobFacts:
    last = i == nodes - 1
    frozen_since = (last_at - FROZEN_S - 5) if last else hang_at
    frozen = now >= (last_at if last else hang_at)
    ranks = []
    for r in range(i * PER_NODE, (i + 1) * PER_NODE):
        if frozen:
            where = BARRIER if r == 0 else REDUCE
            ranks.append(RankFacts(r, "collective", where, frozen_since, now - 0.5))
        else:
            ranks.append(RankFacts(r, "forward", "forward @ model.py:10 forward", now - 0.5, now - 0.5))
    verdict = "stalled" if frozen else "healthy"
    return JobFacts(
        JOB, node_name(i), now, nodes * PER_NODE, verdict, None, False, False, False, tuple(ranks)
    )


def serve(port: int, nodes: int, hang_at: float, last_at: float) -> None:
    """The simulated nodes (child process): ``/node/<i>/metrics``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import Collector

    from gpu_triage.signals.fleet.exposition import fleet_metrics

    class One(Collector):
        def __init__(self, facts: JobFacts) -> None:
            self.facts = facts

        def collect(self):  # type: ignore[no-untyped-def]
            return list(fleet_metrics([self.facts]))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            if len(parts) != 3 or parts[0] != "node" or not parts[1].isdigit():
                self.send_error(404)
                return
            registry = CollectorRegistry(auto_describe=False)
            registry.register(One(node_facts(int(parts[1]), time.time(), hang_at, last_at, nodes)))
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def _local_stacks(now: float, hang_at: float):
    """Node 0's own stacks: its 8 ranks frozen in the collective (rank 0 in the barrier)."""
    ranks = {}
    for r in range(PER_NODE):
        info = StackInfo(
            StackPhase.COLLECTIVE,
            "barrier" if r == 0 else "reduce_scatter_tensor",
            "train.py:90 main" if r == 0 else "train.py:40 main",
            "b" if r == 0 else "r",
            "MainThread",
            (),
        )
        ranks[r] = RankStack(r, 1000 + r, info, now - 0.5, hang_at, 10)
    summary = StackSummary(ranks, None)
    return stack_facts(now, summary, [(r, 0.0) for r in range(PER_NODE)], None, StacksConfig(), None)


def _measure(nodes: int, prometheus: str, window_s: float) -> dict[str, float]:
    port = _free_port()
    t0 = time.time()
    hang_at = t0 + 8.0
    last_at = hang_at + LAST_LATE_S
    world = nodes * PER_NODE
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_fleet",
            "serve",
            str(port),
            str(nodes),
            str(hang_at),
            str(last_at),
        ]
    )
    with tempfile.TemporaryDirectory(prefix="gpuwd-bench-fleet-") as tmp:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "gpu-watchdog",
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{port}"],
                            "labels": {"__metrics_path__": f"/node/{i}/metrics", "node": node_name(i)},
                        }
                        for i in range(nodes)
                    ],
                }
            ],
        }
        (Path(tmp) / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_port = _free_port()
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp}/prometheus.yml",
                f"--storage.tsdb.path={tmp}/data",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{prom_port}"
        client = PromClient(url, timeout_s=3.0)
        cfg = FusionConfig(stale_after_s=15.0, frozen_s=FROZEN_S, fresh_s=30.0)
        queries: list[tuple[float, float, int, int]] = []
        fuse_cpu: list[float] = []
        found_after: float | None = None
        odd = ""
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    up = httpx.get(
                        f"{url}/api/v1/query", params={"query": "count(up == 1)"}, timeout=2
                    ).json()
                    if up["data"]["result"] and float(up["data"]["result"][0]["value"][1]) == nodes:
                        break
                except (httpx.HTTPError, KeyError, ValueError):
                    pass
                time.sleep(0.5)
            last_query = 0.0
            remote = None
            end = last_at + window_s
            while time.time() < end and found_after is None:
                now = time.time()
                if now >= hang_at and now - last_query >= MIN_INTERVAL_S:  # suspicious from the hang on
                    last_query = now
                    c0 = time.process_time()
                    try:
                        result = client.query(job_query(JOB))
                    except PromError as e:
                        print(f"  query failed: {e}")
                        continue
                    remote = remote_facts(JOB, result.samples, own_node=node_name(0), asked_at=time.time())
                    queries.append(
                        (result.seconds, time.process_time() - c0, result.bytes, len(result.samples))
                    )
                c0 = time.process_time()
                ev = fuse(
                    now,
                    own_node=node_name(0),
                    world_size=world,
                    local_ranks=list(range(PER_NODE)),
                    local_stacks=_local_stacks(now, hang_at),
                    remote=remote,
                    cfg=cfg,
                )
                fuse_cpu.append(time.process_time() - c0)
                if ev.state is FleetState.COMPLETE and now >= last_at:
                    found_after = now - last_at
                    odd = ev.named_odd()
                    break
                time.sleep(max(0.0, 1.0 - (time.time() - now)))  # the daemon's 1 s process period
        finally:
            client.close()
            prom.terminate()
            child.terminate()
            prom.wait(10)
            child.wait(10)
    n = max(1, len(queries))
    return {
        "query_wall_s": sorted(q[0] for q in queries)[len(queries) // 2] if queries else float("nan"),
        "query_cpu_s": sum(q[1] for q in queries) / n,
        "bytes": sum(q[2] for q in queries) / n,
        "series": sum(q[3] for q in queries) / n,
        "fuse_cpu_s": sorted(fuse_cpu)[len(fuse_cpu) // 2] if fuse_cpu else float("nan"),
        "found_after_s": found_after if found_after is not None else float("nan"),
        "odd": odd,  # type: ignore[dict-item]
    }


def run(quick: bool = False) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("  (prometheus not found: skipped)")
        return
    nodes = 64 if quick else 256
    header(
        f"one job, many nodes: {nodes} simulated nodes x {PER_NODE} ranks ({nodes * PER_NODE}-rank job) "
        f"scraped every 1 s by a real Prometheus; baseline: 2 nodes ({2 * PER_NODE} ranks)"
    )
    base = _measure(2, prometheus, 40.0)
    big = _measure(nodes, prometheus, 60.0)
    line(
        "query wall time (median)",
        1000 * big["query_wall_s"],
        "ms",
        baseline=1000 * base["query_wall_s"],
        budget="<= 3000 ms (cluster.timeout_s)",
        ok=big["query_wall_s"] <= 3.0,
        higher_is_better=False,
    )
    line(
        "CPU per query (client, JSON, parse)",
        1000 * big["query_cpu_s"],
        "ms",
        baseline=1000 * base["query_cpu_s"],
        higher_is_better=False,
    )
    line(
        "answer size",
        big["bytes"] / 1024,
        "KiB",
        baseline=base["bytes"] / 1024,
        budget="<= 32768 KiB (cluster.max_response_bytes)",
        ok=big["bytes"] <= 32 << 20,
        higher_is_better=False,
    )
    line("series per answer", big["series"], "series", baseline=base["series"], higher_is_better=False)
    line(
        "fusion rule CPU per cycle (median)",
        1000 * big["fuse_cpu_s"],
        "ms",
        baseline=1000 * base["fuse_cpu_s"],
        budget="<= 100 ms (a 1 s period)",
        ok=big["fuse_cpu_s"] <= 0.1,
        higher_is_better=False,
    )
    per_min = 60.0 / MIN_INTERVAL_S * big["query_cpu_s"]
    line("query CPU per minute while suspicious", per_min, "CPU-s/min", higher_is_better=False)
    line(
        "last node's facts -> job-wide verdict",
        big["found_after_s"],
        "s",
        baseline=base["found_after_s"],
        budget=f"<= {MIN_INTERVAL_S + 3:.0f} s (query interval + scrape + query)",
        ok=big["found_after_s"] <= MIN_INTERVAL_S + 3,
        higher_is_better=False,
    )
    print(f"  odd rank named: {big['odd'] or '(none)'}")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    else:
        run(quick="--quick" in sys.argv)
        print(json.dumps({"ok": True}))
