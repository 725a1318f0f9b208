"""One job, many nodes through Prometheus (issues 21, 26): simulated nodes exporting their facts about
one job (8 ranks each), scraped by a real Prometheus that runs the shipped recording rules; one node's
daemon side reads the world back the way the daemon does (the bounded client, the parser, the pure
fusion rule) - from every node's raw facts (``[cluster] job_rules = "off"``, issue 21) and from the
rules' aggregates (``job_rules``, issue 26) - at 2, 256 and 1,024 nodes.

The simulated nodes are one loopback HTTP server in a child process (so its CPU is not counted)
serving each node's ``gpu_watchdog_fleet_*`` text, rendered by the daemon's own exposition code, at
``/node/<i>/metrics``. The job trains (stacks moving), then hangs: every node's ranks freeze in a
collective, rank 0 in the epoch-end barrier, except the last node, whose facts arrive
``LAST_LATE_S`` later (already frozen long enough). Measured:

- per query (the poller's thread): wall time, CPU of this process (client, JSON, parsing), bytes and
  series; per cycle (the loop's thread): the fusion rule's CPU;
- Prometheus's own CPU per query (its process's CPU over a burst of queries, less its background of
  scrapes and rules), and from it and the answer size, what every node polling every
  ``min_interval_s`` costs Prometheus: CPU cores and bytes sent per second (computed from the
  per-query cost, not run at that load on this machine);
- the time from the last node's facts (first served) to the job-wide verdict (``complete``, the odd
  rank named), with the shipped ``min_interval_s`` (5 s).

Baseline side by side: the raw facts at the same size (and the 2-node job).
"""

from __future__ import annotations

import json
import os
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
from gpu_triage.signals.fleet.facts import NodeJobFacts, RankFacts
from gpu_triage.signals.fleet.fusion import FleetState, FusionConfig, fuse
from gpu_triage.signals.fleet.prom_client import PromClient, PromError
from gpu_triage.signals.fleet.remote import RemoteFacts, job_query, remote_facts
from gpu_triage.signals.fleet.summary import job_summary, summary_query
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.signals.stacks.dumps import RankStack, StackInfo, StackPhase, StackSummary
from gpu_triage.signals.stacks.stack_facts import stack_facts

JOB = "master-10.0.0.1:29500"
PER_NODE = 8
LAST_LATE_S = 20.0
FROZEN_S = 20.0
MIN_INTERVAL_S = 5.0
SCRAPE_S = 5.0
REDUCE = "collective reduce_scatter_tensor @ train.py:40 main"
BARRIER = "collective barrier @ train.py:90 main"


def node_name(i: int) -> str:
    return f"node-{i:03d}"


def node_facts(i: int, now: float, hang_at: float, last_at: float, nodes: int) -> NodeJobFacts:
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
    return NodeJobFacts(
        JOB, node_name(i), now, nodes * PER_NODE, verdict, None, False, False, False, tuple(ranks)
    )


