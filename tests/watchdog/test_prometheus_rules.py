"""deploy/prometheus: the scrape config and alerting rules, checked and unit-tested by ``promtool``.

``promtool test rules`` runs deploy/prometheus/gpu-watchdog.rules.test.yml (every alert firing and not
firing, with its exact labels and annotations); the tests here also make sure that file keeps covering
every rule, and that the rules keep to the metric names and verdicts the daemon exports.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest
import yaml

from gpu_triage.model.runbook import DEFAULT_RUNBOOK_BASE, render_rules, rule_links
from gpu_triage.model.states import ENDED_VERDICTS, Verdict
from gpu_triage.serving.metrics import METRIC_NAMES
from tests.conftest import REPO, require_binary

PROMETHEUS = REPO / "deploy" / "prometheus"
CONFIG = PROMETHEUS / "prometheus.yml"
RULES = PROMETHEUS / "gpu-watchdog.rules.yml"
RULE_TESTS = PROMETHEUS / "gpu-watchdog.rules.test.yml"
OPERATOR_GUIDE = REPO / "docs" / "operator-guide.md"

#: Verdicts that are a problem to alert on (healthy and an announced checkpoint are not).
ALERTED_VERDICTS = {v.value for v in Verdict} - {
    Verdict.HEALTHY.value,
    Verdict.CHECKPOINT.value,
    *(v.value for v in ENDED_VERDICTS),  # the job has ended: nothing to page about
}
#: Runbook anchors that are not verdicts.
OTHER_RUNBOOKS = {
    "daemon_down",
    "rank_step_lag",
    "input_errors",
    "gpu_held_idle",
    "gpu_unhealthy",
    "gpu_degraded",
    "xid",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool", "Debian package prometheus")
    return subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=60, cwd=PROMETHEUS, check=False
    )


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def recording_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "record" in rule]


def test_recording_rules_follow_the_naming_convention_and_are_tested() -> None:
    """level:metric:operations, each one evaluated by a promql_expr_test (the job-wide view)."""
    tested = {
        check["expr"]
        for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for check in case.get("promql_expr_test", [])
    }
    for rule in recording_rules():
        level, metric, _ops = rule["record"].split(":")
        assert level.startswith("training_job") and metric.startswith("gpu_watchdog_fleet_")
        assert rule["record"] in tested, f"{rule['record']} never tested"


def test_promtool_check_config() -> None:
    result = promtool("check", "config", "--lint=all", "--lint-fatal", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in result.stdout


def test_promtool_test_rules() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing: set[str] = set()
    silent: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - silent == set(), "alerts never tested not firing"


def test_every_problem_verdict_has_an_alert() -> None:
    alerted = set()
    for rule in alert_rules():
        alerted.update(re.findall(r'verdict="(\w+)"', rule["expr"]))
    assert alerted == ALERTED_VERDICTS


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule["alert"])
def test_rule_labels_annotations_and_metric_names(rule: dict[str, Any]) -> None:
    assert rule["alert"].startswith("GpuWatchdog")
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    annotations = rule["annotations"]
    assert {"summary", "description", "runbook_url"} <= annotations.keys()
    if rule["labels"].get("scope") == "job":  # one alert per training job, whatever its nodes
        assert "$labels.node" not in json.dumps(annotations)
        assert "by (training_job)" in " ".join(r["expr"] for r in recording_rules()) + rule["expr"]
    else:
        assert "{{ $labels.node }}" in annotations["summary"]
    anchor = re.fullmatch(re.escape(DEFAULT_RUNBOOK_BASE) + r"#(\w+)", annotations["runbook_url"])
    assert anchor is not None, f"absolute, from the shipped base: {annotations['runbook_url']}"
    assert anchor.group(1) in ALERTED_VERDICTS | OTHER_RUNBOOKS
    expr = rule["expr"]
    for recorded in recording_rules():
        expr = expr.replace(recorded["record"], "")
    for metric in re.findall(r"\b(gpu_watchdog_\w+|up)\b", expr):
        assert metric == "up" or metric in METRIC_NAMES, metric
    if "verdict=" in rule["expr"] or "rank_step" in rule["expr"]:
        text = json.dumps(annotations)
        assert "$labels.training_job" in text and "$labels.job" not in text, "name the training job"


def test_runbook_anchors_exist_in_the_operator_guide() -> None:
    if not OPERATOR_GUIDE.exists():
        pytest.skip("docs/operator-guide.md is not written yet (issue 7, item 7)")
    headings = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in OPERATOR_GUIDE.read_text().splitlines()
        if line.startswith("#")
    }
    anchors = {rule["annotations"]["runbook_url"].split("#", 1)[1] for rule in alert_rules()}
    assert anchors - headings == set(), "runbook anchors without a heading in docs/operator-guide.md"


def test_scrape_config_leaves_job_to_prometheus_and_names_the_node() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gpu-watchdog"]
    assert "honor_labels" not in job, "the training job is `training_job`; `job` stays the scrape job"
    assert job["scrape_interval"] == "5s"
    assert all(target.endswith(":9410") for sc in job["static_configs"] for target in sc["targets"])
    (relabel,) = job["relabel_configs"]
    assert relabel["target_label"] == "node"
    assert config["rule_files"] == [RULES.name]


def test_render_rules_points_every_runbook_url_at_the_configured_base(tmp_path) -> None:
    text = RULES.read_text()
    base = "https://wiki.corp.example/gpu/operator-guide"
    rendered = render_rules(text, base + "/")
    links = rule_links(rendered)
    assert len(links) == len(alert_rules())
    assert {b for _line, b, _anchor in links} == {base}
    assert [a for *_rest, a in links] == [a for *_rest, a in rule_links(text)], "anchors kept"
    # Everything but the runbook lines is untouched, and the rendered file still passes promtool.
    kept = [line for line in text.splitlines() if "runbook_url:" not in line]
    assert [line for line in rendered.splitlines() if "runbook_url:" not in line] == kept
    out = tmp_path / "rules.yml"
    out.write_text(rendered)
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", str(out))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_shipped_rules_are_rendered_with_the_default_base() -> None:
    text = RULES.read_text()
    assert render_rules(text, DEFAULT_RUNBOOK_BASE) == text
