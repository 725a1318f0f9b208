"""Issue 28 (2): every setting reaches the code that uses it.

Each key of ``deploy/config.example.toml`` is set to a value other than its default - once in a config
file, once through its ``GPU_WATCHDOG_<SECTION>__<KEY>`` variable - and the daemon is built the way
``gpu-watchdog run`` builds it (:func:`gpu_triage.daemon.runner.build_daemon`, then ``start()``). Then
each key's *consumer* is asked what it received: the tracker, the progress reader, the detector's
settings, the stack sampler, the RAS and fleet pollers, the event store, the action engine's capture
rung, kill settings and alert delivery, the HTTP server (a request with an allowed Host header, a
mutating call with the token), the log handler, the NVML source. A key without a probe here fails the
test, so a new key must name its consumer. NVML is the fake module (the hardware boundary).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.daemon.config import ConfigError, load_config, schema_keys
from gpu_triage.daemon.loop import Daemon
from gpu_triage.daemon.runner import build_daemon
from tests.watchdog import fake_nvml
from tests.watchdog.test_delivery import free_port, release_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "config.example.toml"
SINK_KEYS = {k for k in schema_keys() if k.startswith("alerts.sinks.")}


@dataclass
class Built:
    daemon: Daemon
    files: dict[str, Path]

    @property
    def engine(self) -> Any:
        return self.daemon.actions

    def signal(self, name: str) -> Any:
        """A registered signal of the daemon's observer (stacks, nccl_ras, fleet)."""
        return self.daemon.observer.signals[name]

    @property
    def capture(self) -> Any:
        return self.daemon.actions.evidence_capture

    def http(self, path: str, *, method: str = "GET", headers: dict[str, str] | None = None) -> int:
        url = self.daemon.url
        assert url is not None
        req = urllib.request.Request(
            url + path, method=method, headers=headers or {}, data=b"" if method == "POST" else None
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return int(e.code)


Probe = Callable[[Built], Any]


def root_log() -> tuple[int, str]:
    root = logging.getLogger()
    return root.level, type(root.handlers[-1].formatter).__name__


def host_allowed(b: Built) -> bool:
    code = b.http("/healthz", headers={"Host": "watchdog.example"})
    assert b.http("/healthz", headers={"Host": "elsewhere.example"}) == 421  # the check is on
    return code != 421


def publish_gap_s(b: Built) -> float | None:
    """The shortest of a few gaps after a published cycle at which the loop publishes again."""
    daemon, kept = b.daemon, b.daemon._last_publish_s
    daemon._last_publish_s = 100.0
    try:
        return next((gap for gap in (0.1, 0.5, 1.0, 2.0, 4.0) if daemon.publish_due(100.0 + gap)), None)
    finally:
        daemon._last_publish_s = kept


def token_accepted(b: Built) -> bool:
    token = b.files["token"].read_text().strip()
    assert b.http("/disarm", method="POST") == 401
    return b.http("/disarm", method="POST", headers={"Authorization": f"Bearer {token}"}) == 202


def cases(tmp: Path, port: int) -> dict[str, tuple[str, list[tuple[Probe, Any]]]]:
    """key -> (its TOML value, other than the default; [(probe, what the consumer must hold)])."""
    d, det, cap = (lambda b: b.daemon), (lambda b: b.daemon.detector.config), (lambda b: b.capture)
    out: dict[str, tuple[str, list[tuple[Probe, Any]]]] = {
        "daemon.node": (
            '"node-under-test"',
            [
                (lambda b: b.daemon.node, "node-under-test"),
                (lambda b: b.engine.node, "node-under-test"),
                (lambda b: b.signal("fleet").poller.node, "node-under-test"),
                (lambda b: det(b).fleet_node, "node-under-test"),
            ],
        ),
        "daemon.source": ('"nvml"', [(lambda b: b.daemon.source.name, "nvml")]),
        "daemon.listen": (f'"127.0.0.1:{port}"', [(lambda b: b.daemon.url, f"http://127.0.0.1:{port}")]),
        "daemon.allowed_hosts": ('["watchdog.example"]', [(host_allowed, True)]),
        "daemon.state_dir": (
            json.dumps(str(tmp / "state")),
            [
                (lambda b: b.daemon.store.state_dir, tmp / "state"),
                (lambda b: b.capture.state_dir, tmp / "state"),
            ],
        ),
        "daemon.period_s": ("0.5", [(lambda b: d(b).config.daemon.period_s, 0.5)]),
        "daemon.process_period_s": ("2.0", [(lambda b: d(b).config.daemon.process_period_s, 2.0)]),
        "daemon.publish_period_s": ("2.0", [(publish_gap_s, 2.0)]),
        "daemon.nvml_deadline_s": ("0.25", [(lambda b: b.daemon.source.deadline_s, 0.25)]),
        "daemon.log_level": ('"debug"', [(lambda b: root_log()[0], logging.DEBUG)]),
        "daemon.log_format": ('"json"', [(lambda b: root_log()[1], "JsonFormatter")]),
        "progress.dir": (
            json.dumps(str(tmp / "progress")),
            [(lambda b: b.daemon.observer.progress.directory, tmp / "progress")],
        ),
        "progress.stale_after_s": ("120.0", [(lambda b: b.daemon.observer.progress.stale_after_s, 120.0)]),
        "classifier.table": (
            json.dumps(str(tmp / "table.toml")),
            [(lambda b: b.daemon.gpus.table_path, tmp / "table.toml")],
        ),
        "classifier.model": ('"B300"', [(lambda b: b.daemon.gpus.model, "B300")]),
        "classifier.dwell_s": (
            "{compute = 3.0}",
            [(lambda b: dict(b.daemon.gpus.dwell_s), {"compute": 3.0})],
        ),
        "stacks.py_spy": (
            json.dumps(str(tmp / "py-spy")),
            [
                (lambda b: b.signal("stacks").sampler.config.py_spy, str(tmp / "py-spy")),
                (lambda b: b.capture.py_spy, str(tmp / "py-spy")),  # the evidence bundle's dumps
            ],
        ),
        "ras.host": (
            '"127.0.0.2"',
            [
                (lambda b: b.signal("nccl_ras").poller.config.host, "127.0.0.2"),
                (lambda b: cap(b).ras_address[0], "127.0.0.2"),
            ],
        ),
        "ras.port": (
            "28029",
            [
                (lambda b: b.signal("nccl_ras").poller.config.port, 28029),
                (lambda b: cap(b).ras_address[1], 28029),
            ],
        ),
        "cluster.stale_after_s": ("22.5", [(lambda b: det(b).fleet_stale_after_s, 22.5)]),
        "cluster.node_lost_after_s": ("90.0", [(lambda b: det(b).fleet_node_lost_after_s, 90.0)]),
        "events.retention_days": ("7.0", [(lambda b: b.daemon.store.retention_s, 7 * 86400.0)]),
        "events.max_bytes": ("2097152", [(lambda b: b.daemon.store.max_bytes, 2097152)]),
        "events.prune_interval_s": ("60.0", [(lambda b: b.daemon.store.prune_interval_s, 60.0)]),
        "evidence.retention_days": ("3.0", [(lambda b: cap(b).retention_s, 3 * 86400.0)]),
        "evidence.max_bundles": ("5", [(lambda b: cap(b).max_bundles, 5)]),
        "auth.token_file": (json.dumps(str(tmp / "token")), [(token_accepted, True)]),
        # token_file_optional: test_a_missing_optional_token_file_lets_the_daemon_start
        "auth.token_file_optional": ("false", []),
        "actions.mode": (
            '"kill"',
            [(lambda b: b.daemon.mode.value, "kill")],
        ),  # the engine gets it each cycle
        "actions.capture_timeout_s": ("45.0", [(lambda b: cap(b).timeout_s, 45.0)]),
        "alerts.runbook_url": (
            '"https://runbooks.test/guide"',
            [(lambda b: b.engine.delivery.alerts.runbook_url, "https://runbooks.test/guide")],
        ),
    }
    detector = {
        "fast_min_s": "22.5",
        "k_fast": "2.25",
        "k_remote": "3.5",
        "spin_min_s": "15.0",
        "stall_min_s": "90.0",
        "k_stall": "4.5",
        "disagree_min_s": "22.5",
        "power_only_after_s": "150.0",
        "power_only_can_kill": "true",
        "confirm_after_s": "180.0",
        "write_active_bytes": "8388608.0",
        "read_active_bytes": "8388608.0",
        "write_window_s": "15.0",
        "lease_grace_s": "7.5",
        "starvation_after_s": "45.0",
        "telemetry_lost_after_s": "15.0",
        "default_step_interval_s": "90.0",
        "first_step_default_s": "900.0",
        "k_first": "3.0",
        "interval_decay": "0.15",
        "cpu_contention_ratio": "1.35",
        "slow_max_budgets": "15.0",
        "idle_held_after_s": "450.0",
    }
    for key, value in detector.items():
        out[f"detector.{key}"] = (value, [(lambda b, k=key: getattr(det(b), k), parse(value))])
    sampler = {
        "enabled": "false",
        "nonblocking": "false",
        "healthy_interval_s": "90.0",
        "blind_interval_s": "7.5",
        "suspect_interval_s": "4.5",
        "timeout_s": "7.5",
        "budget_cpu_s_per_min": "4.5",
        "max_parallel": "3",
    }
    for key, value in sampler.items():
        out[f"stacks.{key}"] = (
            value,
            [(lambda b, k=key: getattr(b.signal("stacks").sampler.config, k), parse(value))],
        )
    stack_evidence = {
        "frozen_s": "30.0",
        "min_samples": "6",
        "fresh_s": "45.0",
        "checkpoint_max_s": "2700.0",
        "asleep_cpu_ratio": "0.45",
    }
    for key, value in stack_evidence.items():
        out[f"stacks.{key}"] = (
            value,
            [(lambda b, k=key: getattr(det(b).stacks, k), parse(value))],
        )
    for key, value in {"enabled": "false", "min_interval_s": "90.0", "timeout_s": "7.5"}.items():
        out[f"ras.{key}"] = (
            value,
            [(lambda b, k=key: getattr(b.signal("nccl_ras").poller.config, k), parse(value))],
        )
    fleet = {
        "prometheus_url": '"http://127.0.0.1:9/"',
        "min_interval_s": "7.5",
        "timeout_s": "4.5",
        "max_response_bytes": "1048576",
        "job_rules": '"off"',
    }
    for key, value in fleet.items():
        out[f"cluster.{key}"] = (
            value,
            [(lambda b, k=key: getattr(b.signal("fleet").poller.config, k), parse(value))],
        )
    actions = {
        "capture_after_s": "5.0",
        "alert_after_s": "45.0",
        "sigterm_after_s": "90.0",
        "sigkill_grace_s": "45.0",
        "max_kills_per_hour": "2",
        "kill_hook": '["/bin/true", "stop"]',
        "dry_run": "true",
        "kill_via": '"signal"',
        "slurm_cancel": '"step"',
        "slurm_bin_dir": '"/opt/slurm/bin"',
        "drain": "true",
        "requeue": "true",
    }
    # the drainer drains the node by its Slurm name (issue 27: a hardware-blamed hang drains this node)
    out["actions.slurm_node_name"] = ('"gpu-node-17"', [(lambda b: b.engine._drainer.node, "gpu-node-17")])
    for key, value in actions.items():
        want = parse(value)
        want = tuple(want) if isinstance(want, list) else Path(want) if key == "slurm_bin_dir" else want
        out[f"actions.{key}"] = (value, [(lambda b, k=key: getattr(b.engine.actions, k), want)])
    health = {
        "enabled": "false",
        "kernel_log": '"off"',
        "kernel_log_file": json.dumps(str(tmp / "kern.log")),
        "poll_interval_s": "7.5",
        "event_hold_s": "7200.0",
        "ecc_correctable_burst": "150",
        "nvlink_error_burst": "150",
        "xid_catalog": json.dumps(str(tmp / "xid_catalog.toml")),
    }
    for key, value in health.items():
        want = parse(value)
        want = Path(want) if key in ("kernel_log_file", "xid_catalog") else want
        out[f"health.{key}"] = (
            value,
            [(lambda b, k=key: getattr(b.signal("health").monitor.config, k), want)],
        )
    for key, value in {
        "resend_interval_s": "120.0",
        "retry_initial_s": "2.0",
        "retry_max_s": "600.0",
    }.items():
        out[f"alerts.{key}"] = (
            value,
            [(lambda b, k=key: getattr(b.engine.delivery.alerts, k), parse(value))],
        )
    return out


def parse(value: str) -> Any:
    import tomllib

    return tomllib.loads(f"v = {value}")["v"]


def secret(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def prepare(tmp: Path) -> dict[str, Path]:
    files = {
        "token": secret(tmp / "token", "s3cret-token-for-the-test"),
        "routing_key": secret(tmp / "pd.key", "R0UTINGKEY"),
        "slack_url": secret(tmp / "slack.url", "https://hooks.slack.test/T0/B0/x"),
    }
    (tmp / "table.toml").write_text((ROOT / "watchdog" / "classify" / "tables" / "b300.toml").read_text())
    (tmp / "kern.log").write_text("")
    catalog = ROOT / "watchdog" / "signals" / "health" / "xid_catalog.toml"
    (tmp / "xid_catalog.toml").write_text(catalog.read_text())
    spy = tmp / "py-spy"
    spy.write_text("#!/bin/sh\nexit 0\n")
    spy.chmod(0o755)
    (tmp / "progress").mkdir()
    return files


SINKS_TOML = """
[[alerts.sinks]]
kind = "pagerduty"
name = "pd"
routing_key_file = {key}
timeout_s = 2.5

[[alerts.sinks]]
kind = "slack"
url_file = {slack}

[[alerts.sinks]]
kind = "webhook"
url = "http://127.0.0.1:9/hook"
"""


def sink_probes(b: Built, files: dict[str, Path]) -> dict[str, bool]:
    sinks = {s.name: s for s in b.engine.delivery.sinks}
    return {
        "alerts.sinks.kind": [s.kind for s in sinks.values()] == ["pagerduty", "slack", "webhook"],
        "alerts.sinks.name": "pd" in sinks,
        "alerts.sinks.routing_key_file": sinks["pd"].routing_key_file == files["routing_key"],
        "alerts.sinks.timeout_s": sinks["pd"].timeout_s == 2.5,
        "alerts.sinks.url_file": sinks["slack-1"].url_file == files["slack_url"],
        "alerts.sinks.url": sinks["webhook-2"].url == "http://127.0.0.1:9/hook",
    }


def toml_file(table: dict[str, tuple[str, Any]], extra: str = "") -> str:
    sections: dict[str, list[str]] = {}
    for key, (value, _) in table.items():
        section, _, name = key.partition(".")
        sections.setdefault(section, []).append(f"{name} = {value}")
    return "".join(f"[{s}]\n" + "\n".join(lines) + "\n\n" for s, lines in sections.items()) + extra


def env_vars(table: dict[str, tuple[str, Any]]) -> dict[str, str]:
    out = {}
    for key, (value, _) in table.items():
        section, _, name = key.partition(".")
        if key == "classifier.dwell_s":
            out["GPU_WATCHDOG_CLASSIFIER__DWELL_S__COMPUTE"] = "3.0"
        else:
            out[f"GPU_WATCHDOG_{section.upper()}__{name.upper()}"] = value
    return out


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.basic(2))
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def observe(built: Built, probes: list[tuple[Probe, Any]]) -> list[Any]:
    """What each probe finds (a probe that raises: its error, so one failure never hides the others)."""
    out = []
    for probe, _ in probes:
        try:
            out.append(probe(built))
        except Exception as e:
            out.append(f"{type(e).__name__}: {e}")
    return out


def build_and_probe(
    config_path: Path | None, env: dict[str, str], files: dict[str, Path], table: Any
) -> tuple[list[str], Built]:
    config = load_config(config_path, env)
    daemon = build_daemon(config, config_path=config_path)
    daemon.start()
    built = Built(daemon, files)
    wrong = []
    try:
        for key, (value, probes) in table.items():
            for got, (_, want) in zip(observe(built, probes), probes, strict=True):
                if got != want:
                    wrong.append(f"{key} = {value}: its consumer holds {got!r}, not {want!r}")
        if config_path is not None:
            wrong += [f"{k}: not received" for k, ok in sink_probes(built, files).items() if not ok]
    finally:
        daemon.close()
    return wrong, built


@pytest.mark.parametrize("via", ["file", "environment"])
def test_every_key_reaches_its_consumer(tmp_path: Path, nvml: None, via: str) -> None:
    files = prepare(tmp_path)
    port = free_port()
    release_port(port)  # the daemon listens there
    table = cases(tmp_path, port)
    documented = set(re.findall(r"^#? ?([a-z_]+) = ", EXAMPLE.read_text(), re.M))
    # the probe table names every key the configuration knows (a new key must name its consumer)...
    assert set(table) | SINK_KEYS == set(schema_keys())
    # ... and every one of them is documented in deploy/config.example.toml
    assert {k.rpartition(".")[2] for k in schema_keys()} <= documented | {"dwell_s", "sinks"}
    if via == "file":
        path = tmp_path / "config.toml"
        extra = SINKS_TOML.format(
            key=json.dumps(str(files["routing_key"])), slack=json.dumps(str(files["slack_url"]))
        )
        path.write_text(toml_file(table, extra))
        wrong, _ = build_and_probe(path, {}, files, table)
        covered = len(table) + len(SINK_KEYS)
        print(f"\n{covered} keys of deploy/config.example.toml set in a file, each checked at its consumer")
    else:
        env = env_vars(table)
        wrong, _ = build_and_probe(None, env, files, table)
        covered = len(env)
        print(
            f"\n{covered} GPU_WATCHDOG_<SECTION>__<KEY> variables set, each checked at its consumer "
            f"({len(SINK_KEYS)} [[alerts.sinks]] keys cannot come from the environment)"
        )
    assert not wrong, "\n".join(wrong)
    assert covered == (len(schema_keys()) if via == "file" else len(schema_keys()) - len(SINK_KEYS))


def test_a_missing_optional_token_file_lets_the_daemon_start(tmp_path: Path, nvml: None) -> None:
    """``auth.token_file_optional``: a missing token file stops the start unless it is true."""
    base = {
        "GPU_WATCHDOG_DAEMON__SOURCE": '"none"',
        "GPU_WATCHDOG_DAEMON__LISTEN": '"127.0.0.1:0"',
        "GPU_WATCHDOG_DAEMON__STATE_DIR": json.dumps(str(tmp_path / "state")),
        "GPU_WATCHDOG_AUTH__TOKEN_FILE": json.dumps(str(tmp_path / "absent-token")),
    }
    refused = build_daemon(load_config(None, base))
    with pytest.raises(ConfigError, match="absent-token"):
        refused.start()
    refused.close()
    daemon = build_daemon(load_config(None, {**base, "GPU_WATCHDOG_AUTH__TOKEN_FILE_OPTIONAL": "true"}))
    daemon.start()
    try:
        assert daemon.url is not None
        # daemon.source: "none" although NVML (the fake) answers, which "auto" would have used
        assert daemon.source.name == "none"
    finally:
        daemon.close()


def test_the_documented_client_variables_reach_the_progress_writer(tmp_path: Path) -> None:
    """GPU_WATCHDOG_PROGRESS_DIR and GPU_WATCHDOG_JOB (the contract, docs/integrations.md): the
    progress writer of the trainer and the integrations puts its file where they say."""
    from gpu_triage.contract import ProgressWriter

    env = {"GPU_WATCHDOG_PROGRESS_DIR": str(tmp_path / "p"), "GPU_WATCHDOG_JOB": "job-from-env"}
    writer = ProgressWriter.from_env(env={**env, "RANK": "3", "WORLD_SIZE": "4"})
    writer.step(7)
    writer.flush()
    record = json.loads((tmp_path / "p" / "job-from-env" / "rank-3.json").read_text())
    assert (record["job"], record["rank"], record["step"]) == ("job-from-env", 3, 7)


def test_on_reload_every_key_reaches_its_consumer_or_says_it_needs_a_restart(
    tmp_path: Path, nvml: None
) -> None:
    """SIGHUP (``Daemon.reload``) with every key changed: each one either reaches its consumer, or the
    daemon logs that it needs a restart and keeps running with the old value - never silently ignored.
    The keys that need a restart are the ones docs/operator-guide.md names."""
    files = prepare(tmp_path)
    port = free_port()
    release_port(port)
    table = cases(tmp_path, port)
    path = tmp_path / "config.toml"
    keep = {k: table[k] for k in ("daemon.listen", "daemon.state_dir", "progress.dir")}
    path.write_text(toml_file(keep))
    config = load_config(path, {})
    daemon = build_daemon(config, config_path=path)
    daemon.start()
    built = Built(daemon, files)
    before = {key: observe(built, probes) for key, (_, probes) in table.items()}
    extra = SINKS_TOML.format(
        key=json.dumps(str(files["routing_key"])), slack=json.dumps(str(files["slack_url"]))
    )
    path.write_text(toml_file(table, extra))
    records: list[logging.LogRecord] = []
    catcher = logging.Handler(logging.WARNING)  # on the daemon's logger: the reload reconfigures the root's
    catcher.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("gpu_watchdog").addHandler(catcher)
    try:
        daemon.reload()
        said = {
            m.group(1)
            for r in records
            for m in [re.match(r"(\S+) changed: takes effect after a restart", r.getMessage())]
            if m
        }
        silent, live, restart = [], set(), set()
        for key, (value, probes) in table.items():
            if not probes:
                continue
            got = observe(built, probes)
            if all(g == want for g, (_, want) in zip(got, probes, strict=True)):
                live.add(key)
            elif key in said and got == before[key]:
                restart.add(key)
            elif got != before[key] or key not in keep:
                silent.append(f"{key} = {value}: the running daemon holds {got!r}, and nothing said so")
        assert not silent, "\n".join(silent)
    finally:
        logging.getLogger("gpu_watchdog").removeHandler(catcher)
        daemon.close()
    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    at = guide.index("`systemctl reload gpu-watchdog` (SIGHUP)")
    reload_text = guide[at : guide.index("\n\n", at)]
    restart_part = reload_text[reload_text.index("needs a restart") :]
    for key in restart:
        section, _, name = key.partition(".")
        assert (
            f"`[{section}]`" in restart_part or f"`{key}`" in restart_part or f"`{name}`" in restart_part
        ), key
    for key in live:
        section, _, name = key.partition(".")
        assert f"`[{section}]`" in reload_text or f"`{key}`" in reload_text or f"`{name}`" in reload_text, key
    print(f"\nreload: {len(live)} keys applied live, {len(restart)} logged as needing a restart")


def test_the_slurm_scripts_variables_reach_them(tmp_path: Path) -> None:
    """deploy/slurm's documented variables: GPU_WATCHDOG_SLURM_DEFAULTS names the file that sets
    GPU_WATCHDOG_BIN and GPU_WATCHDOG_URL (the health check runs that binary against that URL) and
    GPU_WATCHDOG_PROGRESS_ROOT (the epilog removes the job's directory there)."""
    import subprocess

    called = tmp_path / "called"
    fake_bin = tmp_path / "gpu-watchdog"
    fake_bin.write_text(f'#!/bin/sh\necho "$@" > {called}\n')
    fake_bin.chmod(0o755)
    (tmp_path / "root" / "slurm-123").mkdir(parents=True)
    defaults = tmp_path / "defaults"
    defaults.write_text(
        f"GPU_WATCHDOG_BIN={fake_bin}\nGPU_WATCHDOG_URL=http://node-a.test:9999\n"
        f"GPU_WATCHDOG_PROGRESS_ROOT={tmp_path / 'root'}\n"
    )
    env = {"PATH": os.environ["PATH"], "GPU_WATCHDOG_SLURM_DEFAULTS": str(defaults), "SLURM_JOB_ID": "123"}
    slurm = ROOT / "deploy" / "slurm"
    subprocess.run(["sh", slurm / "health-check.sh"], env=env, check=True, timeout=30)
    assert called.read_text().split() == ["slurm-health-check", "--drain", "--url", "http://node-a.test:9999"]
    subprocess.run(["sh", slurm / "epilog.sh"], env=env, check=True, timeout=30)
    assert not (tmp_path / "root" / "slurm-123").exists()
