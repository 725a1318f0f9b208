"""The daemon's configuration: TOML file + ``GPU_WATCHDOG_<SECTION>__<KEY>`` environment overrides,
validated into frozen dataclasses.

Where it comes from, lowest precedence first:

1. the defaults below (each documented, with its unit, in ``deploy/config.example.toml``);
2. the TOML file (``/etc/gpu-watchdog/config.toml`` or ``--config FILE``);
3. environment variables ``GPU_WATCHDOG_<SECTION>__<KEY>`` (double underscore between levels, e.g.
   ``GPU_WATCHDOG_DAEMON__PERIOD_S=0.5`` or ``GPU_WATCHDOG_CLASSIFIER__DWELL_S__COMPUTE=3``). A value is
   parsed as a TOML value (``0.5``, ``true``, ``["scancel", "123"]``) and otherwise taken as a string.
   Variables without a double underscore (``GPU_WATCHDOG_PROGRESS_DIR``, the trainer's) are not
   overrides. ``[[alerts.sinks]]`` cannot be set from the environment;
4. command-line flags (:func:`override`), e.g. ``--listen``, ``--state-dir``, ``--source``.

Every problem is reported, not just the first, each naming where the value came from (the file or the
environment variable), the dotted key, what was expected and what was found::

    config.toml: daemon.period_s: expected a number between 0.1 and 60, got "fast"

Unknown keys are errors, with a did-you-mean. The schema is the dataclasses below: each field's
metadata holds its checker, so adding a key is one line here and one documented line in the example.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import math
import os
import socket
import stat
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpu_triage.alerts.registry import SINK_KINDS
from gpu_triage.model.config_schema import TomlLines
from gpu_triage.model.limits import MAX_CONFIG_BYTES, InputTooLarge, read_regular_file
from gpu_triage.model.states import GpuState, Mode

DEFAULT_CONFIG_PATH = Path("/etc/gpu-watchdog/config.toml")
ENV_PREFIX = "GPU_WATCHDOG_"
MAX_SECRET_BYTES = 64 * 1024
ENV_SEPARATOR = "__"
SOURCE_NAMES = ("auto", "nvml", "sim", "none")


class ConfigError(ValueError):
    """One or more configuration problems; ``str()`` lists them one per line."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


# --------------------------------------------------------------------------------------------------
# Checkers: each turns a raw TOML/env value into the typed value or returns an error text
# ("expected ..."). They are pure and carried in the dataclass field metadata.


class _Invalid(Exception):
    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


Checker = Callable[[Any], Any]


MISSING: Any = type("Missing", (), {"__repr__": lambda self: "nothing"})()
"""Shown as ``got nothing`` when a required key is absent."""


def show(value: Any) -> str:
    """A value as an error message prints it: strings quoted, booleans as TOML writes them."""
    if value is MISSING:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return repr(value)


def _fmt(x: float) -> str:
    return f"{x:g}"


def _takes_text(check: Checker) -> Checker:
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
            raise _Invalid(expected)
        if low is not None and (value <= low if low_open else value < low):
            raise _Invalid(expected)
        if high is not None and value > high:
            raise _Invalid(expected)
        return float(value)

    return check


def integer(low: int, high: int | None = None) -> Checker:
    expected = f"an integer between {low} and {high}" if high is not None else f"an integer of at least {low}"

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(expected)
        if value < low or (high is not None and value > high):
            raise _Invalid(expected)
        return value

    return check


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("true or false")
    return value


@_takes_text
def nonempty_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("a non-empty string")
    return value


def choice(*options: str) -> Checker:
    expected = "one of " + ", ".join(options)

    def check(value: Any) -> str:
        if value not in options:
            raise _Invalid(expected)
        return str(value)

    return _takes_text(check)


_MODE_CHOICE = choice(*(m.value for m in Mode))


@_takes_text
def _mode(value: Any) -> Mode:
    return Mode(_MODE_CHOICE(value))


@_takes_text
def path_value(value: Any) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("a path")
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
        raise _Invalid(str(e).removeprefix("expected ").split(", got ")[0]) from None


@_takes_text
def optional_http_url(value: Any) -> str | None:
    """An http(s) URL with a host ("" = none)."""
    from urllib.parse import urlsplit

    expected = 'an http(s) URL (e.g. "http://prometheus:9090"), or "" for none'
    if value == "":
        return None
    if not isinstance(value, str) or len(value) > 2048 or any(c.isspace() for c in value):
        raise _Invalid(expected)
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise _Invalid(expected)
    return value


