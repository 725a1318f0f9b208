"""The Grafana dashboard against a REAL Prometheus scraping the REAL app.

The structural tests need nothing outside Python. The integration test starts Debian's ``prometheus``
on a free loopback port with the shipped scrape job and rules (deploy/prometheus/, only the targets
and intervals changed), scraping a real
:class:`~gpu_triage.serving.http_server.HttpServer` that serves the real app over a realistic,
live snapshot (8 GPUs, a 2-node job's 8 local ranks, one of them lagging, a
deadlock_suspected verdict), and a dcgm-exporter endpoint beside it, then runs every panel target's
and annotation's query through the HTTP API (``query_range`` for range targets, ``query`` for instant
ones) and requires data from each.

dcgm-exporter needs a real GPU and DCGM (the hardware boundary), so its side is a loopback HTTP server
serving dcgm-exporter's exposition as the exporter writes it (its default labels ``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``); the join with our series is
what is under test, and it must work on those labels as they are, without ``label_replace``.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpu_triage.model.evidence import JobEvidence
from gpu_triage.model.health import (
    Blame,
    FaultKind,
    FaultSource,
    GpuHealth,
    HardwareFinding,
    HealthLevel,
    NodeHealth,
    OperatorAction,
    XidCount,
)
from gpu_triage.model.snapshot import JobStatus, Snapshot
from gpu_triage.model.states import GPU_STATES, VERDICTS, GpuState, Mode, Verdict
from gpu_triage.serving.api import create_app
from gpu_triage.serving.http_server import HttpServer
from gpu_triage.serving.metrics import METRIC_NAMES
from gpu_triage.serving.publish import SnapshotHolder
from gpu_triage.signals.fleet.facts import NodeJobFacts, RankFacts
from tests.conftest import REPO, require_binary
from tests.ports import free_port
from tests.watchdog.snapshots import gpu_status, rank_status

DASHBOARD = REPO / "deploy" / "grafana" / "gpu-watchdog.json"
PROMETHEUS_YML = REPO / "deploy" / "prometheus" / "prometheus.yml"
RULES_YML = REPO / "deploy" / "prometheus" / "gpu-watchdog.rules.yml"

#: Values the test gives Grafana's variables: every node, every training job, 4 x the scrape interval.
VARIABLES = {"node": ".*", "training_job": ".*", "__rate_interval": "4s", "__interval": "1s"}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
RANGE_WINDOW_S = 8.0


@dataclass(frozen=True)
class Query:
    where: str
    expr: str
    instant: bool


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    return found


def queries(dashboard: dict[str, Any]) -> list[Query]:
    result = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            instant = bool(target.get("instant")) and not target.get("range", False)
            result.append(Query(f"panel {panel['title']!r} {target['refId']}", target["expr"], instant))
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            result.append(Query(f"annotation {annotation['name']!r}", annotation["expr"], False))
    return result


def substitute(expr: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in VARIABLES:
            raise AssertionError(f"no test value for ${name} in {expr!r}")
        return VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


# --------------------------------------------------------------------------------------------------
# Structure (no binaries)


def test_every_panel_is_placed_queried_and_uses_the_datasource_variable() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "gpu-watchdog"
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target.get("datasource", panel["datasource"]) == panel["datasource"]


def test_variables_are_declared_and_metric_names_exist() -> None:
    dashboard = load_dashboard()
    declared = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert {"datasource", "node", "training_job"} <= declared
    for query in queries(dashboard):
        for name in re.findall(r"\$\{?(\w+)", query.expr):
            assert name in declared | GRAFANA_BUILTINS, f"{query.where}: undeclared ${name}"
        for metric in re.findall(r"\bgpu_watchdog_\w+", query.expr):
            assert metric in METRIC_NAMES, f"{query.where}: unknown metric {metric}"
        assert "$" not in substitute(query.expr)


def _coded(expr: str, label: str) -> dict[int, str]:
    return {int(code): name for name, code in re.findall(rf'{label}="(\w+)"[^}}]*\}} \* (\d+)\)', expr)}


def _mapped(panel: dict[str, Any]) -> dict[int, str]:
    (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
    return {int(code): option["text"] for code, option in mapping["options"].items()}


@pytest.mark.parametrize(
    ("title", "label", "vocabulary"),
    [
        ("Node state (most severe GPU state)", "state", [s.value for s in GPU_STATES]),
        ("GPU states", "state", [s.value for s in GPU_STATES]),
        ("Verdicts", "verdict", [v.value for v in VERDICTS]),
        ("GPU health", "level", [level.value for level in HealthLevel]),
    ],
)
def test_state_timelines_code_and_map_every_state(title: str, label: str, vocabulary: list[str]) -> None:
    (panel,) = [p for p in panels(load_dashboard()) if p["title"] == title]
    assert panel["type"] == "state-timeline"
    (target,) = panel["targets"]
    coded = _coded(target["expr"], label)
    assert sorted(coded.values()) == sorted(vocabulary), "every value of the label is coded"
    assert _mapped(panel) == coded, "value mappings name the codes of the query"


def test_dcgm_panels_show_dcgm_activity_beside_ours_and_join_without_label_replace() -> None:
    dashboard = load_dashboard()
    exprs = [query.expr for query in queries(dashboard)]
    assert 'DCGM_FI_PROF_SM_ACTIVE{Hostname=~"$node"}' in exprs
    assert 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"$node"}' in exprs
    assert any("on (UUID)" in e and "DCGM_FI_PROF_SM_ACTIVE" in e and "gpu_watchdog_" in e for e in exprs)
    assert not [e for e in exprs if "label_replace" in e]
    assert not [e for e in exprs if re.search(r"\bjob=~\"\$training_job", e)], "training_job, not job"


# --------------------------------------------------------------------------------------------------
# A real Prometheus scraping the real app


NODE = "node-a"
JOB = "qwen3-32b-ft"
LAGGING_RANK = 3


def live_snapshot(cycle: int, now: float) -> Snapshot:
    """GPUs 0-5 in the spin band for 100 s, 6 computing, 7 in communication; the job's 8 ranks frozen
    at step 1200 except rank 3 at 1180; verdict deadlock_suspected since 60 s."""
    states = [GpuState.CHECKPOINT_OR_DEADLOCK] * 6 + [GpuState.COMPUTE, GpuState.COMMUNICATION]
    powers = [230.0] * 6 + [905.0, 380.0]
    gpus = tuple(
        gpu_status(g, state=state, power_w=power, state_since=now - 100.0 + g, read_errors_total=cycle // 5)
        for g, (state, power) in enumerate(zip(states, powers, strict=True))
    )
    ranks = tuple(rank_status(r, step=1180 if r == LAGGING_RANK else 1200) for r in range(8))
    job = JobStatus(
        job=JOB,
        ranks=ranks,
        verdict=Verdict.DEADLOCK_SUSPECTED,
        onset=now - 60.0,
        raised=now - 20.0,
        evidence=JobEvidence(gpus=tuple(range(6)), step_interval_s=60.0),
    )
    # the same job's facts for the other nodes (the job view): rank 3 stopped first and lags
    where = "collective all_reduce @ train.py:40 main"
    facts = NodeJobFacts(
        JOB, NODE, now, 16, "deadlock_suspected", now - 60.0, True, False, False,
        tuple(
            RankFacts(
                r, "collective", "collective barrier @ train.py:90 main" if r == LAGGING_RANK else where,
                now - 70.0 + r, now - 1.0, step=1180 if r == LAGGING_RANK else 1200,
                step_changed_at=now - (300.0 if r == LAGGING_RANK else 70.0), phase="train",
                phase_since=now - 3000.0, spin_since=now - 100.0 + r if r < 6 else None,
            )
            for r in range(8)
        ),
    )  # fmt: skip
    return Snapshot(
        node=NODE,
        source="sim",
        mode=Mode.ALERT,
        armed=True,
        cycle=cycle,
        time=now,
        period_s=0.25,
        gpus=gpus,
        jobs=(job,),
        sample_duration_s=0.002 + 0.0001 * (cycle % 7),
        last_sample_time=now - 0.01,
        started_at=now - 3600.0,
        counters={"cycles_total": float(cycle)},
        actions={("capture", "ok"): 1 + cycle // 20, ("alert", "ok"): 1},
        version="0.1.0",
        fleet=(facts,),
        node_health=live_health(now, cycle),
    )


def live_health(now: float, cycle: int) -> NodeHealth:
    """GPU 3 unhealthy (Xid 79, counted up each cycle), GPU 7 degraded (thermal throttle), the rest fine."""
    xid = HardwareFinding(
        FaultKind.XID,
        HealthLevel.UNHEALTHY,
        Blame.NODE,
        OperatorAction.DRAIN_NODE,
        "Xid 79: GPU has fallen off the bus",
        FaultSource.KERNEL_LOG,
        gpu=3,
        xid=79,
        count=1 + cycle,
        first_seen=now - 90.0,
        last_seen=now,
    )
    hot = HardwareFinding(
        FaultKind.THROTTLE_THERMAL,
        HealthLevel.DEGRADED,
        Blame.NODE,
        OperatorAction.NONE,
        "clocks throttled: thermal",
        FaultSource.NVML_POLL,
        gpu=7,
    )
    gpus = tuple(
        GpuHealth(g, f"00000000:{0x18 + g:02X}:00.0", level, findings)
        for g, level, findings in (
            (
                g,
                HealthLevel.UNHEALTHY if g == 3 else HealthLevel.DEGRADED if g == 7 else HealthLevel.HEALTHY,
                (xid,) if g == 3 else (hot,) if g == 7 else (),
            )
            for g in range(8)
        )
    )
    return NodeHealth(
        HealthLevel.UNHEALTHY, gpus, xid_totals=(XidCount(3, "00000000:1B:00.0", 79, 1 + cycle),)
    )


class Publisher:
    """Publishes a fresh snapshot every 0.25 s, as the daemon's loop would."""

    def __init__(self, holder: SnapshotHolder) -> None:
        self.holder = holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    def _run(self) -> None:
        cycle = 0
        while not self._stop.is_set():
            cycle += 1
            self.holder.publish(live_snapshot(cycle, time.time()))
            self._stop.wait(0.25)

    def __enter__(self) -> Publisher:
        self.holder.publish(live_snapshot(0, time.time()))
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(2.0)


