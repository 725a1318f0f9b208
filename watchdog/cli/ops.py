"""Operator commands that never start the daemon: ``check-config`` and ``render-rules``.

``gpu-watchdog check-config [--config FILE]`` loads a configuration exactly as ``run`` does (defaults,
the file, ``GPU_WATCHDOG_*`` environment overrides), reads the secrets it names (token, sink keys),
and exits 0 ("ok") or 2 with one line per problem naming the file and the key. Run it before a
restart: a bad file then never takes a node's watchdog down.

``gpu-watchdog render-rules RULES`` rewrites every ``runbook_url`` of a rule file to the configured
absolute base (``alerts.runbook_url``, or ``--runbook-base``); see :mod:`gpu_triage.model.runbook`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_BAD = 0, 2

_CHECK_EPILOG = """\
examples:
  gpu-watchdog check-config --config /etc/gpu-watchdog/config.toml && systemctl restart gpu-watchdog
  GPU_WATCHDOG_ACTIONS__MODE=kill gpu-watchdog check-config      # the environment counts too

Exit status: 0 the configuration is valid, 2 it is not (one line per problem: file, key, expected,
actual). Nothing is started, no port is opened, no state is written.
"""

_RENDER_EPILOG = """\
examples:
  gpu-watchdog render-rules deploy/prometheus/gpu-watchdog.rules.yml \\
      --config /etc/gpu-watchdog/config.toml -o /etc/prometheus/rules/gpu-watchdog.rules.yml
  gpu-watchdog render-rules gpu-watchdog.rules.yml --runbook-base https://wiki.example/gpu/operator-guide

