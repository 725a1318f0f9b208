"""Checkers for configuration values: each turns a raw TOML (or environment) value into the typed value
or raises :class:`~gpu_triage.model.config_schema.Invalid` saying what was expected. Pure and standard
library only; a section's field uses one as ``setting(default, parse=check, doc=...)``.

A checker marked :func:`takes_text` reads text: an environment override ``123`` for it stays the
string ``"123"`` (``node = 123`` means the host named "123").
"""

from __future__ import annotations

import enum
import ipaddress
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_triage.model.config_schema import Invalid

Checker = Callable[[Any], Any]
SOURCE_NAMES = ("auto", "nvml", "sim", "none")


def takes_text(check: Checker) -> bool:
    """Whether ``check`` reads text (see the module docstring)."""
    return bool(getattr(check, "takes_text", False))


def _fmt(x: float) -> str:
    return f"{x:g}"


def _takes_text(check: Checker) -> Checker:
    """Mark ``check`` as reading text."""
    check.takes_text = True  # type: ignore[attr-defined]
    return check


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False) -> Checker:
    if low is not None and high is not None:
        expected = f"a number between {_fmt(low)} and {_fmt(high)}"
        if low_open:
            expected = f"a number above {_fmt(low)} and at most {_fmt(high)}"
    elif low is not None:
        expected = f"a number above {_fmt(low)}" if low_open else f"a number of at least {_fmt(low)}"
    else:
        expected = "a number"

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise Invalid(expected)
        if low is not None and (value <= low if low_open else value < low):
            raise Invalid(expected)
        if high is not None and value > high:
            raise Invalid(expected)
        return float(value)

    return check


def integer(low: int, high: int | None = None) -> Checker:
    expected = f"an integer between {low} and {high}" if high is not None else f"an integer of at least {low}"

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(expected)
        if value < low or (high is not None and value > high):
            raise Invalid(expected)
        return value

    return check


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid("true or false")
    return value


@_takes_text
def nonempty_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Invalid("a non-empty string")
    return value


def choice(*options: str) -> Checker:
    expected = "one of " + ", ".join(options)

    def check(value: Any) -> str:
        if value not in options:
            raise Invalid(expected)
        return str(value)

    return _takes_text(check)


@_takes_text
def path_value(value: Any) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise Invalid("a path")
    return Path(value).expanduser()


@_takes_text
def optional_path(value: Any) -> Path | None:
    """A path, or "" for none (TOML has no null)."""
    if value == "":
        return None
    return path_value(value)


@_takes_text
def optional_text(value: Any) -> str | None:
    if value == "":
        return None
    return nonempty_text(value)


def runbook_base(value: Any) -> str | None:
    """An absolute http(s) URL without '#' ("" = the placeholder base, gpu_triage.model.runbook)."""
    from gpu_triage.model.runbook import BadRunbookBase, check_base

    if value == "":
        return None
    try:
        return check_base(nonempty_text(value))
    except BadRunbookBase as e:
        raise Invalid(str(e).removeprefix("expected ").split(", got ")[0]) from None


@_takes_text
def optional_http_url(value: Any) -> str | None:
    """An http(s) URL with a host ("" = none)."""
    from urllib.parse import urlsplit

    expected = 'an http(s) URL (e.g. "http://prometheus:9090"), or "" for none'
    if value == "":
        return None
    if not isinstance(value, str) or len(value) > 2048 or any(c.isspace() for c in value):
        raise Invalid(expected)
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise Invalid(expected)
    return value


def argv(value: Any) -> tuple[str, ...]:
    """A command as an argument vector (never run through a shell); [] for none."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise Invalid('a list of non-empty strings (an argument vector, e.g. ["scancel", "--signal=TERM"])')
    return tuple(value)


def host_names(value: Any) -> tuple[str, ...]:
    """Host names (no port, no spaces or slashes), or ``"*"`` for any."""
    expected = 'a list of host names (e.g. ["node01.cluster.example"]), or ["*"] for any'
    if not isinstance(value, list) or not all(
        isinstance(v, str) and v and len(v) <= 253 and not any(c.isspace() or c in "/@?#" for c in v)
        for v in value
    ):
        raise Invalid(expected)
    return tuple(value)


@_takes_text
def listen_address(value: Any) -> str:
    """``HOST:PORT`` with HOST an IPv4 address, a host name or ``[IPv6]``."""
    expected = 'HOST:PORT (e.g. "127.0.0.1:9410" or "[::1]:9410"; port 0 picks a free one)'
    if not isinstance(value, str):
        raise Invalid(expected)
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise Invalid(expected)
    if host.startswith("["):
        if not host.endswith("]"):
            raise Invalid(expected)
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise Invalid(expected) from None
    elif ":" in host or any(c.isspace() for c in host):
        raise Invalid(expected)
    return value


@_takes_text
def source_spec(value: Any) -> str:
    expected = "auto, nvml, sim, none or replay:FILE"
    if not isinstance(value, str):
        raise Invalid(expected)
    if value in SOURCE_NAMES:
        return value
    if value.startswith("replay:") and len(value) > len("replay:"):
        return value
    raise Invalid(expected)


def enum_value(cls: type[enum.Enum]) -> Checker:
    """One of an enum's values (text), as the member."""
    options = choice(*(str(m.value) for m in cls))

    def check(value: Any) -> Any:
        return cls(options(value))

    return _takes_text(check)
