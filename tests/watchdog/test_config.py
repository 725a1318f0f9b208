"""The daemon's configuration: defaults, the documented example, environment overrides, error texts."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from gpu_triage.daemon.config import (
    Config,
    ConfigError,
    load_config,
    load_secret,
    load_token,
    missing_token_note,
    override,
    parse_env_value,
    schema_keys,
    token_file_absent,
)
from gpu_triage.model.states import Mode
from tests.conftest import REPO

EXAMPLE = REPO / "deploy" / "config.example.toml"


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(body)
    return path


def problems(path: Path | None, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, env or {})
    return list(info.value.problems)


def test_defaults_without_file() -> None:
    config = load_config(None, {})
    assert config == Config()
    assert config.daemon.node == socket.gethostname()
    assert config.daemon.listen == "127.0.0.1:9410"
    assert config.daemon.state_dir == Path("/var/lib/gpu-watchdog")
    assert config.daemon.period_s == 1.0
    assert config.progress.dir == Path("/run/gpu-watchdog/progress")
    assert config.progress.stale_after_s == 600.0
    assert config.actions.mode is Mode.OBSERVE
    assert config.auth.token_file is None
    assert config.alerts.sinks == ()
    assert config.detector.power_only_after_s <= 180


def test_example_loads_and_equals_the_defaults() -> None:
    assert load_config(EXAMPLE, {}) == Config()


def test_example_documents_every_key_with_a_comment() -> None:
    """Each key appears in its section (set or commented out) right after a comment line."""
    lines = EXAMPLE.read_text().splitlines()
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for i, line in enumerate(lines):
        header = re.match(r"^#?\s*\[\[?([a-z_.]+)\]\]?\s*$", line)
        if header:
            current = header.group(1)
            parent, _, leaf = current.rpartition(".")
            sections.setdefault(parent, []).append((leaf, lines[i - 1]))  # a sub-table is a key too
            continue
        key = re.match(r"^#?\s*([a-z_]+)\s*=", line)
        if key:
            sections.setdefault(current, []).append((key.group(1), lines[i - 1]))
    missing = []
    for dotted in schema_keys():
        section, _, key = dotted.rpartition(".")
        found = [prev for k, prev in sections.get(section, []) if k == key]
        documented = any(prev.startswith("#") for prev in found)
        sink_doc = section == "alerts.sinks" and re.search(rf"^#\s+{key}\s+\S", EXAMPLE.read_text(), re.M)
        if not (documented or sink_doc):
            missing.append(dotted)
    assert missing == []


def test_file_values_are_typed(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[daemon]
node = "node-a"
period_s = 0.1
state_dir = "/tmp/wd"
listen = "[::1]:9500"
source = "replay:/data/run.csv"
[classifier]
model = "B300"
[classifier.dwell_s]
checkpoint_or_deadlock = 10
[actions]
mode = "kill"
kill_hook = ["scancel", "--signal=TERM", "42"]
max_kills_per_hour = 2
[auth]
token_file = "/etc/gpu-watchdog/token"
[[alerts.sinks]]
kind = "alertmanager"
url = "http://am:9093"
[[alerts.sinks]]
kind = "pagerduty"
routing_key_file = "/etc/gpu-watchdog/pd.key"
""",
    )
    config = load_config(path, {})
    assert config.daemon.node == "node-a"
    assert config.daemon.period_s == 0.1
    assert config.daemon.state_dir == Path("/tmp/wd")
    assert config.daemon.source == "replay:/data/run.csv"
    assert config.classifier.model == "B300"
    assert dict(config.classifier.dwell_s) == {"checkpoint_or_deadlock": 10.0}
    assert config.actions.mode is Mode.KILL
    assert config.actions.kill_hook == ("scancel", "--signal=TERM", "42")
    assert config.auth.token_file == Path("/etc/gpu-watchdog/token")
    am, pd = config.alerts.sinks
    assert (am.kind, am.name, am.url, am.timeout_s) == (
        "alertmanager",
        "alertmanager-0",
        "http://am:9093",
        5.0,
    )
    assert pd.url == "https://events.pagerduty.com/v2/enqueue"
    assert pd.routing_key_file == Path("/etc/gpu-watchdog/pd.key")
    assert config.origin == str(path)