Every `runbook_url: "...#anchor"` line becomes `runbook_url: "<base>#anchor"`; nothing else changes.
Check the result with `promtool check rules FILE`. Exit status: 0 written, 2 bad input.
"""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``check-config`` and ``render-rules`` on the ``gpu-watchdog`` sub-parsers."""
    c = sub.add_parser(
        "check-config",
        help="validate a configuration without starting anything (exit 0 ok, 2 errors)",
        description="Load the configuration as `gpu-watchdog run` would (defaults, the file, "
        "GPU_WATCHDOG_* environment) and read the secret files it names; report every problem.",
        epilog=_CHECK_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument(
        "--config",
        metavar="TOML",
        help="configuration file (default /etc/gpu-watchdog/config.toml when it exists)",
    )
    c.set_defaults(func=cmd_check_config)

    r = sub.add_parser(
        "render-rules",
        help="write the Prometheus rules with absolute runbook links from the configured base URL",
        description="Rewrite every runbook_url of a gpu-watchdog rule file to <base>#<anchor>, with the "
        "base from --runbook-base or alerts.runbook_url of the configuration.",
        epilog=_RENDER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("rules", metavar="RULES", help="the rule file (deploy/prometheus/gpu-watchdog.rules.yml)")
    r.add_argument("--runbook-base", metavar="URL", help="absolute http(s) base URL of the runbook")
    r.add_argument("--config", metavar="TOML", help="take the base from this file's alerts.runbook_url")
    r.add_argument("-o", "--out", metavar="FILE", help="write here (default: standard output)")
    r.set_defaults(func=cmd_render_rules)

    e = sub.add_parser(
        "evidence-report",
        help="write report.html into an evidence bundle: ranks grouped by where they wait",
        description="Read an evidence bundle (index.json, the py-spy dumps, status.json) and write "
        "BUNDLE_DIR/report.html: one self-contained page (no script, nothing loaded from elsewhere) with "
        "every rank grouped under the place its stack waits (collective and call site), the verdict's "
        "findings and the bundle's items. The daemon writes it at every capture; this rewrites it, for "
        "older bundles too. Exit status: 0 written, 2 not a bundle.",
        epilog="example:\n"
        "  gpu-watchdog evidence-report /var/lib/gpu-watchdog/evidence/20261203T165613Z-myjob\n"
        "  xdg-open /var/lib/gpu-watchdog/evidence/20261203T165613Z-myjob/report.html",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument("bundle", metavar="BUNDLE_DIR", help="an evidence bundle directory (has index.json)")
    e.set_defaults(func=cmd_evidence_report)


def cmd_evidence_report(args: argparse.Namespace) -> int:
    from gpu_triage.actions.evidence_report import ReportError, write_report

    try:
        out = write_report(Path(args.bundle))
    except (ReportError, OSError) as error:
        print(f"gpu-watchdog evidence-report: error: {error}", file=sys.stderr)
        return 2
    print(out)
    return 0


def check_config(config_arg: str | None, env: dict[str, str]) -> tuple[int, list[str]]:
    """``(exit code, lines)`` for ``check-config`` (pure apart from reading the files)."""
    from gpu_triage.daemon.build import start_checks
    from gpu_triage.daemon.config import (
        ConfigError,
        load_config,
        load_secret,
        missing_token_note,
        resolve_config_path,
        token_file_absent,
    )

    path = resolve_config_path(Path(config_arg) if config_arg else None)
    where = str(path) if path is not None else "defaults and environment (no config file)"
    problems: list[str] = []
    try:
        config = load_config(path, env)
    except ConfigError as e:
        return EXIT_BAD, [*e.problems, f"{where}: {len(e.problems)} problem(s)"]
    for check in start_checks():  # exactly what `run` checks before its first cycle
        try:
            check(config)
        except ConfigError as e:
            problems.extend(e.problems)
    for i, sink in enumerate(config.alerts.sinks):
        for attr in ("routing_key_file", "url_file"):
            secret = getattr(sink, attr, None)
            if secret is not None:
                try:
                    load_secret(Path(secret), f"alerts.sinks[{i}].{attr}")
                except ConfigError as e:
                    problems.extend(f"alerts.sinks[{i}].{attr}: {p}" for p in e.problems)
    if problems:
        return EXIT_BAD, [*problems, f"{where}: {len(problems)} problem(s)"]
    notes = [f"note: {missing_token_note(config)}"] if token_file_absent(config) else []
    summary = (
        f"{where}: ok (node {config.daemon.node}, mode {config.actions.mode}, "
        f"listen {config.daemon.listen}, state {config.daemon.state_dir})"
    )
    return EXIT_OK, [*notes, summary]


def cmd_check_config(args: argparse.Namespace) -> int:
    code, lines = check_config(args.config, dict(os.environ))
    stream = sys.stdout if code == EXIT_OK else sys.stderr
    for line in lines:
        print(line if code == EXIT_OK else f"gpu-watchdog check-config: {line}", file=stream)
    return code


def cmd_render_rules(args: argparse.Namespace) -> int:
    from gpu_triage.daemon.config import ConfigError, load_config, resolve_config_path
    from gpu_triage.model.runbook import DEFAULT_RUNBOOK_BASE, BadRunbookBase, render_rules

    def fail(message: str) -> int:
        print(f"gpu-watchdog render-rules: {message}", file=sys.stderr)
        return EXIT_BAD

    base = args.runbook_base
    if base is None:
        try:
            path = resolve_config_path(Path(args.config) if args.config else None)
            base = load_config(path, dict(os.environ)).alerts.runbook_url
        except ConfigError as e:
            return fail(str(e))
        if base is None:
            print(
                "gpu-watchdog render-rules: alerts.runbook_url is not set; using the placeholder "
                f"{DEFAULT_RUNBOOK_BASE}",
                file=sys.stderr,
            )
            base = DEFAULT_RUNBOOK_BASE
    try:
        text = Path(args.rules).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return fail(f"{args.rules}: cannot read: {e}")
    try:
        rendered = render_rules(text, base)
    except BadRunbookBase as e:
        return fail(f"--runbook-base / alerts.runbook_url: {e}")
    except ValueError as e:
        return fail(f"{args.rules}: {e}")
    if args.out:
        try:
            Path(args.out).write_text(rendered, encoding="utf-8")
        except OSError as e:
            return fail(f"{args.out}: cannot write: {e}")
    else:
        sys.stdout.write(rendered)
    return EXIT_OK
