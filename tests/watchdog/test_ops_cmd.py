"""``gpu-watchdog check-config`` and ``render-rules``, and the runbook base they share with alerts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_triage.cli.main import main
from gpu_triage.cli.ops import check_config
from gpu_triage.model.runbook import DEFAULT_RUNBOOK_BASE, BadRunbookBase, check_base, link, rule_links
from tests.conftest import REPO

RULES = REPO / "deploy" / "prometheus" / "gpu-watchdog.rules.yml"
EXAMPLE = REPO / "deploy" / "config.example.toml"


def test_check_config_accepts_the_shipped_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--config", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{EXAMPLE}: ok (node ") and "mode observe" in out


def test_check_config_names_file_and_key_of_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text('[daemon]\nperiod_s = "fast"\n[alerts]\nrunbook_url = "docs/operator-guide.md"\n')
    code, lines = check_config(str(bad), {})
    assert code == 2
    assert lines[0].startswith(f"{bad}:2: daemon.period_s: expected a number")
    assert (
        lines[1]
        == f'{bad}:4: alerts.runbook_url: expected an absolute http(s) URL, got "docs/operator-guide.md"'
    )
    assert lines[-1] == f"{bad}: 2 problem(s)"


def test_check_config_counts_the_environment_and_reads_the_secrets(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)  # world-readable: the daemon would refuse it
    config = tmp_path / "config.toml"
    config.write_text(f'[auth]\ntoken_file = "{token}"\n')
    code, lines = check_config(str(config), {})
    assert code == 2 and "world-readable" in lines[0] and lines[0].startswith("auth.token_file: ")
    token.chmod(0o600)
    assert check_config(str(config), {})[0] == 0
    code, lines = check_config(str(config), {"GPU_WATCHDOG_ACTIONS__MODE": "explode"})
    assert code == 2 and "actions.mode" in lines[0]


def test_check_config_of_a_missing_file_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check-config", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: no such file" in capsys.readouterr().err


def test_runbook_base_must_be_absolute_without_a_fragment() -> None:
    assert check_base("https://wiki.example/gpu/") == "https://wiki.example/gpu"
    assert link(None, "stalled") == f"{DEFAULT_RUNBOOK_BASE}#stalled"
    assert link("http://10.0.0.5:8080/guide", "slow") == "http://10.0.0.5:8080/guide#slow"
    for bad in (
        "docs/operator-guide.md",
        "ftp://x.example/a",
        "https://",
        "https://x.example/a#b",
        "https://x/a b",
    ):
        with pytest.raises(BadRunbookBase):
            check_base(bad)


def test_render_rules_takes_the_base_from_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[alerts]\nrunbook_url = "https://wiki.example/gpu/operator-guide"\n')
    out = tmp_path / "rules.yml"
    assert main(["render-rules", str(RULES), "--config", str(config), "-o", str(out)]) == 0
    rules = [r for g in yaml.safe_load(out.read_text())["groups"] for r in g["rules"] if "alert" in r]
    urls = {r["annotations"]["runbook_url"] for r in rules}
    assert {u.split("#")[0] for u in urls} == {"https://wiki.example/gpu/operator-guide"}
    assert len(rule_links(out.read_text())) == len(rules)


def test_render_rules_refuses_a_relative_base_and_a_file_without_runbooks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["render-rules", str(RULES), "--runbook-base", "docs/guide.md"]) == 2
    assert "expected an absolute http(s) URL" in capsys.readouterr().err
    other = tmp_path / "other.yml"
    other.write_text("groups: []\n")
    assert main(["render-rules", str(other), "--runbook-base", "https://x.example/g"]) == 2
    assert "not a gpu-watchdog rule file" in capsys.readouterr().err


def test_every_flag_the_code_tells_a_user_to_pass_exists() -> None:
    """Error messages, help texts and docstrings that say `gpu-watchdog CMD ... --flag` name real flags."""
    import re

    from gpu_triage.cli.main import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    told = set()
    for path in (REPO / "watchdog").rglob("*.py"):
        for match in re.finditer(
            r"gpu-watchdog ([a-z][a-z-]+)((?: [^`\"'\n]*?)?(?: \[?--[a-z][a-z-]+)+)", path.read_text()
        ):
            for flag in re.findall(r"--[a-z][a-z-]+", match.group(2)):
                told.add((match.group(1), flag, path.name))
    assert any(cmd == "triage" and flag == "--columns" for cmd, flag, _ in told)  # the headerless-CSV hint
    missing = [
        (cmd, flag, where)
        for cmd, flag, where in sorted(told)
        if cmd in sub.choices and flag not in sub.choices[cmd]._option_string_actions
    ]
    assert missing == []