def argv(value: Any) -> tuple[str, ...]:
    """A command as an argument vector (never run through a shell); [] for none."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _Invalid('a list of non-empty strings (an argument vector, e.g. ["scancel", "--signal=TERM"])')
    return tuple(value)


def host_names(value: Any) -> tuple[str, ...]:
    """Host names (no port, no spaces or slashes), or ``"*"`` for any."""
    expected = 'a list of host names (e.g. ["node01.cluster.example"]), or ["*"] for any'
    if not isinstance(value, list) or not all(
        isinstance(v, str) and v and len(v) <= 253 and not any(c.isspace() or c in "/@?#" for c in v)
        for v in value
    ):
        raise _Invalid(expected)
    return tuple(value)


@_takes_text
def listen_address(value: Any) -> str:
    """``HOST:PORT`` with HOST an IPv4 address, a host name or ``[IPv6]``."""
    expected = 'HOST:PORT (e.g. "127.0.0.1:9410" or "[::1]:9410"; port 0 picks a free one)'
    if not isinstance(value, str):
        raise _Invalid(expected)
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise _Invalid(expected)
    if host.startswith("["):
        if not host.endswith("]"):
            raise _Invalid(expected)
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise _Invalid(expected) from None
    elif ":" in host or any(c.isspace() for c in host):
        raise _Invalid(expected)
    return value


@_takes_text
def source_spec(value: Any) -> str:
    expected = "auto, nvml, sim, none or replay:FILE"
    if not isinstance(value, str):
        raise _Invalid(expected)
    if value in SOURCE_NAMES:
        return value
    if value.startswith("replay:") and len(value) > len("replay:"):
        return value
    raise _Invalid(expected)


def dwell_table(value: Any) -> Mapping[str, float]:
    """``{state = seconds}`` for the GPU states; checked key by key in :func:`_check_mapping`."""
    raise AssertionError("handled by _check_mapping")  # pragma: no cover


_DWELL_CHECK = number(0.0, 3600.0)


def meta(check: Checker, doc: str) -> dict[str, Any]:
    """A schema field's metadata: its checker and a one-line description."""
    return {"check": check, "doc": doc}


def _default_node() -> str:
    return socket.gethostname()


# --------------------------------------------------------------------------------------------------
# The schema.


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    node: str = field(
        default_factory=_default_node,
        metadata=meta(nonempty_text, "node name in metrics, alerts and /status"),
    )
    source: str = field(default="auto", metadata=meta(source_spec, "telemetry source"))
    listen: str = field(default="127.0.0.1:9410", metadata=meta(listen_address, "REST + /metrics address"))
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata=meta(host_names, "names a request's Host header may use besides addresses and localhost"),
    )
    state_dir: Path = field(
        default=Path("/var/lib/gpu-watchdog"), metadata=meta(path_value, "event store and evidence")
    )
    period_s: float = field(default=1.0, metadata=meta(number(0.1, 60), "GPU telemetry period"))
    process_period_s: float = field(
        default=1.0, metadata=meta(number(0.1, 60), "process and progress period")
    )
    nvml_deadline_s: float = field(
        default=0.5, metadata=meta(number(0.01, 10), "hard deadline of one NVML read")
    )
    log_level: str = field(
        default="info", metadata=meta(choice("debug", "info", "warning", "error"), "log level")
    )
    log_format: str = field(
        default="text", metadata=meta(choice("text", "json"), "log lines: human text or one JSON object each")
    )


@dataclass(frozen=True, slots=True)
class ProgressConfig:
    dir: Path = field(
        default=Path("/run/gpu-watchdog/progress"), metadata=meta(path_value, "trainer progress files")
    )
    stale_after_s: float = field(
        default=600.0, metadata=meta(number(10, 86400), "silence after which a file is stale")
    )