def serve(port: int, nodes: int, hang_at: float, last_at: float) -> None:
    """The simulated nodes (child process): ``/node/<i>/metrics``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import Collector

    from gpu_triage.signals.fleet.exposition import fleet_metrics

    class One(Collector):
        def __init__(self, facts: NodeJobFacts) -> None:
            self.facts = facts

        def collect(self):  # type: ignore[no-untyped-def]
            return list(fleet_metrics([self.facts]))

    bodies: dict[int, tuple[float, bytes]] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            if len(parts) != 3 or parts[0] != "node" or not parts[1].isdigit():
                self.send_error(404)
                return
            i, now = int(parts[1]), time.time()
            cached = bodies.get(i)
            if cached is None or now - cached[0] >= 1.0:  # one render per node per second
                registry = CollectorRegistry(auto_describe=False)
                registry.register(One(node_facts(i, now, hang_at, last_at, nodes)))
                cached = bodies[i] = (now, generate_latest(registry))
            body = cached[1]
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


RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "gpu-watchdog.rules.yml"
BURST = 20
"""Queries back to back to measure Prometheus's CPU per query."""


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(nodes: int, prometheus: str, window_s: float, scrape_s: float) -> dict[str, dict[str, float]]:
    """Both ways of reading the world from one Prometheus, one hang: raw facts and rules' aggregates."""
    port = _free_port()
    t0 = time.time()
    hang_at = t0 + 20.0 + nodes / 20.0  # the targets up first
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
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="gpuwd-bench-fleet-") as tmp:
        rules = Path(tmp) / "rules.yml"
        rules.write_text(RULES.read_text())
        config = {
            "global": {"scrape_interval": f"{scrape_s:g}s", "evaluation_interval": f"{scrape_s:g}s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": "gpu-watchdog",
                    "scrape_interval": f"{scrape_s:g}s",
                    "scrape_timeout": f"{min(scrape_s, 5.0):g}s",
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
        client = PromClient(url, timeout_s=10.0, max_bytes=256 << 20)
        cfg = FusionConfig(
            stale_after_s=30.0, frozen_s=FROZEN_S, fresh_s=30.0, min_samples=4, node_lost_after_s=60.0
        )
        queries: dict[str, list[tuple[float, float, int, int]]] = {"facts": [], "rules": []}
        fuse_cpu: dict[str, list[float]] = {"facts": [], "rules": []}
        found: dict[str, float] = {}
        odd: dict[str, str] = {}

        def ask(mode: str) -> RemoteFacts | None:
            c0 = time.process_time()
            try:
                if mode == "rules":
                    result = client.query(summary_query(JOB))
                    summary = job_summary(
                        JOB, result.samples, now=time.time(), stale_after_s=cfg.stale_after_s
                    )
                    remote = RemoteFacts(JOB, time.time(), summary=summary) if summary is not None else None
                else:
                    result = client.query(job_query(JOB))
                    remote = remote_facts(JOB, result.samples, own_node=node_name(0), asked_at=time.time())
            except PromError as e:
                print(f"  {mode} query failed: {e}")
                return None
            queries[mode].append(
                (result.seconds, time.process_time() - c0, result.bytes, len(result.samples))
            )
            return remote

        try:
            deadline = time.monotonic() + 60 + nodes / 10
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
            remote: dict[str, RemoteFacts | None] = {"facts": None, "rules": None}
            end = last_at + window_s
            while time.time() < end and len(found) < 2:
                now = time.time()
                if now >= hang_at and now - last_query >= MIN_INTERVAL_S:  # suspicious from the hang on
                    last_query = now
                    for mode in ("facts", "rules"):
                        if mode not in found:
                            remote[mode] = ask(mode)
                for mode in ("facts", "rules"):
                    if mode in found:
                        continue
                    c0 = time.process_time()
                    ev = fuse(
                        now,
                        own_node=node_name(0),
                        world_size=world,
                        local_ranks=list(range(PER_NODE)),
                        local_stacks=_local_stacks(now, hang_at),
                        remote=remote[mode],
                        cfg=cfg,
                    )
                    fuse_cpu[mode].append(time.process_time() - c0)
                    if ev.state is FleetState.COMPLETE and now >= last_at:
                        found[mode] = now - last_at
                        odd[mode] = ev.named_odd()
                time.sleep(max(0.0, 1.0 - (time.time() - now)))  # the daemon's 1 s process period
            # Prometheus's CPU per query: a burst of each, less its background (scrapes, rules) over as
            # long right after
            prom_cpu: dict[str, float] = {}
            for mode in ("facts", "rules"):
                w0, c0 = time.monotonic(), _cpu_s(prom.pid)
                for _ in range(BURST):
                    ask(mode)
                w1, c1 = time.monotonic(), _cpu_s(prom.pid)
                time.sleep(w1 - w0)
                background = _cpu_s(prom.pid) - c1
                prom_cpu[mode] = max(0.0, (c1 - c0) - background) / BURST
            # what the rules cost, once per evaluation whatever the number of pollers
            rules_eval_s = float("nan")
            try:
                for text in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
                    if (
                        text.startswith("prometheus_rule_group_last_duration_seconds")
                        and "gpu-watchdog-job" in text
                    ):
                        rules_eval_s = float(text.rsplit(" ", 1)[1])
            except (httpx.HTTPError, ValueError):
                pass
        finally:
            client.close()
            prom.terminate()
            child.terminate()
            prom.wait(30)
            child.wait(10)
    for mode in ("facts", "rules"):
        qs = queries[mode]
        n = max(1, len(qs))
        out[mode] = {
            "query_wall_s": sorted(q[0] for q in qs)[len(qs) // 2] if qs else float("nan"),
            "query_cpu_s": sorted(q[1] for q in qs)[len(qs) // 2] if qs else float("nan"),
            "bytes": sum(q[2] for q in qs) / n,
            "series": sum(q[3] for q in qs) / n,
            "fuse_cpu_s": sorted(fuse_cpu[mode])[len(fuse_cpu[mode]) // 2]
            if fuse_cpu[mode]
            else float("nan"),
            "found_after_s": found.get(mode, float("nan")),
            "prom_cpu_s": prom_cpu.get(mode, float("nan")),
            "odd": odd.get(mode, ""),  # type: ignore[dict-item]
            "rules_eval_s": rules_eval_s,
        }
    return out


def _report(nodes: int, m: dict[str, dict[str, float]]) -> None:
    new, old = m["rules"], m["facts"]
    every = nodes / MIN_INTERVAL_S  # queries per second with every node of the job polling
    print(
        f"  -- {nodes} nodes x {PER_NODE} ranks: rules' aggregates (new) vs every node's raw facts (baseline)"
    )
    line("answer size", new["bytes"] / 1024, "KiB", baseline=old["bytes"] / 1024, budget="<= 64 KiB",
         ok=new["bytes"] <= 64 << 10, higher_is_better=False)  # fmt: skip
    line("series per answer", new["series"], "series", baseline=old["series"], higher_is_better=False)
    line("daemon CPU per query (client, JSON, parse)", 1000 * new["query_cpu_s"], "ms",
         baseline=1000 * old["query_cpu_s"], budget="<= 10 ms", ok=new["query_cpu_s"] <= 0.010,
         higher_is_better=False)  # fmt: skip
    line("query wall time (median)", 1000 * new["query_wall_s"], "ms", baseline=1000 * old["query_wall_s"],
         higher_is_better=False)  # fmt: skip
    line("fusion rule CPU per cycle (median)", 1000 * new["fuse_cpu_s"], "ms",
         baseline=1000 * old["fuse_cpu_s"], higher_is_better=False)  # fmt: skip
    line("Prometheus CPU per query", 1000 * new["prom_cpu_s"], "ms", baseline=1000 * old["prom_cpu_s"],
         higher_is_better=False)  # fmt: skip
    line("Prom. CPU, all nodes polling (computed)", every * new["prom_cpu_s"], "cores",
         baseline=every * old["prom_cpu_s"], higher_is_better=False)  # fmt: skip
    line("Prom. MiB/s out, all nodes polling (computed)", every * new["bytes"] / (1 << 20), "MiB/s",
         baseline=every * old["bytes"] / (1 << 20), higher_is_better=False)  # fmt: skip
    line("gpu-watchdog-job rules: one evaluation (wall)", 1000 * new["rules_eval_s"], "ms",
         higher_is_better=False)  # fmt: skip
    line("last node's facts -> job-wide verdict", new["found_after_s"], "s", baseline=old["found_after_s"],
         higher_is_better=False)  # fmt: skip
    print(f"  odd rank named: rules {new['odd'] or '(none)'}; raw facts {old['odd'] or '(none)'}")


def run(quick: bool = False) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("  (prometheus not found: skipped)")
        return
    sizes = (2, 64) if quick else (2, 256, 1024)
    header(
        f"one job, many nodes: {', '.join(map(str, sizes))} simulated nodes x {PER_NODE} ranks, one real "
        f"Prometheus running the shipped rules ({SCRAPE_S:g} s scrapes, as shipped); the new way (the "
        "rules' aggregates) beside the baseline (every node's raw facts)"
    )
    for nodes in sizes:
        _report(nodes, _measure(nodes, prometheus, 90.0, SCRAPE_S))


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    else:
        run(quick="--quick" in sys.argv)
        print(json.dumps({"ok": True}))
