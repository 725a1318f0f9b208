"""Absolute runbook links: one configured base URL for the daemon's alerts and the Prometheus rules.

A ``runbook_url`` must open from a phone at 3 a.m., so it is always absolute
(``https://.../operator-guide#deadlock_confirmed``). The base comes from ``alerts.runbook_url`` in
config.toml; where it is not set the placeholder :data:`DEFAULT_RUNBOOK_BASE` is used (a reserved
``.example`` domain: set the key to where you publish ``docs/operator-guide.md``). The anchors are the
verdict names (and ``deterministic_hang``, ``daemon_down``, ``rank_step_lag``), one heading each in
the operator guide's runbook.

The rule file in ``deploy/prometheus`` is shipped rendered with the placeholder;
``gpu-watchdog render-rules`` rewrites every ``runbook_url`` of it to the configured base (pure text
rewriting, :func:`render_rules`, so comments and layout survive).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

DEFAULT_RUNBOOK_BASE = "https://runbooks.example/gpu-watchdog/operator-guide"
"""Placeholder base (RFC 2606 reserved domain); ``alerts.runbook_url`` replaces it."""

_RUNBOOK_LINE = re.compile(r'^(?P<lead>\s*runbook_url:\s*)"(?P<base>[^"#]*)#(?P<anchor>[\w-]+)"\s*$')


class BadRunbookBase(ValueError):
    """The base URL is not an absolute http(s) URL (or carries a fragment)."""


def check_base(base: str) -> str:
    """``base`` without a trailing ``/``, or :class:`BadRunbookBase` naming what is wrong."""
    parts = urlsplit(base)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise BadRunbookBase(f"expected an absolute http(s) URL, got {base!r}")
    if parts.fragment or base.endswith("#"):
        raise BadRunbookBase(f"expected a URL without '#' (the anchor is added per alert), got {base!r}")
    if any(c in base for c in ' "\n\r\t'):
        raise BadRunbookBase(f"expected a URL without spaces or quotes, got {base!r}")
    return base.rstrip("/")


def link(base: str | None, anchor: str) -> str:
    """``base#anchor``, with :data:`DEFAULT_RUNBOOK_BASE` when ``base`` is unset."""
    return f"{check_base(base or DEFAULT_RUNBOOK_BASE)}#{anchor}"


def rule_links(text: str) -> list[tuple[int, str, str]]:
    """Every ``runbook_url`` of a rule file as ``(line number, base, anchor)``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        match = _RUNBOOK_LINE.match(line)
        if match:
            found.append((number, match["base"], match["anchor"]))
    return found


def render_rules(text: str, base: str) -> str:
    """The rule file ``text`` with every ``runbook_url`` pointing at ``base#<its anchor>``.

    Raises :class:`BadRunbookBase` for a bad base, and ValueError when the file has no
    ``runbook_url: "...#anchor"`` line at all (the wrong file)."""
    base = check_base(base)
    out = []
    count = 0
    for line in text.splitlines(keepends=True):
        match = _RUNBOOK_LINE.match(line.rstrip("\r\n"))
        if match:
            count += 1
            ending = line[len(line.rstrip("\r\n")) :]
            line = f'{match["lead"]}"{base}#{match["anchor"]}"{ending}'
        out.append(line)
    if count == 0:
        raise ValueError('no `runbook_url: "...#anchor"` line found: not a gpu-watchdog rule file?')
    return "".join(out)
