"""deploy/alertmanager/alertmanager.yml: checked by ``amtool``, and run by a REAL Alertmanager.

``amtool check-config`` validates it; ``amtool config routes test`` routes every alert of the rule
file by its severity. Then Debian's ``prometheus-alertmanager`` runs the shipped file on loopback
(only the receivers' endpoints, the secret files and the group waits changed) with real PagerDuty- and
Slack-shaped receivers on loopback: a confirmed deadlock pages with the routing key read from its file
and is copied to Slack, the "suspected" alert of the same node and job is inhibited, and a warning of
another node goes to Slack only.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpu_triage.model.runbook import DEFAULT_RUNBOOK_BASE
from tests.conftest import REPO, require_binary
from tests.ports import free_port

CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
RULES = REPO / "deploy" / "prometheus" / "gpu-watchdog.rules.yml"
EXPECTED_RECEIVERS = {
    "critical": "pagerduty-gpu,slack-gpu",
    "warning": "slack-gpu",
    "info": "slack-gpu",  # the default route
}
JOB = "qwen3-32b-ft"


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = require_binary("amtool", "Debian package prometheus-alertmanager")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False)


def test_amtool_check_config() -> None:
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert "3 inhibit rules" in result.stdout and "2 receivers" in result.stdout


def test_no_secret_is_inline() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert "slack_api_url" not in config["global"] and config["global"]["slack_api_url_file"]
    for receiver in config["receivers"]:
        for pagerduty in receiver.get("pagerduty_configs", []):
            assert "routing_key" not in pagerduty and pagerduty["routing_key_file"]
        for slack in receiver.get("slack_configs", []):
            assert "api_url" not in slack


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


@pytest.mark.parametrize("rule", _alerts(), ids=lambda rule: rule["alert"])
def test_every_alert_routes_by_severity(rule: dict[str, Any]) -> None:
    severity = rule["labels"]["severity"]
    result = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={CONFIG}",
        f"alertname={rule['alert']}",
        f"severity={severity}",
        "node=node-a",
        f"training_job={JOB}",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == EXPECTED_RECEIVERS[severity]


# --------------------------------------------------------------------------------------------------
# A real Alertmanager


class Receivers:
    """PagerDuty Events v2 and Slack webhook endpoints on loopback that record what they get."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        receivers = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receivers.lock:
                    receivers.posts.append((self.path, json.loads(body)))
                reply = b'{"status":"success","dedup_key":"x"}' if self.path.startswith("/v2") else b"ok"
                self.send_response(202 if self.path.startswith("/v2") else 200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def received(self, prefix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for path, body in self.posts if path.startswith(prefix)]


def loopback_config(tmp_path: Path, receivers: Receivers) -> Path:
    """The shipped config with loopback endpoints, secrets in temp files and short group waits."""
    config = yaml.safe_load(CONFIG.read_text())
    slack_url = tmp_path / "slack-webhook-url"
    slack_url.write_text(receivers.url + "/slack/T000/B000/XXXX\n")
    routing_key = tmp_path / "pagerduty-routing-key"
    routing_key.write_text("R0UT1NGKEYFROMFILE0000000000000\n")
    config["global"]["slack_api_url_file"] = str(slack_url)
    config["global"]["pagerduty_url"] = receivers.url + "/v2/enqueue"
    for receiver in config["receivers"]:
        for pagerduty in receiver.get("pagerduty_configs", []):
            pagerduty["routing_key_file"] = str(routing_key)
    config["route"]["group_wait"] = "1s"  # the inhibitor must see the source alert before a flush
    config["route"]["group_interval"] = "1s"
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[tuple[httpx.Client, Receivers]]:
    binary = require_binary("prometheus-alertmanager", "Debian package prometheus-alertmanager")
    receivers = Receivers()
    receivers.thread.start()
    port = free_port()
    log = (tmp_path / "alertmanager.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={loopback_config(tmp_path, receivers)}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip port: loopback HTTP only
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0)
    try:
        deadline = time.monotonic() + 20.0
        while True:
            assert process.poll() is None, (tmp_path / "alertmanager.log").read_text()
            try:
                if client.get("/-/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "alertmanager not ready in 20 s"
            time.sleep(0.1)
        yield client, receivers
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(10.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5.0)
        log.close()
        receivers.server.shutdown()
        receivers.server.server_close()


def alert(name: str, severity: str, node: str, verdict: str) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "labels": {
            "alertname": name,
            "severity": severity,
            "node": node,
            "job": "gpu-watchdog",
            "training_job": JOB,
            "verdict": verdict,
        },
        "annotations": {
            "summary": f"{name} on {node}",
            "description": f"{verdict} of {JOB} on {node}",
            "runbook_url": f"{DEFAULT_RUNBOOK_BASE}#{verdict}",
        },
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=10)).isoformat(),
    }


