"""The daemon's configuration: every component's section composed into :class:`Config`, read from the
TOML file + ``GPU_WATCHDOG_<SECTION>__<KEY>`` environment overrides + command-line overrides.

Each section is a frozen dataclass defined once, beside the code that uses it (its fields carry their
checks and docs, :func:`gpu_triage.model.config_schema.setting`):

========== ==============================================================
[daemon]   :class:`DaemonConfig` (here)
[progress] :class:`gpu_triage.signals.progress.ProgressConfig`
[classifier] :class:`gpu_triage.classify.config.ClassifierConfig`
[detector] :class:`gpu_triage.verdicts.settings.DetectorConfig`
[stacks]   :class:`gpu_triage.signals.stacks.config.StacksConfig`
[ras]      :class:`gpu_triage.signals.nccl_ras.poller.RasConfig`
[health]   :class:`gpu_triage.signals.health.monitor.HealthConfig`
[cluster]  :class:`gpu_triage.signals.fleet.config.ClusterConfig`
[events]   :class:`gpu_triage.journal.config.EventsConfig`
[evidence] :class:`gpu_triage.actions.config.EvidenceConfig`
[auth]     :class:`gpu_triage.serving.config.AuthConfig`
[actions]  :class:`gpu_triage.actions.config.ActionsConfig`
[alerts]   :class:`gpu_triage.alerts.config.AlertsConfig` (``[[alerts.sinks]]``: ``SinkConfig``)
========== ==============================================================

Where values come from, lowest precedence first:

1. the defaults (each documented, with its unit, in ``deploy/config.example.toml``);
2. the TOML file (``/etc/gpu-watchdog/config.toml`` or ``--config FILE``);
3. environment variables ``GPU_WATCHDOG_<SECTION>__<KEY>`` (double underscore between levels, e.g.
   ``GPU_WATCHDOG_DAEMON__PERIOD_S=0.5`` or ``GPU_WATCHDOG_CLASSIFIER__DWELL_S__COMPUTE=3``). A value is
   parsed as a TOML value (``0.5``, ``true``, ``["scancel", "123"]``) and otherwise taken as a string.
   Variables without a double underscore (``GPU_WATCHDOG_PROGRESS_DIR``, the trainer's) are not
   overrides. ``[[alerts.sinks]]`` cannot be set from the environment;
4. command-line flags (:func:`override`), e.g. ``--listen``, ``--state-dir``, ``--source``.

One :class:`~gpu_triage.model.config_schema.Reader` (the same helper the trainer's job file uses)
collects every problem, not just the first: a value from the file names the file and its line, one
from the environment names the variable; then the dotted key, what was expected and what was found::

    config.toml:3: daemon.period_s: expected a number between 0.1 and 60, got "fast"

Unknown keys are errors, with a did-you-mean. Rules across keys and sections (``stall_min_s`` at least
``fast_min_s``, a sink's URL, ...) are checked here, after the sections are read.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_triage.actions.config import ActionsConfig, EvidenceConfig
from gpu_triage.alerts.config import AlertsConfig, SinkConfig
from gpu_triage.alerts.registry import SINK_KINDS
from gpu_triage.classify.config import ClassifierConfig
from gpu_triage.config.secrets import MAX_SECRET_BYTES, ConfigError, load_secret, secret_group_problem
from gpu_triage.journal.config import EventsConfig
from gpu_triage.model.config_checks import (
    SOURCE_NAMES,
    choice,
    host_names,
    listen_address,
    nonempty_text,
    number,
    path_value,
    source_spec,
    takes_text,
)
from gpu_triage.model.config_schema import MISSING, SCHEMA, Reader, Rule, setting, toml_syntax_problem
from gpu_triage.model.limits import MAX_CONFIG_BYTES, InputTooLarge, read_regular_file
from gpu_triage.serving.config import AuthConfig
from gpu_triage.signals.fleet.config import ClusterConfig
from gpu_triage.signals.health.monitor import HealthConfig
from gpu_triage.signals.nccl_ras.poller import RasConfig
from gpu_triage.signals.progress import ProgressConfig
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.verdicts.settings import DetectorConfig

DEFAULT_CONFIG_PATH = Path("/etc/gpu-watchdog/config.toml")
ENV_PREFIX = "GPU_WATCHDOG_"
ENV_SEPARATOR = "__"


def _default_node() -> str:
    return socket.gethostname()


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """``[daemon]``: the node, the telemetry source, the API address, the state directory, the cycle."""

    node: str = setting(
        default_factory=_default_node, parse=nonempty_text, doc="node name in metrics, alerts and /status"
    )
    source: str = setting("auto", parse=source_spec, doc="telemetry source")
    listen: str = setting("127.0.0.1:9410", parse=listen_address, doc="REST + /metrics address")
    allowed_hosts: tuple[str, ...] = setting(
        (), parse=host_names, doc="names a request's Host header may use besides addresses and localhost"
    )
    state_dir: Path = setting(Path("/var/lib/gpu-watchdog"), parse=path_value, doc="event store and evidence")
    period_s: float = setting(1.0, parse=number(0.1, 60), doc="GPU telemetry period")
    process_period_s: float = setting(1.0, parse=number(0.1, 60), doc="process and progress period")
    publish_period_s: float = setting(
        0.5, parse=number(0.0, 60), doc="how often the samples taken since are classified and published"
    )
    nvml_deadline_s: float = setting(0.5, parse=number(0.01, 10), doc="hard deadline of one NVML read")
    log_level: str = setting("info", parse=choice("debug", "info", "warning", "error"), doc="log level")
    log_format: str = setting(
        "text", parse=choice("text", "json"), doc="log lines: human text or one JSON object each"
    )


@dataclass(frozen=True, slots=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    progress: ProgressConfig = field(default_factory=ProgressConfig)
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    stacks: StacksConfig = field(default_factory=StacksConfig)
    ras: RasConfig = field(default_factory=RasConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
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
    "health": HealthConfig,
    "cluster": ClusterConfig,
    "events": EventsConfig,
    "evidence": EvidenceConfig,
    "auth": AuthConfig,
    "actions": ActionsConfig,
    "alerts": AlertsConfig,
}


def _rule(f: dataclasses.Field[Any]) -> Rule:
    rule = f.metadata.get(SCHEMA)
    return rule if isinstance(rule, Rule) else Rule()


def _settable(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """A section's keys: its fields the file may set (not the derived ones)."""
    return {f.name: f for f in dataclasses.fields(cls) if not _rule(f).derived}