def test_error_names_file_key_expected_and_actual(tmp_path: Path) -> None:
    path = write(tmp_path, '[daemon]\nperiod_s = "fast"\n')
    assert problems(path) == [f'{path}:2: daemon.period_s: expected a number between 0.1 and 60, got "fast"']


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[daemon]
period_s = 100
listen = "localhost"
[actions]
mode = "nuke"
dry_run = "yes"
max_kills_per_hour = 1.5
""",
    )
    assert problems(path) == [
        f"{path}:3: daemon.period_s: expected a number between 0.1 and 60, got 100",
        f'{path}:4: daemon.listen: expected HOST:PORT (e.g. "127.0.0.1:9410" or "[::1]:9410"; '
        'port 0 picks a free one), got "localhost"',
        f'{path}:6: actions.mode: expected one of observe, alert, kill, got "nuke"',
        f'{path}:7: actions.dry_run: expected true or false, got "yes"',
        f"{path}:8: actions.max_kills_per_hour: expected an integer between 0 and 100, got 1.5",
    ]


def test_unknown_keys_and_sections_suggest_the_right_one(tmp_path: Path) -> None:
    path = write(tmp_path, "[daemon]\nperiod = 1.0\n[detectr]\nx = 1\n[classifier.dwell_s]\ncompte = 1\n")
    assert problems(path) == [
        f"{path}:2: daemon.period: unknown key (did you mean 'period_s'?)",
        f"{path}:3: detectr: unknown key (did you mean 'detector'?)",
        f"{path}:6: classifier.dwell_s.compte: unknown key (did you mean 'compute'?)",
    ]


def test_a_typo_is_named_with_its_line_even_in_sinks_and_after_multiline_strings(tmp_path: Path) -> None:
    """tomllib gives no line numbers: the key's line comes from scanning the text (TomlLines)."""
    from gpu_triage.model.config_schema import TomlLines

    body = (
        "# comment\n"
        "[daemon]\n"
        'node = """multi\n'
        "mode = not a key\n"
        '"""\n'
        "[actions]\n"
        '  "mdoe" = "kill"   # quoted key\n'
        "[[alerts.sinks]]\n"
        'kind = "webhook"\n'
        'url = "http://127.0.0.1:1/"\n'
        "[[alerts.sinks]]\n"
        'kind = "webhook"\n'
        'urll = "http://127.0.0.1:2/"\n'
    )
    path = write(tmp_path, body)
    lines = TomlLines(body)
    assert lines.line("daemon.node") == 3 and lines.line("daemon.mode") == 2  # in the string: not a key
    assert lines.line("alerts.sinks[1].urll") == 13 and lines.line("alerts.sinks[0].url") == 10
    found = problems(path)
    assert f"{path}:7: actions.mdoe: unknown key (did you mean 'mode'?)" in found
    assert any(p.startswith(f"{path}:13: alerts.sinks[1].urll: unknown key") for p in found), found


def test_power_only_rule_is_capped_at_180_s(tmp_path: Path) -> None:
    path = write(tmp_path, "[detector]\npower_only_after_s = 300\n")
    assert problems(path) == [
        f"{path}:2: detector.power_only_after_s: expected a number between 10 and 180, got 300"
    ]


def test_cross_key_constraints(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[detector]\nfast_min_s = 60\nstall_min_s = 30\n[actions]\ncapture_after_s = 10\nalert_after_s = 5\n",
    )
    assert problems(path) == [
        f"{path}:3: detector.stall_min_s: expected at least detector.fast_min_s (60): a stall without proof "
        "is called no sooner than a proven hang, got 30.0",
        f"{path}:6: actions.alert_after_s: expected at least actions.capture_after_s (10): "
        "evidence is captured first, got 5.0",
    ]


