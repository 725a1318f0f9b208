"""The job file: one TOML that ``pretokenize``, ``gate``, ``bench-data`` and ``train`` all read.

Every key is documented in ``docs/trainer.md``. Loading validates types and ranges and rejects unknown
keys (a typo would otherwise silently fall back to a default); a :class:`ConfigError` names the file,
the key, what was expected and what was found. Relative paths are resolved against the job file's
directory. Sections reserved for ``ft-trainer train`` (``[train]``, ``[optim]``, ``[deepspeed]``,
``[progress]``, ``[metrics]``) are kept as raw tables in :attr:`JobConfig.extra` for that command to
validate. No torch here.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ft_trainer.planning.presets import PRESETS, ModelSpec, from_hf_config

__all__ = [
    "RESERVED_SECTIONS",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "JobConfig",
    "ModelConfig",
    "ZeroConfig",
    "load_config",
    "parse_config",
]

RESERVED_SECTIONS = ("train", "optim", "deepspeed", "progress", "metrics")
LAUNCHERS = ("deepspeed", "torchrun", "local")
DATA_MODES = ("cache", "stream")
TEXT_UNITS = ("line", "file")
OFFLOAD = ("none", "cpu", "nvme")


class ConfigError(ValueError):
    """A job file problem: ``file: key: expected ..., got ...``."""

    def __init__(self, file: str | Path, key: str, expected: str, actual: Any = None, *, raw: str = ""):
        self.file = str(file)
        self.key = key
        self.expected = expected
        self.actual = actual
        msg = raw or f"{self.file}: {key}: expected {expected}, got {actual!r}"
        super().__init__(msg)


@dataclass(frozen=True)
class ModelConfig:
    spec: ModelSpec
    preset: str | None
    path: Path | None
    tokenizer: Path | None
    gradient_checkpointing: bool = True


@dataclass(frozen=True)
class DataConfig:
    mode: str
    cache_dir: Path
    source_dir: Path | None
    seq_len: int
    micro_batch: int
    grad_accum: int
    global_batch: int | None = None
    equalize: bool = True
    text_field: str = "text"
    text_unit: str = "line"
    eos_token: str = "<|endoftext|>"
    workers: int = 0
    shard_mb: int = 128


@dataclass(frozen=True)
class ClusterConfig:
    nodes: int
    gpus_per_node: int
    world_size: int
    world_size_explicit: bool
    launcher: str
    hostfile: Path | None = None
    gpu_memory_gib: float | None = None
    cpu_memory_gib: float | None = None


@dataclass(frozen=True)
class CheckpointConfig:
    dir: Path
    keep_last: int = 2
    bytes_per_param: float = 16.0
    margin: float = 0.10


@dataclass(frozen=True)
class ZeroConfig:
    stage: int = 3
    offload_optimizer: str = "none"
    offload_param: str = "none"
    zero_init: bool = True
    buffer_factor: float = 1.5


@dataclass(frozen=True)
class JobConfig:
    path: Path
    name: str
    seed: int
    epochs: int
    expected_tokens_per_s: float | None
    model: ModelConfig
    data: DataConfig
    cluster: ClusterConfig
    checkpoint: CheckpointConfig
    zero: ZeroConfig
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro_batch x grad_accum x world_size."""
        return self.data.micro_batch * self.data.grad_accum * self.cluster.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.data.seq_len