def schema_keys() -> list[str]:
    """Every dotted key the configuration knows (``alerts.sinks.url`` for the sink tables)."""
    keys: list[str] = []
    for section, cls in SECTIONS.items():
        for name in _settable(cls):
            if section == "alerts" and name == "sinks":
                keys += [f"alerts.sinks.{s}" for s in _settable(SinkConfig)]
            else:
                keys.append(f"{section}.{name}")
    return keys


# --------------------------------------------------------------------------------------------------
# Loading.


def parse_env_value(raw: str) -> Any:
    """An environment value as TOML would read it (``0.5``, ``true``, ``[...]``), else the string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return raw


def _string_valued(section: str, key: str) -> bool:
    """Whether ``section.key`` holds text (so an environment value ``123`` stays the string "123")."""
    f = _settable(SECTIONS[section]).get(key) if section in SECTIONS else None
    parse = _rule(f).parse if f is not None else None
    return parse is not None and takes_text(parse)


def _env_overrides(env: Mapping[str, str], reader: Reader) -> list[tuple[list[str], Any, str]]:
    """``GPU_WATCHDOG_A__B[__C]=value`` -> (["a", "b", "c"], value, variable name)."""
    out = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name[len(ENV_PREFIX) :]:
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split(ENV_SEPARATOR)]
        if any(not p for p in parts):
            reader.problem("", "malformed override name (empty part between '__')", origin=name)
            continue
        raw = env[name]
        value = parse_env_value(raw)
        if len(parts) == 2 and not isinstance(value, str) and _string_valued(*parts):
            value = raw  # node = 123 means the name "123"
        out.append((parts, value, name))
    return out


def _read_file(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        text = read_regular_file(path, MAX_CONFIG_BYTES, "config file").decode("utf-8")
        return text, tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"]) from None
    except InputTooLarge as e:
        raise ConfigError([str(e)]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: cannot read: {e}"]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([str(toml_syntax_problem(str(path), e))]) from None
    except RecursionError:
        raise ConfigError([f"{path}: invalid TOML: nested too deeply"]) from None


def load_config(path: Path | None, env: Mapping[str, str]) -> Config:
    """Defaults, then the TOML file at ``path`` (None: none), then ``GPU_WATCHDOG_*__*`` from ``env``.

    Raises :class:`ConfigError` listing every problem. The CLI maps it to exit code 2.
    """
    raw: dict[str, Any] = {}
    origin, text = "defaults", ""
    if path is not None:
        origin = str(path)
        text, raw = _read_file(path)
    reader = Reader(origin, text)  # tomllib gives no line numbers: the reader scans the text for them
    elsewhere: dict[str, str] = {}  # "section.key" -> the environment variable that set it
    in_file = set(raw)

    for parts, value, name in _env_overrides(env, reader):
        table: Any = raw
        for part in parts[:-1]:
            nxt = table.setdefault(part, {}) if isinstance(table, dict) else None
            if not isinstance(nxt, dict):
                reader.problem(".".join(parts), "cannot set a key inside a non-table value", origin=name)
                table = None
                break
            table = nxt
        if table is None:
            continue
        if parts[:2] == ["alerts", "sinks"]:
            reader.problem("alerts.sinks", "cannot be set from the environment", origin=name)
            continue
        table[parts[-1]] = value
        if parts[0] not in in_file:  # a section only the environment names
            elsewhere.setdefault(parts[0], name)
        elsewhere[".".join(parts[:2])] = name

    return _assemble(raw, elsewhere, reader, origin, file_keys=_keys_of(raw, elsewhere, origin))


def _keys_of(raw: Mapping[str, Any], elsewhere: Mapping[str, str], origin: str) -> dict[str, str]:
    """Where each section and key of ``raw`` came from (the file unless ``elsewhere`` says otherwise)."""
    out: dict[str, str] = {}
    for section, table in raw.items():
        out[section] = elsewhere.get(section, origin)
        if isinstance(table, dict):
            for key in table:
                dotted = f"{section}.{key}"
                out[dotted] = elsewhere.get(dotted, origin)
    return out


def _assemble(
    raw: Mapping[str, Any],
    elsewhere: Mapping[str, str],
    reader: Reader,
    origin: str,
    *,
    file_keys: Mapping[str, str],
) -> Config:
    """Read every section of ``raw`` with ``reader``, then the rules across keys; raise if any problem."""
    sections: dict[str, Any] = {}
    failed: set[str] = set()
    for section, table in raw.items():
        where = file_keys.get(section, origin)
        if section not in SECTIONS:
            reader.unknown(section, SECTIONS, origin=where)
            continue
        sinks: tuple[SinkConfig, ...] | None = None
        if isinstance(table, dict):
            key_origins = {k: elsewhere[f"{section}.{k}"] for k in table if f"{section}.{k}" in elsewhere}
            if section == "alerts" and "sinks" in table:
                sinks = _read_sinks(table["sinks"], reader)
                table = {k: v for k, v in table.items() if k != "sinks"}
        else:
            key_origins = {}
        before = len(reader.problems)
        value = reader.read(SECTIONS[section], table, section, origins=key_origins)
        if value is None or len(reader.problems) > before:
            failed.add(section)
        if value is not None:
            sections[section] = value if sinks is None else dataclasses.replace(value, sinks=sinks)
    config = Config(**sections, origin=origin)
    _cross_checks(config, failed, reader, lambda key: file_keys.get(key, "defaults"))
    reader.raise_if_any(ConfigError)
    return config


def detector_config(config: Config) -> DetectorConfig:
    """The detector's config: ``[detector]`` (``config.detector``) with the settings it takes from
    other sections (``[stacks]``, ``[daemon] node``, ``[cluster] stale_after_s`` and
    ``node_lost_after_s``) filled in."""
    return dataclasses.replace(
        config.detector,
        stacks=config.stacks,
        fleet_node=config.daemon.node,
        fleet_stale_after_s=config.cluster.stale_after_s,
        fleet_node_lost_after_s=config.cluster.node_lost_after_s,
    )


def _read_sinks(value: Any, reader: Reader) -> tuple[SinkConfig, ...]:
    """``[[alerts.sinks]]``: each table read on its own (its problems at ``alerts.sinks[i].key``, at its
    line), then the rules between a sink's keys; fills the defaults that depend on its kind (name, URL)."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        reader.expected("alerts.sinks", "an array of tables ([[alerts.sinks]])", value)
        return ()
    out: list[SinkConfig] = []
    names: set[str] = set()
    for i, table in enumerate(value):
        at = f"alerts.sinks[{i}]"
        if "kind" not in table:
            reader.expected(f"{at}.kind", "one of " + ", ".join(SINK_KINDS), MISSING)
            continue
        sink = reader.read(SinkConfig, table, at)
        if sink is None:
            continue
        if not sink.name:
            sink = dataclasses.replace(sink, name=f"{sink.kind}-{i}")
        if sink.name in names:
            reader.expected(f"{at}.name", "a name no other sink has", sink.name)
        names.add(sink.name)
        traits = SINK_KINDS[sink.kind].traits
        if traits.needs_routing_key and sink.routing_key_file is None:
            reader.expected(
                f"{at}.routing_key_file", f"a path (a {sink.kind} sink needs a routing key)", MISSING
            )
        if traits.default_url is not None:
            if sink.url is None and sink.url_file is None:
                sink = dataclasses.replace(sink, url=traits.default_url)
        elif (sink.url is None) == (sink.url_file is None):
            reader.expected(
                f"{at}.url", f"exactly one of url and url_file for a {sink.kind} sink", sink.url or MISSING
            )
        if sink.url is not None and not sink.url.startswith(("http://", "https://")):
            reader.expected(f"{at}.url", "an http:// or https:// URL", sink.url)
        out.append(sink)
    return tuple(out)