def test_sink_errors_name_the_sink(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[[alerts.sinks]]
kind = "slack"
[[alerts.sinks]]
kind = "pagerduty"
[[alerts.sinks]]
kind = "webhook"
url = "ftp://x"
timout_s = 3
[[alerts.sinks]]
url = "http://x"
""",
    )
    assert problems(path) == [  # each at its own line (a missing key: its sink's header)
        f"{path}:2: alerts.sinks[0].url: expected exactly one of url and url_file for a slack sink, "
        "got nothing",
        f"{path}:4: alerts.sinks[1].routing_key_file: expected a path (a pagerduty sink needs a routing "
        "key), got nothing",
        f"{path}:9: alerts.sinks[2].timout_s: unknown key (did you mean 'timeout_s'?)",
        f"{path}:10: alerts.sinks[3].kind: expected one of webhook, alertmanager, pagerduty, slack, "
        "got nothing",
    ]


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    path = write(tmp_path, "period_s = 1\n[daemon\nperiod_s = 1\n")
    [problem] = problems(path)
    # the file:line: form every other problem has (issue 28); tomllib's "(at line ...)" becomes a column
    assert problem.startswith(f"{path}:2: invalid TOML: "), problem
    assert problem.endswith("(column 8)") and "at line" not in problem, problem
    assert problems(tmp_path / "nope.toml") == [f"{tmp_path / 'nope.toml'}: no such file"]


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[daemon]\nperiod_s = 2.0\nnode = 'from-file'\n")
    env = {
        "GPU_WATCHDOG_DAEMON__PERIOD_S": "0.5",
        "GPU_WATCHDOG_DAEMON__NODE": "123",  # a text key keeps the text, not the integer
        "GPU_WATCHDOG_ACTIONS__DRY_RUN": "true",
        "GPU_WATCHDOG_ACTIONS__KILL_HOOK": '["scancel", "7"]',
        "GPU_WATCHDOG_CLASSIFIER__DWELL_S__COMPUTE": "3",
        "GPU_WATCHDOG_PROGRESS_DIR": "/elsewhere",  # the trainer's variable, not an override
        "PATH": "/usr/bin",
    }
    config = load_config(path, env)
    assert config.daemon.period_s == 0.5
    assert config.daemon.node == "123"
    assert config.actions.dry_run is True
    assert config.actions.kill_hook == ("scancel", "7")
    assert dict(config.classifier.dwell_s) == {"compute": 3.0}
    assert config.progress.dir == Path("/run/gpu-watchdog/progress")


def test_environment_errors_name_the_variable() -> None:
    assert problems(
        None,
        {
            "GPU_WATCHDOG_DAEMON__PERIOD_S": "fast",
            "GPU_WATCHDOG_DAEMON__PERIDO_S": "1",
            "GPU_WATCHDOG_ALERTS__SINKS": "[]",
        },
    ) == [
        "GPU_WATCHDOG_ALERTS__SINKS: alerts.sinks: cannot be set from the environment",
        "GPU_WATCHDOG_DAEMON__PERIDO_S: daemon.perido_s: unknown key (did you mean 'period_s'?)",
        'GPU_WATCHDOG_DAEMON__PERIOD_S: daemon.period_s: expected a number between 0.1 and 60, got "fast"',
    ]


def test_parse_env_value() -> None:
    assert parse_env_value("0.5") == 0.5
    assert parse_env_value("3") == 3
    assert parse_env_value("false") is False
    assert parse_env_value('"quoted"') == "quoted"
    assert parse_env_value("node-a") == "node-a"
    assert parse_env_value("[1, 2]") == [1, 2]


def test_command_line_override_goes_through_the_same_checks(tmp_path: Path) -> None:
    path = write(tmp_path, "[[alerts.sinks]]\nkind = 'webhook'\nurl = 'http://x'\n")
    config = load_config(path, {})
    changed = override(
        config, {"daemon.listen": "0.0.0.0:9411", "daemon.state_dir": "/tmp/s"}, "command line"
    )
    assert changed.daemon.listen == "0.0.0.0:9411"
    assert changed.daemon.state_dir == Path("/tmp/s")
    assert changed.alerts.sinks == config.alerts.sinks
    with pytest.raises(ConfigError) as info:
        override(config, {"daemon.source": "simulated"}, "--source")
    assert info.value.problems == (
        '--source: daemon.source: expected auto, nvml, sim, none or replay:FILE, got "simulated"',
    )


def test_token_file_must_not_be_world_readable(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-value\n")
    token.chmod(0o644)
    config = load_config(None, {"GPU_WATCHDOG_AUTH__TOKEN_FILE": str(token)})
    with pytest.raises(ConfigError) as info:
        load_token(config)
    message = str(info.value)
    assert "world-readable (mode 0644)" in message and f"chmod o-r {token}" in message
    assert "s3cret" not in message
    token.chmod(0o640)
    assert load_token(config) == "s3cret-value"
    assert load_token(load_config(None, {})) is None


def test_a_missing_token_file_is_an_error_unless_declared_optional(tmp_path: Path) -> None:
    missing = tmp_path / "token"
    env = {"GPU_WATCHDOG_AUTH__TOKEN_FILE": str(missing)}
    with pytest.raises(ConfigError, match="cannot read the token file"):
        load_token(load_config(None, env))
    optional = load_config(None, {**env, "GPU_WATCHDOG_AUTH__TOKEN_FILE_OPTIONAL": "true"})
    assert token_file_absent(optional) and load_token(optional) is None
    assert "answer 403" in missing_token_note(optional)
    # optional covers absence only: a file that is there must still be sound
    missing.write_text("s3cret\n")
    missing.chmod(0o644)
    assert not token_file_absent(optional)
    with pytest.raises(ConfigError, match="world-readable"):
        load_token(optional)


def test_secret_file_problems(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(ConfigError, match="is empty"):
        load_secret(empty)
    with pytest.raises(ConfigError, match="cannot read the routing key file"):
        load_secret(tmp_path / "absent", "routing key")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_secret(tmp_path)
