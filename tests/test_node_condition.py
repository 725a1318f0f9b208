"""The node verdict leaves the daemon for the schedulers (issue 27 part B):

- deploy/kubernetes/node-problem-detector: the NPD custom plugin, run for real against a real loopback
  HTTP server, answers with NPD's exit codes (0 OK, 1 NonOK, 2 Unknown) and a bounded one-line
  message - through python3, and through curl + jq where the image has no python3; its monitor
  configuration names the script and the condition;
- ``slurm-health-check`` drains on an unhealthy node verdict, never on a degraded or absent one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from gpu_triage.cli.slurm_health import health_reasons, node_reasons, node_verdict

REPO = Path(__file__).resolve().parents[1]
NPD = REPO / "deploy" / "kubernetes" / "node-problem-detector"
PLUGIN = NPD / "gpu-watchdog-health.sh"


def xid_finding(gpu: int | None, xid: int | None, level: str = "unhealthy", kind: str = "xid") -> dict:
    return {
        "kind": kind,
        "level": level,
        "blame": "node",
        "action": "drain_node",
        "detail": "d",
        "gpu": gpu,
        "xid": xid,
    }


UNHEALTHY = {
    "node": "gpu-a17",
    "time": 0.0,
    "gpus": [],
    "jobs": [],
    "node_health": {
        "level": "unhealthy",
        "gpus": [
            {
                "gpu": 1,
                "level": "degraded",
                "findings": [xid_finding(1, None, "degraded", "throttle_thermal")],
            },
            {"gpu": 3, "level": "unhealthy", "findings": [xid_finding(3, 79), xid_finding(3, 48)]},
        ],
        "findings": [],
    },
}
DEGRADED = {
    "node": "gpu-a17",
    "node_health": {
        "level": "degraded",
        "gpus": [
            {"gpu": 1, "level": "degraded", "findings": [xid_finding(1, None, "degraded", "pcie_degraded")]}
        ],
    },
}
HEALTHY = {"node": "gpu-a17", "node_health": {"level": "healthy", "gpus": [], "findings": []}}
OLD_DAEMON = {"node": "gpu-a17", "gpus": [], "jobs": []}


class Server(BaseHTTPRequestHandler):
    body: bytes = b"{}"
    status: int = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def daemon() -> Iterator[tuple[str, type[Server]]]:
    handler = type("H", (Server,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", handler
    server.shutdown()


def jq_only_path(tmp_path: Path) -> str:
    """A PATH with sh, curl, jq and the tools the script uses - and no python3."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "curl", "jq", "head", "tr", "printf", "cat"):
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} missing")
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def plugin(url: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPU_WATCHDOG_URL": url, "GPU_WATCHDOG_TIMEOUT_S": "3"}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["/bin/sh", str(PLUGIN)], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("reader", ["python3", "jq"])
def test_the_npd_plugin_answers_with_npds_exit_codes(daemon, tmp_path: Path, reader: str) -> None:
    url, handler = daemon
    path = jq_only_path(tmp_path) if reader == "jq" else None
    if reader == "python3" and shutil.which("python3") is None:
        pytest.skip("python3 missing")
    results = {}
    for name, doc in (
        ("unhealthy", UNHEALTHY),
        ("degraded", DEGRADED),
        ("healthy", HEALTHY),
        ("old", OLD_DAEMON),
    ):
        handler.body, handler.status = json.dumps(doc).encode(), 200
        done = plugin(url, path)
        results[name] = (done.returncode, done.stdout.strip())
    handler.body = b"{not json"
    results["garbage"] = (plugin(url, path).returncode, "")
    handler.body, handler.status = b"{}", 500
    results["error"] = (plugin(url, path).returncode, "")
    results["unreachable"] = (plugin("http://127.0.0.1:9", path).returncode, "")
    assert results["unhealthy"] == (1, "unhealthy: GPU 3 Xid 79, GPU 3 Xid 48"), results
    assert results["degraded"] == (0, "degraded: GPU 1 pcie_degraded"), results
    assert results["healthy"] == (0, "healthy"), results
    assert results["old"][0] == 2 and results["old"][1].startswith("unknown"), results
    assert [results[k][0] for k in ("garbage", "error", "unreachable")] == [2, 2, 2], results


@pytest.mark.parametrize("reader", ["python3", "jq"])
def test_the_npd_plugin_message_is_one_bounded_printable_line_on_hostile_input(
    daemon, tmp_path: Path, reader: str
) -> None:
    url, handler = daemon
    path = jq_only_path(tmp_path) if reader == "jq" else None
    hostile = {
        "node_health": {
            "level": "unhealthy",
            "gpus": [
                {
                    "gpu": g,
                    "level": "unhealthy",
                    "findings": [xid_finding(g, None, kind="\x1b[31m\nEVIL" * 50)],
                }
                for g in range(64)
            ]
            + [{"gpu": True, "level": "unhealthy", "findings": "nope"}, "junk", None],
            "findings": {"not": "a list"},
        }
    }
    handler.body = json.dumps(hostile).encode()
    done = plugin(url, path)
    assert done.returncode == 1, done.stderr
    line = done.stdout.rstrip("\n")
    assert "\n" not in line and len(line) <= 200 and line.isprintable() and "\x1b" not in line, line
    assert line.startswith("unhealthy: GPU 0 ")


def test_the_npd_monitor_config_names_the_plugin_and_its_condition() -> None:
    config = json.loads((NPD / "gpu-watchdog-monitor.json").read_text())
    assert config["plugin"] == "custom" and config["source"] == "gpu-watchdog"
    (condition,) = config["conditions"]
    (rule,) = config["rules"]
    assert rule["type"] == "permanent" and rule["condition"] == condition["type"] == "GpuWatchdogUnhealthy"
    assert Path(rule["path"]).name == PLUGIN.name
    seconds = lambda s: float(s.rstrip("s"))  # noqa: E731
    assert seconds(rule["timeout"]) <= seconds(config["pluginConfig"]["timeout"])
    assert seconds(rule["timeout"]) > 5, "above the script's default HTTP timeout (GPU_WATCHDOG_TIMEOUT_S)"
    kustomization = yaml.safe_load((NPD / "kustomization.yaml").read_text())
    (generator,) = kustomization["configMapGenerator"]
    assert sorted(generator["files"]) == sorted(p.name for p in (PLUGIN, NPD / "gpu-watchdog-monitor.json"))
    assert os.access(PLUGIN, os.X_OK)


def test_slurm_health_check_drains_on_an_unhealthy_node_verdict_only() -> None:
    assert node_reasons(UNHEALTHY) == ["GPU 3 Xid 79", "GPU 3 Xid 48"]
    assert health_reasons(UNHEALTHY, now_s=0.0) == ["GPU 3 Xid 79", "GPU 3 Xid 48"]
    assert node_reasons(DEGRADED) == [] and node_reasons(HEALTHY) == [] and node_reasons(OLD_DAEMON) == []
    assert node_verdict(OLD_DAEMON) is None, "an older daemon's node is its name: unknown, never a reason"
    nested = {
        "node": {"level": "unhealthy", "gpus": [], "findings": [xid_finding(None, None, kind="fabric")]}
    }
    assert node_reasons(nested) == ["node fabric"]
    bare = {"node_health": {"level": "unhealthy", "gpus": "??", "findings": None}}
    assert node_reasons(bare) == ["node unhealthy"]
    many = {
        "node_health": {
            "level": "unhealthy",
            "gpus": [{"gpu": g, "level": "unhealthy", "findings": [xid_finding(g, 79)]} for g in range(100)],
        }
    }
    assert len(node_reasons(many)) == 16


def test_a_status_nested_too_deeply_is_a_clean_error_not_a_crash() -> None:
    """Found by the scheduler fuzzer: json.loads raises RecursionError (not ValueError) on deep nesting,
    which the health check's probe did not catch."""
    from gpu_triage.cli.slurm_health import parse_status

    with pytest.raises(ValueError, match="nested too deeply"):
        parse_status(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ValueError, match="not a JSON object"):
        parse_status(b"[1]")
    assert parse_status(b'{"node": "x"}') == {"node": "x"}


@pytest.mark.slow
def test_a_real_daemons_node_verdict_reaches_the_npd_plugin_and_the_slurm_health_check(
    tmp_path: Path,
) -> None:
    """``gpu-watchdog run --source sim`` follows a kernel log file; an Xid 79 line in NVIDIA's format
    for simulated GPU 3's bus id turns the node unhealthy in its /status: the NPD plugin says NonOK
    naming it, ``slurm-health-check`` names it as a drain reason - healthy (0) before the line."""
    import httpx

    from gpu_triage.telemetry.sim import sim_bus_id
    from tests.watchdog.test_daemon import GPU_WATCHDOG, free_port, stop, wait_for, write_config
    from tests.watchdog.test_health_daemon import kernel_line

    port = free_port()
    kern = tmp_path / "kern.log"
    kern.write_text("")
    cfg = write_config(tmp_path / "config.toml", tmp_path / "state", tmp_path / "progress", port)
    with open(cfg, "a") as f:
        f.write(f'[health]\nkernel_log = "off"\nkernel_log_file = "{kern}"\n')
    proc = subprocess.Popen(
        [*GPU_WATCHDOG, "run", "--config", str(cfg), "--source", "sim"],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*GPU_WATCHDOG, "slurm-health-check", "--url", base, "--node", "gpu-a17", "--tries", "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )

    try:
        wait_for(lambda: httpx.get(f"{base}/healthz", timeout=2).status_code == 200, 60, "/healthz 200")
        before, before_check = plugin(base), check()
        with kern.open("ab") as f:
            f.write(kernel_line(sim_bus_id(3), 79, "npd-test").split(b">", 1)[1])  # a file has no <level>
        wait_for(
            lambda: httpx.get(f"{base}/status", timeout=2).json()["node_health"]["level"] == "unhealthy",
            30,
            "the node unhealthy",
        )
        after, after_check = plugin(base), check()
    finally:
        code = stop(proc)
        out = proc.stdout.read() if proc.stdout else ""
    assert code == 0, out[-3000:]
    assert (before.returncode, before.stdout.strip()) == (0, "healthy"), before
    assert before_check.returncode == 0, before_check.stdout
    assert after.returncode == 1 and after.stdout.strip() == "unhealthy: GPU 3 Xid 79", after
    assert after_check.returncode == 1 and "gpu-watchdog: GPU 3 Xid 79" in after_check.stdout, after_check