def wait_for(what: str, check: Any, timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_real_alertmanager_pages_copies_to_slack_and_inhibits(
    alertmanager: tuple[httpx.Client, Receivers],
) -> None:
    client, receivers = alertmanager
    posted = client.post(
        "/api/v2/alerts",
        json=[
            alert("GpuWatchdogDeadlockConfirmed", "critical", "node-a", "deadlock_confirmed"),
            alert("GpuWatchdogDeadlockSuspected", "warning", "node-a", "deadlock_suspected"),
            alert("GpuWatchdogDeadlockSuspected", "warning", "node-b", "deadlock_suspected"),
        ],
    )
    assert posted.status_code == 200, posted.text

    (page,) = wait_for("the PagerDuty event", lambda: receivers.received("/v2/enqueue"))
    assert page["routing_key"] == "R0UT1NGKEYFROMFILE0000000000000", "the key comes from its file"
    assert page["event_action"] == "trigger"
    assert page["payload"]["severity"] == "critical"
    assert page["payload"]["summary"] == "GpuWatchdogDeadlockConfirmed on node-a"
    assert (page["payload"]["component"], page["payload"]["group"]) == ("node-a", JOB)
    assert page["payload"]["custom_details"]["verdict"] == "deadlock_confirmed"
    assert page["links"] == [{"href": f"{DEFAULT_RUNBOOK_BASE}#deadlock_confirmed", "text": "runbook"}]

    slack = wait_for(
        "two Slack messages", lambda: len(receivers.received("/slack")) >= 2 and receivers.received("/slack")
    )
    titles = sorted(message["attachments"][0]["title"] for message in slack)
    assert titles == [
        "[CRITICAL] GpuWatchdogDeadlockConfirmed on node-a",
        "[WARNING] GpuWatchdogDeadlockSuspected on node-b",
    ], "the suspected alert of node-a is inhibited; the other node's is not"

    states = {
        (a["labels"]["alertname"], a["labels"]["node"]): (a["status"]["state"], a["status"]["inhibitedBy"])
        for a in client.get("/api/v2/alerts").json()
    }
    assert states[("GpuWatchdogDeadlockSuspected", "node-a")][0] == "suppressed"
    assert states[("GpuWatchdogDeadlockSuspected", "node-a")][1], "inhibited by the confirmed alert"
    assert states[("GpuWatchdogDeadlockSuspected", "node-b")] == ("active", [])
    assert states[("GpuWatchdogDeadlockConfirmed", "node-a")] == ("active", [])
    time.sleep(1.5)  # one more group interval: still exactly one page and no message for node-a's suspicion
    assert len(receivers.received("/v2/enqueue")) == 1
    assert len(receivers.received("/slack")) == 2


@pytest.mark.slow
def test_a_job_hung_on_many_nodes_pages_once(alertmanager: tuple[httpx.Client, Receivers]) -> None:
    """The job-wide alert (no node label) inhibits every node's deadlock alerts of the same job."""
    client, receivers = alertmanager
    job_wide = alert("GpuWatchdogJobHung", "critical", "", "deadlock_confirmed")
    del job_wide["labels"]["node"], job_wide["labels"]["verdict"]
    job_wide["labels"]["scope"] = "job"
    posted = client.post(
        "/api/v2/alerts",
        json=[
            job_wide,
            *(
                alert("GpuWatchdogDeadlockConfirmed", "critical", n, "deadlock_confirmed")
                for n in ("node-a", "node-b")
            ),
            alert("GpuWatchdogDeadlockSuspected", "warning", "node-c", "deadlock_suspected"),
        ],
    )
    assert posted.status_code == 200, posted.text
    (page,) = wait_for("the PagerDuty event", lambda: receivers.received("/v2/enqueue"))
    assert page["payload"]["summary"] == "GpuWatchdogJobHung on " and page["payload"]["group"] == JOB
    time.sleep(1.5)  # one more group interval: still one page, and nothing for the nodes
    assert len(receivers.received("/v2/enqueue")) == 1
    states = {
        (a["labels"]["alertname"], a["labels"].get("node")): a["status"]["state"]
        for a in client.get("/api/v2/alerts").json()
    }
    assert states == {
        ("GpuWatchdogJobHung", None): "active",
        ("GpuWatchdogDeadlockConfirmed", "node-a"): "suppressed",
        ("GpuWatchdogDeadlockConfirmed", "node-b"): "suppressed",
        ("GpuWatchdogDeadlockSuspected", "node-c"): "suppressed",
    }