@dataclass(frozen=True, slots=True)
class ClassifierConfig:
    table: Path | None = field(
        default=None, metadata=meta(optional_path, "power table file overriding the built-in lookup")
    )
    model: str | None = field(default=None, metadata=meta(optional_text, "table model forced for every GPU"))
    dwell_s: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata=meta(dwell_table, "per-state minimum dwell overrides"),
    )


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """Mirrors :class:`gpu_triage.verdicts.detector.DetectorConfig` field for field (see its docstring
    for what each verdict needs); the daemon builds the detector's config from this one."""

    fast_min_s: float = field(
        default=15.0,
        metadata=meta(number(1, 600), "hung (K1/K2): shortest freeze of the train ranks that counts"),
    )
    k_fast: float = field(
        default=1.5, metadata=meta(number(1, 100), "... and at least this many learned step intervals")
    )
    k_remote: float = field(
        default=2.5,
        metadata=meta(
            number(1, 100), "K2 with ranks on other nodes, K5 (asymmetric): this many step intervals"
        ),
    )
    spin_min_s: float = field(
        default=10.0, metadata=meta(number(0, 600), "every job GPU in the spin band at least this long")
    )
    stall_min_s: float = field(
        default=60.0, metadata=meta(number(1, 3600), "stalled/slow: shortest freeze without proof of a hang")
    )
    k_stall: float = field(
        default=3.0, metadata=meta(number(1, 100), "... and at least this many learned step intervals")
    )
    disagree_min_s: float = field(
        default=15.0, metadata=meta(number(1, 600), "phase disagreement with frozen train ranks")
    )
    power_only_after_s: float = field(
        default=120.0,
        metadata=meta(number(10, 180), "no progress files: spin band (or asymmetric) this long -> stalled"),
    )
    power_only_can_kill: bool = field(
        default=False,
        metadata=meta(
            boolean, "let power alone (no progress files) be kill-worthy: a remote save looks the same"
        ),
    )
    confirm_after_s: float = field(
        default=120.0, metadata=meta(number(1, 3600), "suspected this long -> deadlock_confirmed")
    )
    write_active_bytes: float = field(
        default=4 * 2**20, metadata=meta(number(0), "bytes written within write_window_s = 'writing'")
    )
    read_active_bytes: float = field(
        default=4 * 2**20, metadata=meta(number(0), "bytes read within write_window_s = 'reading'")
    )
    write_window_s: float = field(
        default=10.0, metadata=meta(number(1, 600), "window for write_active_bytes and read_active_bytes")
    )
    lease_grace_s: float = field(
        default=5.0, metadata=meta(number(0, 3600), "tolerance past an announced lease_until")
    )
    starvation_after_s: float = field(
        default=30.0, metadata=meta(number(1, 3600), "sustained starvation -> data_starvation")
    )
    telemetry_lost_after_s: float = field(
        default=10.0, metadata=meta(number(1, 600), "failed reads -> telemetry_lost")
    )
    default_step_interval_s: float = field(
        default=60.0, metadata=meta(number(0.01, 3600), "step interval assumed until the job's is learned")
    )
    first_step_default_s: float = field(
        default=600.0,
        metadata=meta(number(1, 86400), "first step after a start, before any first step was seen"),
    )
    k_first: float = field(
        default=2.0, metadata=meta(number(1, 100), "a first step may take this x the longest seen")
    )
    interval_decay: float = field(
        default=0.1, metadata=meta(number(0, 1), "how fast the learned step interval comes down")
    )
    cpu_contention_ratio: float = field(
        default=0.9, metadata=meta(number(0, 64), "a starving rank using this share of a core is CPU-bound")
    )
    slow_max_budgets: float = field(
        default=10.0,
        metadata=meta(
            number(1, 1000), "slow (GPUs computing, steps frozen) this many stall budgets -> stalled"
        ),
    )
    idle_held_after_s: float = field(
        default=300.0,
        metadata=meta(
            number(10, 86400), "no progress files: job GPUs idle with memory held this long -> cannot_judge"
        ),
    )


@dataclass(frozen=True, slots=True)
class StacksConfig:
    """Stack evidence (py-spy): the sampler's schedule and budget, and what the detector makes of it."""

    enabled: bool = field(default=True, metadata=meta(boolean, "sample the ranks' Python stacks with py-spy"))
    py_spy: str = field(
        default="auto", metadata=meta(nonempty_text, "py-spy binary, or auto (PATH, then beside python)")
    )
    nonblocking: bool = field(
        default=True, metadata=meta(boolean, "dump without pausing the rank (py-spy --nonblocking)")
    )
    healthy_interval_s: float = field(
        default=60.0, metadata=meta(number(1, 86400), "dump interval of a job whose steps advance")
    )
    blind_interval_s: float = field(
        default=5.0, metadata=meta(number(1, 86400), "dump interval of a job without progress files")
    )
    suspect_interval_s: float = field(
        default=3.0, metadata=meta(number(0.5, 3600), "dump interval on suspicion")
    )
    timeout_s: float = field(default=5.0, metadata=meta(number(0.5, 120), "limit of one py-spy dump"))
    budget_cpu_s_per_min: float = field(
        default=3.0, metadata=meta(number(0.01, 60), "py-spy CPU seconds allowed per rolling minute")
    )
    max_parallel: int = field(default=2, metadata=meta(integer(1, 16), "jobs dumped at the same time"))
    frozen_s: float = field(
        default=20.0, metadata=meta(number(1, 86400), "a stack unchanged this long is frozen")
    )
    min_samples: int = field(
        default=4, metadata=meta(integer(2, 1000), "dumps in a row a frozen stack must span")
    )
    fresh_s: float = field(
        default=30.0, metadata=meta(number(1, 86400), "a dump older than this is not used")
    )
    checkpoint_max_s: float = field(
        default=1800.0,
        metadata=meta(number(1, 604800), "a save longer than this: stalled_checkpoint"),
    )
    asleep_cpu_ratio: float = field(
        default=0.3, metadata=meta(number(0, 64), "a rank below this share of a core is asleep on the host")
    )

    def detector_settings(self) -> dict[str, float | int]:
        """The keys the detector reads (``stacks_*`` fields of its config)."""
        return {
            "stacks_frozen_s": self.frozen_s,
            "stacks_min_samples": self.min_samples,
            "stacks_fresh_s": self.fresh_s,
            "stacks_checkpoint_max_s": self.checkpoint_max_s,
            "stacks_asleep_cpu_ratio": self.asleep_cpu_ratio,
        }