def _fmt(x: float) -> str:
    return f"{x:g}"


def _cross_checks(config: Config, failed: set[str], reader: Reader, origin_of: Any) -> None:
    """Constraints between keys; reported against the later key (skipped for a section that failed)."""
    d, a = config.detector, config.actions

    def add(key: str, expected: str, actual: Any) -> None:
        reader.expected(key, expected, actual, origin=origin_of(key))

    if "detector" not in failed and d.stall_min_s < d.fast_min_s:
        add(
            "detector.stall_min_s",
            f"at least detector.fast_min_s ({_fmt(d.fast_min_s)}): a stall without proof is called no "
            "sooner than a proven hang",
            d.stall_min_s,
        )
    if "actions" not in failed:
        if a.alert_after_s < a.capture_after_s:
            add(
                "actions.alert_after_s",
                f"at least actions.capture_after_s ({_fmt(a.capture_after_s)}): evidence is captured first",
                a.alert_after_s,
            )
        if a.kill_via == "slurm" and a.kill_hook:
            add(
                "actions.kill_via",
                'not "slurm" together with actions.kill_hook: choose one way to stop a job',
                a.kill_via,
            )
    if "alerts" not in failed and config.alerts.retry_max_s < config.alerts.retry_initial_s:
        add(
            "alerts.retry_max_s",
            f"at least alerts.retry_initial_s ({_fmt(config.alerts.retry_initial_s)})",
            config.alerts.retry_max_s,
        )