# ----------------------------------------------------------------------------------------------- parsing
class _Section:
    """Typed access to one TOML table that records which keys were read, so leftovers are errors."""

    def __init__(self, file: Path, name: str, table: Any, base_dir: Path):
        if not isinstance(table, dict):
            raise ConfigError(file, name, "a table ([" + name + "])", table)
        self.file, self.name, self.table, self.base_dir = file, name, table, base_dir
        self.known: set[str] = set()

    def _key(self, key: str) -> str:
        return f"{self.name}.{key}"

    def get(
        self,
        key: str,
        kind: str,
        default: Any = ...,
        *,
        check: Callable[[Any], bool] | None = None,
        expected: str = "",
    ) -> Any:
        self.known.add(key)
        if key not in self.table:
            if default is ...:
                raise ConfigError(self.file, self._key(key), f"{expected or kind} (required)", "missing")
            return default
        value = self.table[key]
        ok_type = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, int | float) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
            "path": isinstance(value, str) and value != "",
        }[kind]
        if not ok_type or (check is not None and not check(value)):
            raise ConfigError(self.file, self._key(key), expected or kind, value)
        if kind == "float":
            return float(value)
        if kind == "path":
            p = Path(value).expanduser()
            return p if p.is_absolute() else (self.base_dir / p)
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = ...) -> Any:
        return self.get(
            key, "str", default, check=lambda v: v in choices, expected="one of " + ", ".join(choices)
        )

    def finish(self) -> None:
        for key in self.table:
            if key not in self.known:
                close = difflib.get_close_matches(key, sorted(self.known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    self.file,
                    self._key(key),
                    "a known key: " + ", ".join(sorted(self.known)),
                    key,
                    raw=f"{self.file}: {self._key(key)}: unknown key{hint}; known keys in [{self.name}]: "
                    + ", ".join(sorted(self.known)),
                )


def _pos(v: Any) -> bool:
    return v >= 1


def load_config(path: str | Path) -> JobConfig:
    """Read and validate a job file. Raises :class:`ConfigError` (file, key, expected, actual)."""
    p = Path(path)
    try:
        raw_bytes = p.read_bytes()
    except OSError as exc:
        raise ConfigError(
            p, "<file>", "a readable job file", raw=f"{p}: cannot read job file: {exc}"
        ) from None
    try:
        doc = tomllib.loads(raw_bytes.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(p, "<syntax>", "valid TOML", raw=f"{p}: TOML syntax error: {exc}") from None
    return parse_config(doc, p)


def parse_config(doc: dict[str, Any], path: Path) -> JobConfig:
    """Validate an already-parsed TOML document (``path`` names it in errors and anchors relative paths)."""
    base = path.resolve().parent
    known_sections = {"job", "model", "data", "cluster", "checkpoint", "zero", *RESERVED_SECTIONS}
    for name in doc:
        if name not in known_sections:
            close = difflib.get_close_matches(name, sorted(known_sections), n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise ConfigError(
                path,
                name,
                "a known section",
                name,
                raw=f"{path}: [{name}]: unknown section{hint}; known: " + ", ".join(sorted(known_sections)),
            )

    def section(name: str, required: bool = True) -> _Section:
        if name not in doc and required:
            raise ConfigError(path, f"[{name}]", "a section", "missing")
        return _Section(path, name, doc.get(name, {}), base)

    # [job]
    job = section("job", required=False)
    name = job.get("name", "str", path.stem, check=lambda v: v.strip() != "", expected="a non-empty string")
    seed = job.get("seed", "int", 0, check=lambda v: v >= 0, expected="an integer >= 0")
    epochs = job.get("epochs", "int", 1, check=_pos, expected="an integer >= 1")
    expected_tps = job.get(
        "expected_tokens_per_s", "float", None, check=lambda v: v > 0, expected="a number > 0 (tokens/s)"
    )
    job.finish()

    # [model]
    m = section("model")
    preset = m.choice("preset", tuple(sorted(PRESETS)), None)
    model_path = m.get("path", "path", None)
    if (preset is None) == (model_path is None):
        raise ConfigError(path, "model.preset", "exactly one of model.preset or model.path", m.table)
    if preset is not None:
        spec = PRESETS[preset]
    else:
        assert model_path is not None
        try:
            spec = from_hf_config(model_path)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                path,
                "model.path",
                "a local model directory with config.json",
                str(model_path),
                raw=f"{path}: model.path: cannot read the model's config.json: {exc}",
            ) from None
    spec = spec.with_overrides(
        vocab_size=m.get("vocab_size", "int", None, check=_pos, expected="an integer >= 1"),
        max_positions=m.get("max_positions", "int", None, check=_pos, expected="an integer >= 1"),
        params=m.get("params", "int", None, check=_pos, expected="an integer >= 1"),
    )
    tokenizer = m.get("tokenizer", "path", model_path)
    grad_ckpt = m.get("gradient_checkpointing", "bool", True)
    m.finish()
    model = ModelConfig(
        spec=spec, preset=preset, path=model_path, tokenizer=tokenizer, gradient_checkpointing=grad_ckpt
    )

    # [data]
    d = section("data")
    mode = d.choice("mode", DATA_MODES, "cache")
    cache_dir = d.get("cache_dir", "path")
    source_dir = d.get("source_dir", "path", None)
    seq_len = d.get("seq_len", "int", check=lambda v: v >= 2, expected="an integer >= 2")
    micro = d.get("micro_batch", "int", 1, check=_pos, expected="an integer >= 1")
    accum = d.get("grad_accum", "int", 1, check=_pos, expected="an integer >= 1")
    global_batch = d.get("global_batch", "int", None, check=_pos, expected="an integer >= 1")
    equalize = d.get("equalize", "bool", True)
    text_field = d.get("text_field", "str", "text", check=lambda v: v != "", expected="a column/field name")
    text_unit = d.choice("text_unit", TEXT_UNITS, "line")
    eos_token = d.get("eos_token", "str", "<|endoftext|>")
    workers = d.get("workers", "int", 0, check=lambda v: v >= 0, expected="an integer >= 0 (0 = auto)")
    shard_mb = d.get("shard_mb", "int", 128, check=_pos, expected="an integer >= 1 (MiB)")
    d.finish()
    if mode == "stream" and source_dir is None:
        raise ConfigError(
            path, "data.source_dir", "the corpus directory (required when data.mode = 'stream')", "missing"
        )
    data = DataConfig(
        mode=mode,
        cache_dir=cache_dir,
        source_dir=source_dir,
        seq_len=seq_len,
        micro_batch=micro,
        grad_accum=accum,
        global_batch=global_batch,
        equalize=equalize,
        text_field=text_field,
        text_unit=text_unit,
        eos_token=eos_token,
        workers=workers,
        shard_mb=shard_mb,
    )

    # [cluster]
    c = section("cluster", required=False)
    nodes = c.get("nodes", "int", 1, check=_pos, expected="an integer >= 1")
    gpn = c.get("gpus_per_node", "int", 1, check=_pos, expected="an integer >= 1")
    world_raw = c.get("world_size", "int", None, check=_pos, expected="an integer >= 1")
    launcher = c.choice("launcher", LAUNCHERS, "deepspeed")
    hostfile = c.get("hostfile", "path", None)
    gpu_mem = c.get("gpu_memory_gib", "float", None, check=lambda v: v > 0, expected="a number > 0 (GiB)")
    cpu_mem = c.get("cpu_memory_gib", "float", None, check=lambda v: v > 0, expected="a number > 0 (GiB)")
    c.finish()
    cluster = ClusterConfig(
        nodes=nodes,
        gpus_per_node=gpn,
        world_size=world_raw if world_raw is not None else nodes * gpn,
        world_size_explicit=world_raw is not None,
        launcher=launcher,
        hostfile=hostfile,
        gpu_memory_gib=gpu_mem,
        cpu_memory_gib=cpu_mem,
    )

    # [checkpoint]
    k = section("checkpoint")
    checkpoint = CheckpointConfig(
        dir=k.get("dir", "path"),
        keep_last=k.get("keep_last", "int", 2, check=_pos, expected="an integer >= 1"),
        bytes_per_param=k.get(
            "bytes_per_param", "float", 16.0, check=lambda v: v > 0, expected="a number > 0"
        ),
        margin=k.get("margin", "float", 0.10, check=lambda v: 0 <= v <= 10, expected="a fraction 0..10"),
    )
    k.finish()

    # [zero]
    z = section("zero", required=False)
    zero = ZeroConfig(
        stage=z.get("stage", "int", 3, check=lambda v: v == 3, expected="3 (this trainer runs ZeRO stage 3)"),
        offload_optimizer=z.choice("offload_optimizer", OFFLOAD, "none"),
        offload_param=z.choice("offload_param", OFFLOAD, "none"),
        zero_init=z.get("zero_init", "bool", True),
        buffer_factor=z.get("buffer_factor", "float", 1.5, check=lambda v: v >= 1, expected="a number >= 1"),
    )
    z.finish()

    extra: dict[str, dict[str, Any]] = {}
    for name_ in RESERVED_SECTIONS:
        if name_ in doc:
            if not isinstance(doc[name_], dict):
                raise ConfigError(path, name_, "a table", doc[name_])
            extra[name_] = dict(doc[name_])

    return JobConfig(
        path=path,
        name=name,
        seed=seed,
        epochs=epochs,
        expected_tokens_per_s=expected_tps,
        model=model,
        data=data,
        cluster=cluster,
        checkpoint=checkpoint,
        zero=zero,
        extra=extra,
    )