@dataclass(frozen=True, slots=True)
class RasConfig:
    """NCCL RAS as live evidence: polled rarely, only while a job is under suspicion."""

    enabled: bool = field(default=True, metadata=meta(boolean, "poll NCCL's RAS service on suspicion"))
    host: str = field(default="localhost", metadata=meta(nonempty_text, "RAS address (NCCL_RAS_ADDR)"))
    port: int = field(default=28028, metadata=meta(integer(1, 65535), "RAS port"))
    min_interval_s: float = field(
        default=60.0, metadata=meta(number(10, 86400), "at most one poll this often")
    )
    timeout_s: float = field(default=5.0, metadata=meta(number(0.5, 60), "limit of one poll"))


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Other nodes' facts about a job from the Prometheus that scrapes every daemon (docs/cluster.md)."""

    prometheus_url: str | None = field(
        default=None,
        metadata=meta(optional_http_url, "Prometheus (or Thanos/Mimir) query API; empty: per-node only"),
    )
    min_interval_s: float = field(
        default=5.0, metadata=meta(number(1, 3600), "at most one query per suspicious job this often")
    )
    timeout_s: float = field(default=3.0, metadata=meta(number(0.1, 60), "limit of one query"))
    max_response_bytes: int = field(
        default=32 << 20, metadata=meta(integer(1024, 1 << 30), "an answer larger than this is refused")
    )
    stale_after_s: float = field(
        default=15.0, metadata=meta(number(1, 3600), "another node's facts older than this are unknown")
    )

    def detector_settings(self) -> dict[str, Any]:
        """The detector's fleet settings (the node's name comes from [daemon] node)."""
        return {"fleet_stale_after_s": self.stale_after_s}


@dataclass(frozen=True, slots=True)
class EventsConfig:
    retention_days: float = field(
        default=30.0, metadata=meta(number(0, 3650, low_open=True), "age limit of events")
    )
    max_bytes: int = field(
        default=256 << 20, metadata=meta(integer(1 << 20), "size limit of the event database")
    )
    prune_interval_s: float = field(
        default=600.0, metadata=meta(number(10, 86400), "how often retention runs")
    )


@dataclass(frozen=True, slots=True)
class EvidenceConfig:
    retention_days: float = field(
        default=30.0, metadata=meta(number(0, 3650, low_open=True), "age limit of evidence bundles")
    )
    max_bundles: int = field(
        default=50, metadata=meta(integer(1, 100000), "most evidence bundles kept (the oldest go first)")
    )


@dataclass(frozen=True, slots=True)
class AuthConfig:
    token_file: Path | None = field(
        default=None, metadata=meta(optional_path, "bearer token for mutating endpoints")
    )
    token_file_optional: bool = field(
        default=False,
        metadata=meta(
            boolean,
            "a missing token_file is no error: mutating calls answer 403 (logged) until it appears",
        ),
    )


@dataclass(frozen=True, slots=True)
class ActionsConfig:
    mode: Mode = field(default=Mode.OBSERVE, metadata=meta(_mode, "observe, alert or kill"))
    capture_after_s: float = field(
        default=0.0, metadata=meta(number(0, 3600), "suspected -> evidence capture")
    )
    capture_timeout_s: float = field(
        default=30.0, metadata=meta(number(1, 600), "limit of one capture command")
    )
    alert_after_s: float = field(default=30.0, metadata=meta(number(0, 3600), "suspected -> alert"))
    sigterm_after_s: float = field(
        default=60.0, metadata=meta(number(0, 86400), "confirmed -> SIGTERM (kill mode)")
    )
    sigkill_grace_s: float = field(default=30.0, metadata=meta(number(1, 3600), "SIGTERM -> SIGKILL"))
    max_kills_per_hour: int = field(
        default=1, metadata=meta(integer(0, 100), "kills allowed per rolling hour")
    )
    kill_hook: tuple[str, ...] = field(default=(), metadata=meta(argv, "command run instead of signals"))
    dry_run: bool = field(
        default=False, metadata=meta(boolean, "log what would be signalled, signal nothing")
    )
    kill_via: str = field(
        default="auto",
        metadata=meta(choice("auto", "signal", "slurm"), "stop a job with signals or Slurm's scancel"),
    )
    slurm_cancel: str = field(
        default="job", metadata=meta(choice("job", "step"), "scancel the whole job or the ranks' step")
    )
    slurm_bin_dir: Path | None = field(
        default=None, metadata=meta(optional_path, "directory of scancel/squeue (default: PATH)")
    )