def dcgm_exposition(hostname: str, gpus: int = 8) -> str:
    """What dcgm-exporter (3.x, default counters) serves for ``gpus`` H200s on ``hostname``: SM and
    tensor-pipe activity low on the spinning GPUs 0-5, high on the computing GPU 6 and the
    communicating GPU 7."""
    lines = []
    for name, help_text in (
        ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned."),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for g in range(gpus):
            value = {6: 0.82, 7: 0.55}.get(g, 0.03)
            labels = (
                f'gpu="{g}",UUID="GPU-{g:08x}-0000-4000-8000-000000000000",device="nvidia{g}",'
                f'modelName="NVIDIA H200",Hostname="{hostname}",DCGM_FI_DRIVER_VERSION="570.124.06"'
            )
            lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


class DcgmExporter:
    """A loopback endpoint serving :func:`dcgm_exposition` on /metrics."""

    def __init__(self, hostname: str) -> None:
        body = dcgm_exposition(hostname).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> DcgmExporter:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape_config(tmp_path: Path, target: str, dcgm_target: str | None = None) -> Path:
    """The shipped config and rules with loopback targets and 1 s intervals, nothing else changed
    (plus a dcgm-exporter scrape job as prometheus.yml shows it, commented, when ``dcgm_target``)."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gpu-watchdog"]
    job["static_configs"] = [{"targets": [target]}]  # no node label: the relabelling names the node
    job["scrape_interval"] = "1s"
    job["scrape_timeout"] = "1s"
    if dcgm_target is not None:
        config["scrape_configs"].append(
            {
                "job_name": "dcgm-exporter",
                "scrape_interval": "1s",
                "static_configs": [{"targets": [dcgm_target]}],
            }
        )
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config.pop("alerting", None)  # no Alertmanager here
    rules = yaml.safe_load(RULES_YML.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    config["rule_files"] = [str(tmp_path / "rules.yml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class Prometheus:
    def __init__(self, binary: str, config: Path, data: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data.parent / "prometheus.log"
        self._log_file = self.log.open("wb")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        self.client = httpx.Client(base_url=self.url, timeout=5.0)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_until(self, what: str, check: Any, timeout_s: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited ({self.process.returncode}):\n{self.logs()}")
            try:
                result = check()
            except (httpx.HTTPError, ValueError):  # ValueError: a body not JSON yet (503 while it starts)
                result = None
            if result:
                return result
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}:\n{self.logs()}")

    def api(self, path: str, **params: Any) -> Any:
        response = self.client.get(path, params=params)
        body = response.json()
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5.0)
        self._log_file.close()


@pytest.fixture
def prometheus_over_the_app(tmp_path: Path) -> Iterator[Prometheus]:
    binary = require_binary("prometheus", "the dashboard test scrapes the real app with a real Prometheus")
    holder = SnapshotHolder()
    app = create_app(snapshots=holder, events=None, table=dict, control=None, token=None, period_s=0.25)
    with Publisher(holder), HttpServer(app, "127.0.0.1", 0) as http, DcgmExporter(NODE) as dcgm:
        config = scrape_config(tmp_path, f"127.0.0.1:{http.port}", f"127.0.0.1:{dcgm.port}")
        server = Prometheus(binary, config, tmp_path / "data")
        try:
            yield server
        finally:
            server.stop()


def _has_data(data: dict[str, Any]) -> bool:
    if data["resultType"] == "matrix":
        return any(any(math.isfinite(float(v)) for _t, v in series["values"]) for series in data["result"])
    if data["resultType"] == "vector":
        return any(math.isfinite(float(series["value"][1])) for series in data["result"])
    return data["resultType"] == "scalar" and math.isfinite(float(data["result"][1]))


@pytest.mark.slow
def test_every_panel_query_returns_data_from_a_real_prometheus(prometheus_over_the_app: Prometheus) -> None:
    prom = prometheus_over_the_app
    started = time.monotonic()
    prom.wait_until("readiness", lambda: prom.client.get("/-/ready").status_code == 200)
    # Enough scrapes for rate() over 4 s and a range of several points.
    prom.wait_until(
        "six scrapes of the app",
        lambda: prom.api("/api/v1/query", query='count_over_time(up{job="gpu-watchdog"}[30s]) >= 6')[
            "result"
        ],
    )
    up = prom.api("/api/v1/query", query='up{job="gpu-watchdog"}')["result"]
    assert [(s["metric"]["node"], s["value"][1]) for s in up] == [("127.0.0.1", "1")], (
        "the shipped relabelling names the node after the target's host"
    )

    now = time.time()
    empty = []
    for query in queries(load_dashboard()):
        expr = substitute(query.expr)
        if query.instant:
            data = prom.api("/api/v1/query", query=expr, time=now)
        else:
            data = prom.api("/api/v1/query_range", query=expr, start=now - RANGE_WINDOW_S, end=now, step="1s")
        if not _has_data(data):
            empty.append(f"{query.where}: {expr}")
    assert not empty, "queries without data:\n" + "\n".join(empty)

    # The training job is `training_job`; `job` stays the scrape job's (no honor_labels).
    verdict = prom.api("/api/v1/query", query='gpu_watchdog_verdict{verdict="deadlock_suspected"}')["result"]
    assert [(s["metric"]["training_job"], s["metric"]["job"], s["metric"]["node"]) for s in verdict] == [
        (JOB, "gpu-watchdog", "127.0.0.1")
    ]

    # Our per-GPU series join dcgm-exporter's as both are labelled: on UUID, and on (Hostname, gpu).
    for on in ("UUID", "Hostname, gpu"):
        joined = prom.api(
            "/api/v1/query",
            query=f"gpu_watchdog_utilization_ratio - on ({on}) group_left () DCGM_FI_PROF_SM_ACTIVE",
        )["result"]
        assert sorted(int(s["metric"]["gpu"]) for s in joined) == list(range(8)), on
    spin = prom.api(
        "/api/v1/query",
        query="gpu_watchdog_utilization_ratio - on (UUID) group_left () DCGM_FI_PROF_SM_ACTIVE > 0.5",
    )["result"]
    assert sorted(int(s["metric"]["gpu"]) for s in spin) == [0, 1, 2, 3, 4, 5], "the spinning GPUs"

    # The shipped rules load and evaluate without errors on real data, and the deadlock and the
    # lagging rank are already pending (their `for:` has not passed yet).
    def active() -> dict[str, list[dict[str, str]]]:
        groups = prom.api("/api/v1/rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        if not rules or any(rule.get("lastEvaluation", "").startswith("0001") for rule in rules):
            return {}
        bad = [(rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"]
        assert not bad, f"rules failing on real data: {bad}"
        alerts: dict[str, list[dict[str, str]]] = {}
        for alert in prom.api("/api/v1/alerts")["alerts"]:
            alerts.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return alerts if {"GpuWatchdogDeadlockSuspected", "GpuWatchdogRankStepLag"} <= alerts.keys() else {}

    alerts = prom.wait_until("the deadlock and rank-lag alerts to be pending", active, timeout_s=15.0)
    suspected = alerts["GpuWatchdogDeadlockSuspected"]
    assert [(a["training_job"], a["node"]) for a in suspected] == [(JOB, "127.0.0.1")]
    lag = alerts["GpuWatchdogRankStepLag"]
    assert [(a["training_job"], a["rank"]) for a in lag] == [(JOB, str(LAGGING_RANK))]
    assert "GpuWatchdogDaemonDown" not in alerts
    # the job view: the rank that stopped first, named with the node that reports it
    (first,) = prom.api(
        "/api/v1/query", query="training_job:gpu_watchdog_fleet_first_stopped:timestamp_seconds"
    )["result"]
    assert (first["metric"]["fleet_node"], first["metric"]["rank"]) == (NODE, str(LAGGING_RANK))
    assert time.monotonic() - started < 45.0


def test_live_snapshot_is_what_the_dashboard_test_claims() -> None:
    snapshot = live_snapshot(10, 1_000.0)
    assert len(snapshot.gpus) == 8
    assert sum(g.state is GpuState.CHECKPOINT_OR_DEADLOCK for g in snapshot.gpus) == 6
    (job,) = snapshot.jobs
    steps = {rank.rank: rank.step for rank in job.ranks}
    assert min(steps, key=lambda rank: steps[rank] or 0) == LAGGING_RANK