def override(config: Config, values: Mapping[str, Any], origin: str) -> Config:
    """Apply command-line values (``{"daemon.listen": "0.0.0.0:9410"}``) through the same checks."""
    reader = Reader(config.origin)
    raw: dict[str, dict[str, Any]] = {}
    for section, cls in SECTIONS.items():
        current = getattr(config, section)
        raw[section] = {name: _to_raw(getattr(current, name)) for name in _settable(cls) if name != "sinks"}
    elsewhere: dict[str, str] = {}
    for dotted, value in values.items():
        section, _, key = dotted.partition(".")
        if section not in raw:
            reader.unknown(dotted, SECTIONS, origin=origin)
            continue
        raw[section][key] = _to_raw(value)
        elsewhere[dotted] = origin
    file_keys = _keys_of(raw, elsewhere, config.origin)
    result = _assemble(raw, elsewhere, reader, config.origin, file_keys=file_keys)
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
    if hasattr(value, "value") and not isinstance(value, (bool, int, float, str)):  # an enum (mode)
        return value.value
    return value


def resolve_config_path(arg: Path | None) -> Path | None:
    """``--config FILE`` if given (it must exist: load_config reports it), else the default file if
    present, else None (defaults and environment only)."""
    if arg is not None:
        return arg
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


# --------------------------------------------------------------------------------------------------
# The bearer token.


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


__all__ = [
    "DEFAULT_CONFIG_PATH",
    "ENV_PREFIX",
    "MAX_SECRET_BYTES",
    "SECTIONS",
    "SOURCE_NAMES",
    "ActionsConfig",
    "AlertsConfig",
    "AuthConfig",
    "ClassifierConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "DaemonConfig",
    "DetectorConfig",
    "EventsConfig",
    "EvidenceConfig",
    "HealthConfig",
    "ProgressConfig",
    "RasConfig",
    "SinkConfig",
    "StacksConfig",
    "detector_config",
    "load_config",
    "load_secret",
    "load_token",
    "missing_token_note",
    "override",
    "parse_env_value",
    "progress_gid",
    "resolve_config_path",
    "schema_keys",
    "secret_group_problem",
    "token_file_absent",
]