@dataclass(frozen=True, slots=True)
class SinkConfig:
    kind: str = field(default="webhook", metadata=meta(choice(*SINK_KINDS), "receiver type"))
    name: str = field(default="", metadata=meta(nonempty_text, "name in logs and metrics (default: kind-N)"))
    url: str | None = field(default=None, metadata=meta(optional_text, "receiver URL"))
    url_file: Path | None = field(
        default=None, metadata=meta(optional_path, "file holding the URL (Slack's is a secret)")
    )
    routing_key_file: Path | None = field(
        default=None, metadata=meta(optional_path, "PagerDuty routing key file")
    )
    timeout_s: float = field(default=5.0, metadata=meta(number(0.1, 60), "HTTP timeout of one delivery"))


@dataclass(frozen=True, slots=True)
class AlertsConfig:
    resend_interval_s: float = field(default=60.0, metadata=meta(number(10, 3600), "re-send active alerts"))
    retry_initial_s: float = field(
        default=1.0, metadata=meta(number(0.1, 600), "first retry delay (doubles, with jitter)")
    )
    retry_max_s: float = field(default=300.0, metadata=meta(number(1, 3600), "longest retry delay"))
    runbook_url: str | None = field(
        default=None,
        metadata=meta(runbook_base, "absolute base URL of the runbook (alerts and render-rules)"),
    )
    sinks: tuple[SinkConfig, ...] = field(
        default=(), metadata=meta(lambda v: v, "[[alerts.sinks]] receivers")
    )


@dataclass(frozen=True, slots=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    progress: ProgressConfig = field(default_factory=ProgressConfig)
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    stacks: StacksConfig = field(default_factory=StacksConfig)
    ras: RasConfig = field(default_factory=RasConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    actions: ActionsConfig = field(default_factory=ActionsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    origin: str = field(default="defaults", compare=False)
    """Where the configuration came from (for logs): a file name or 'defaults'."""


SECTIONS: dict[str, type] = {
    "daemon": DaemonConfig,
    "progress": ProgressConfig,
    "classifier": ClassifierConfig,
    "detector": DetectorConfig,
    "stacks": StacksConfig,
    "ras": RasConfig,
    "cluster": ClusterConfig,
    "events": EventsConfig,
    "evidence": EvidenceConfig,
    "auth": AuthConfig,
    "actions": ActionsConfig,
    "alerts": AlertsConfig,
}


def schema_keys() -> list[str]:
    """Every dotted key the configuration knows (``alerts.sinks.url`` for the sink tables)."""
    keys: list[str] = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.name == "sinks":
                keys += [f"alerts.sinks.{s.name}" for s in dataclasses.fields(SinkConfig)]
            else:
                keys.append(f"{section}.{f.name}")
    return keys


# --------------------------------------------------------------------------------------------------
# Loading.


@dataclass
class _Collector:
    problems: list[str] = field(default_factory=list)
    path: str | None = None
    """The config file; its keys' lines are in ``lines`` (unknown keys are reported as FILE:LINE)."""
    lines: TomlLines = field(default_factory=TomlLines)

    def add(self, origin: str, key: str, expected: str, value: Any) -> None:
        self.problems.append(f"{origin}: {key}: expected {expected}, got {show(value)}")

    def unknown(self, origin: str, key: str, known: Sequence[str]) -> None:
        leaf = key.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"
        self.problems.append(f"{self._where(origin, key)}: {key}: unknown key{hint}")

    def _where(self, origin: str, key: str) -> str:
        """``FILE:LINE`` for a key of the config file (the key's line, or its table's), else ``origin``."""
        if self.path is None or origin != self.path:
            return origin
        line = self.lines.line(key)
        return f"{origin}:{line}" if line is not None else origin


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _build(
    cls: type, raw: Mapping[str, Any], origins: Mapping[str, str], prefix: str, errors: _Collector
) -> Any:
    """Check ``raw`` (one section's values) against ``cls``; ``origins`` maps each key to its source."""
    fields = _fields(cls)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{prefix}.{key}"
        origin = origins.get(key, "?")
        f = fields.get(key)
        if f is None or f.name == "origin":
            errors.unknown(origin, dotted, [n for n in fields if n != "origin"])
            continue
        check: Checker = f.metadata["check"]
        if check is dwell_table:
            values[key] = _check_dwell(value, origin, dotted, errors)
            continue
        if key == "sinks" and cls is AlertsConfig:
            values[key] = _check_sinks(value, origin, errors)
            continue
        try:
            values[key] = check(value)
        except _Invalid as e:
            errors.add(origin, dotted, e.expected, value)
    try:
        return cls(**values)
    except TypeError:  # pragma: no cover - every key was checked above
        return cls()


def _check_dwell(value: Any, origin: str, dotted: str, errors: _Collector) -> Mapping[str, float]:
    if not isinstance(value, dict):
        errors.add(origin, dotted, "a table of state = seconds", value)
        return MappingProxyType({})
    out: dict[str, float] = {}
    states = [s.value for s in GpuState if s is not GpuState.UNKNOWN]
    for state, seconds in value.items():
        if state not in states:
            errors.unknown(origin, f"{dotted}.{state}", states)
            continue
        try:
            out[state] = _DWELL_CHECK(seconds)
        except _Invalid as e:
            errors.add(origin, f"{dotted}.{state}", e.expected, seconds)
    return MappingProxyType(out)


def _check_sinks(value: Any, origin: str, errors: _Collector) -> tuple[SinkConfig, ...]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        errors.add(origin, "alerts.sinks", "an array of tables ([[alerts.sinks]])", value)
        return ()
    sinks: list[SinkConfig] = []
    names: set[str] = set()
    for i, table in enumerate(value):
        prefix = f"alerts.sinks[{i}]"
        if "kind" not in table:
            errors.add(origin, f"{prefix}.kind", "one of " + ", ".join(SINK_KINDS), MISSING)
            continue
        before = len(errors.problems)
        sink = _build(SinkConfig, table, dict.fromkeys(table, origin), prefix, errors)
        if len(errors.problems) > before:
            continue
        if not sink.name:
            sink = dataclasses.replace(sink, name=f"{sink.kind}-{i}")
        if sink.name in names:
            errors.add(origin, f"{prefix}.name", "a name no other sink has", sink.name)
        names.add(sink.name)
        kind = SINK_KINDS[sink.kind]
        if kind.needs_routing_key and sink.routing_key_file is None:
            errors.add(
                origin,
                f"{prefix}.routing_key_file",
                f"a path (a {sink.kind} sink needs a routing key)",
                MISSING,
            )
        if kind.default_url is not None:
            if sink.url is None and sink.url_file is None:
                sink = dataclasses.replace(sink, url=kind.default_url)
        elif (sink.url is None) == (sink.url_file is None):
            errors.add(
                origin,
                f"{prefix}.url",
                f"exactly one of url and url_file for a {sink.kind} sink",
                sink.url or MISSING,
            )
        if sink.url is not None and not sink.url.startswith(("http://", "https://")):
            errors.add(origin, f"{prefix}.url", "an http:// or https:// URL", sink.url)
        sinks.append(sink)
    return tuple(sinks)


def _cross_checks(config: Config, origins: Mapping[str, str], errors: _Collector) -> None:
    """Constraints between keys; reported against the later key."""
    d, a = config.detector, config.actions

    def origin(key: str) -> str:
        return origins.get(key, "defaults")

    if d.stall_min_s < d.fast_min_s:
        errors.add(
            origin("detector.stall_min_s"),
            "detector.stall_min_s",
            f"at least detector.fast_min_s ({_fmt(d.fast_min_s)}): a stall without proof is called no "
            "sooner than a proven hang",
            d.stall_min_s,
        )
    if a.alert_after_s < a.capture_after_s:
        errors.add(
            origin("actions.alert_after_s"),
            "actions.alert_after_s",
            f"at least actions.capture_after_s ({_fmt(a.capture_after_s)}): evidence is captured first",
            a.alert_after_s,
        )
    if a.kill_via == "slurm" and a.kill_hook:
        errors.add(
            origin("actions.kill_via"),
            "actions.kill_via",
            'not "slurm" together with actions.kill_hook: choose one way to stop a job',
            a.kill_via,
        )
    if config.alerts.retry_max_s < config.alerts.retry_initial_s:
        errors.add(
            origin("alerts.retry_max_s"),
            "alerts.retry_max_s",
            f"at least alerts.retry_initial_s ({_fmt(config.alerts.retry_initial_s)})",
            config.alerts.retry_max_s,
        )


def parse_env_value(raw: str) -> Any:
    """An environment value as TOML would read it (``0.5``, ``true``, ``[...]``), else the string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return raw


def _string_valued(section: str, key: str) -> bool:
    """Whether ``section.key`` holds text (so an environment value ``123`` stays the string "123")."""
    f = _fields(SECTIONS[section]).get(key) if section in SECTIONS else None
    return f is not None and getattr(f.metadata["check"], "takes_text", False)


def _env_overrides(env: Mapping[str, str], errors: _Collector) -> list[tuple[list[str], Any, str]]:
    """``GPU_WATCHDOG_A__B[__C]=value`` -> (["a", "b", "c"], value, variable name)."""
    out = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name[len(ENV_PREFIX) :]:
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split(ENV_SEPARATOR)]
        if any(not p for p in parts):
            errors.problems.append(f"{name}: malformed override name (empty part between '__')")
            continue
        raw = env[name]
        value = parse_env_value(raw)
        if len(parts) == 2 and not isinstance(value, str) and _string_valued(*parts):
            value = raw  # node = 123 means the name "123"
        out.append((parts, value, name))
    return out


def load_config(path: Path | None, env: Mapping[str, str]) -> Config:
    """Defaults, then the TOML file at ``path`` (None: none), then ``GPU_WATCHDOG_*__*`` from ``env``.

    Raises :class:`ConfigError` listing every problem. The CLI maps it to exit code 2.
    """
    errors = _Collector()
    raw: dict[str, Any] = {}
    origins: dict[str, str] = {}
    origin = "defaults"
    if path is not None:
        origin = str(path)
        try:
            text = read_regular_file(path, MAX_CONFIG_BYTES, "config file").decode("utf-8")
            raw = tomllib.loads(text)
        except FileNotFoundError:
            raise ConfigError([f"{path}: no such file"]) from None
        except InputTooLarge as e:
            raise ConfigError([str(e)]) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError([f"{path}: cannot read: {e}"]) from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError([f"{path}: invalid TOML: {e}"]) from None
        except RecursionError:
            raise ConfigError([f"{path}: invalid TOML: nested too deeply"]) from None
        errors.path, errors.lines = origin, TomlLines(text)  # tomllib gives no line numbers
        for section, table in raw.items():
            if isinstance(table, dict):
                for key in table:
                    origins[f"{section}.{key}"] = origin
            else:
                origins[section] = origin

    for parts, value, name in _env_overrides(env, errors):
        table: Any = raw
        for part in parts[:-1]:
            nxt = table.setdefault(part, {}) if isinstance(table, dict) else None
            if not isinstance(nxt, dict):
                errors.problems.append(
                    f"{name}: {'.'.join(parts)}: cannot set a key inside a non-table value"
                )
                table = None
                break
            table = nxt
        if table is None:
            continue
        if parts[:2] == ["alerts", "sinks"]:
            errors.problems.append(f"{name}: alerts.sinks: cannot be set from the environment")
            continue
        table[parts[-1]] = value
        origins[".".join(parts[:2])] = name

    return _assemble(raw, origins, errors, origin)


def _assemble(raw: Mapping[str, Any], origins: Mapping[str, str], errors: _Collector, origin: str) -> Config:
    sections: dict[str, Any] = {}
    for section, table in raw.items():
        where = origins.get(section, origin)
        if section not in SECTIONS:
            errors.unknown(where, section, list(SECTIONS))
            continue
        if not isinstance(table, dict):
            errors.add(where, section, f"a table ([{section}])", table)
            continue
        key_origins = {k: origins.get(f"{section}.{k}", origin) for k in table}
        sections[section] = _build(SECTIONS[section], table, key_origins, section, errors)
    config = Config(**sections, origin=origin)
    _cross_checks(config, origins, errors)
    if errors.problems:
        raise ConfigError(errors.problems)
    return config


def override(config: Config, values: Mapping[str, Any], origin: str) -> Config:
    """Apply command-line values (``{"daemon.listen": "0.0.0.0:9410"}``) through the same checks."""
    errors = _Collector()
    raw: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    for section in SECTIONS:
        current = getattr(config, section)
        raw[section] = {
            f.name: _to_raw(getattr(current, f.name))
            for f in dataclasses.fields(current)
            if f.name != "sinks"
        }
        for f in dataclasses.fields(current):
            origins[f"{section}.{f.name}"] = config.origin
    for dotted, value in values.items():
        section, _, key = dotted.partition(".")
        if section not in raw:
            errors.unknown(origin, dotted, list(SECTIONS))
            continue
        raw[section][key] = _to_raw(value)
        origins[dotted] = origin
    result = _assemble(raw, origins, errors, config.origin)
    return dataclasses.replace(result, alerts=dataclasses.replace(result.alerts, sinks=config.alerts.sinks))


def _to_raw(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def resolve_config_path(arg: Path | None) -> Path | None:
    """``--config FILE`` if given (it must exist: load_config reports it), else the default file if
    present, else None (defaults and environment only)."""
    if arg is not None:
        return arg
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


# --------------------------------------------------------------------------------------------------
# Secrets.


def load_secret(path: Path, what: str = "token", *, forbidden_gids: Iterable[int] = ()) -> str:
    """Read a secret (bearer token, routing key, Slack URL) from ``path``.

    Refused - :class:`ConfigError` - when the file is missing, empty, not a regular file, larger
    than 64 KiB, more than one line, world-readable (``mode & 0o004``) or writable by anyone but its
    owner (``mode & 0o022``: another user could swap the secret). Group-readable (0640) only when the
    group lets no one else read it (:func:`secret_group_problem`): its members are at most root, the
    file's owner and the daemon's own user, and it is none of ``forbidden_gids`` (the progress
    directory's group: the training users). 0600 is the default. The secret never appears in an error.
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError([f"{path}: cannot read the {what} file: {e.strerror}"]) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError([f"{path}: the {what} file is not a regular file"])
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o004:
        raise ConfigError(
            [
                f"{path}: the {what} file is world-readable (mode {mode:04o}); "
                f"refusing to use it: run `chmod o-r {path}` (0600 or 0640 are fine)"
            ]
        )
    if mode & 0o022:
        who = "world" if mode & 0o002 else "group"
        raise ConfigError(
            [
                f"{path}: the {what} file is {who}-writable (mode {mode:04o}); "
                f"refusing to use it: run `chmod go-w {path}` (0600 or 0640 are fine)"
            ]
        )
    if mode & 0o040:
        problem = secret_group_problem(st.st_gid, st.st_uid, forbidden_gids)
        if problem is not None:
            raise ConfigError(
                [
                    f"{path}: the {what} file is group-readable (mode {mode:04o}) and {problem}; "
                    f"refusing to use it: run `chmod g-r {path}` or give it a group of operators only"
                ]
            )
    try:
        value = read_regular_file(path, MAX_SECRET_BYTES, f"{what} file").decode("utf-8").strip()
    except InputTooLarge as e:
        raise ConfigError([str(e)]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: cannot read the {what} file: {e}"]) from None
    if not value:
        raise ConfigError([f"{path}: the {what} file is empty"])
    if "\n" in value or "\r" in value:
        raise ConfigError([f"{path}: the {what} file has more than one line (it must hold the {what} alone)"])
    return value


def secret_group_problem(gid: int, owner_uid: int, forbidden_gids: Iterable[int] = ()) -> str | None:
    """Why a group may not read a secret (None: it may). The group must not be a training group (one
    of ``forbidden_gids``) and must hold no user other than root, the file's owner and the daemon's
    own user - as members (``/etc/group``) or as their primary group (``/etc/passwd``)."""
    import grp
    import pwd

    if gid in set(forbidden_gids):
        return f"its group (gid {gid}) is the progress directory's group: every training user could read it"
    allowed = {0, owner_uid, os.geteuid()}
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return f"its group (gid {gid}) is unknown here, so who can read it cannot be told"
    others: list[str] = []
    for name in group.gr_mem:
        try:
            if pwd.getpwnam(name).pw_uid not in allowed:
                others.append(name)
        except KeyError:
            others.append(name)
    others += [p.pw_name for p in pwd.getpwall() if p.pw_gid == gid and p.pw_uid not in allowed]
    if others:
        names = ", ".join(sorted(set(others))[:5])
        return f"its group {group.gr_name} has other members ({names})"
    return None


def progress_gid(config: Config) -> list[int]:
    """The progress directory's group, when it exists (its members are the training users)."""
    try:
        return [os.stat(config.progress.dir).st_gid]
    except OSError:
        return []


def token_file_absent(config: Config) -> bool:
    """``auth.token_file_optional`` is set and the token file does not exist (a Kubernetes Secret
    marked optional and not created): the daemon runs with mutating calls answering 403."""
    path = config.auth.token_file
    return path is not None and config.auth.token_file_optional and not os.path.lexists(path)


def missing_token_note(config: Config) -> str:
    """What the daemon and ``check-config`` say when :func:`token_file_absent` holds."""
    return (
        f"auth.token_file: {config.auth.token_file} does not exist (auth.token_file_optional = true): "
        "mutating calls (POST /arm, /disarm, /silences) answer 403 until it exists and the daemon is "
        "reloaded (SIGHUP) or restarted"
    )


def load_token(config: Config) -> str | None:
    """The bearer token for mutating endpoints, or None when ``auth.token_file`` is not set, or is
    missing while ``auth.token_file_optional`` is true (mutating calls then answer 403). Any other
    problem with the file - missing when not optional, world-readable, empty - is a ConfigError."""
    if config.auth.token_file is None or token_file_absent(config):
        return None
    forbidden = [g for g in progress_gid(config) if g != 0]
    return load_secret(config.auth.token_file, "token", forbidden_gids=forbidden)
